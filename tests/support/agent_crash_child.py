"""A process that runs one durable agent turn and stops dead at a named point, for the SIGKILL matrix.

Run as `python -m tests.support.agent_crash_child CONFIG_JSON`. CONFIG: home (the store is its standard database), workspace, point (where
to stop: a journal step "open_turn", "plan_batch", "start_call", "complete_call", "publish_batch", "close_answer"
after its Nth commit, or "finish_session" before it runs; "generation" and "tool" stop through the test plugin's
hold files), nth (default 1), marker (a file written when stopped), session (resume it instead of creating one),
ttl_s. The model's outputs and the tool's files come from EMELEX_AGENT_TEST. Prints nothing; sleeps at the point.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_workers.agent import durable
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from emelex_workers.settings import WorkerSettings
from tests.support import agent as agent_support

NAMES = ("effect", "peek", "boom")


def stop_here(marker: str) -> None:
    """Say where we are and wait to be killed."""
    Path(marker).write_text("stopped")
    while True:
        time.sleep(60)


def stop_after(name: str, nth: int, marker: str) -> None:
    """Make `journal.<name>` stop the process right after its `nth` call returned (committed)."""
    real = getattr(journal, name)
    count = [0]

    def wrapped(*args, **kwargs):
        result = real(*args, **kwargs)
        count[0] += 1
        if count[0] == nth:
            stop_here(marker)
        return result

    setattr(journal, name, wrapped)


def tools_of(settings: WorkerSettings) -> dict:
    """The test plugin's tools, registered in this process."""
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    return {name: tool for name, tool in registered_tools(pm).items() if name in NAMES}


def snapshot_of(binding, tools):
    """The snapshot both the crashed and the resuming process build."""
    return build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                          system_prompt="Test agent.")


async def main(config: dict) -> None:
    settings = WorkerSettings(home=Path(config["home"]))
    point, marker = config["point"], config["marker"]
    if point == "finish_session":
        real = MemoryStore.finish_session
        MemoryStore.finish_session = lambda self, lease: stop_here(marker) or real(self, lease)
    elif point not in ("generation", "tool"):
        stop_after(point, config.get("nth", 1), marker)
    store = MemoryStore.open(settings)
    tools = tools_of(settings)
    binding = agent_support.ScriptedBinding()
    agent = await DurableAgentSession.create(store, config["workspace"], binding, tools, snapshot_of(binding, tools),
                                             ttl_s=config.get("ttl_s", 60.0))
    Path(config["session_file"]).write_text(agent.session_id)
    await agent.turn("go", approve=lambda call, tool: "approve")
    await agent.close()


if __name__ == "__main__":
    assert durable  # the adapter reads journal steps through the module, so the wrappers above take effect
    asyncio.run(main(json.loads(sys.argv[1])))
