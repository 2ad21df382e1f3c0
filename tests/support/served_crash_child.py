"""A process that runs one durable agent turn on a served model and stops dead once the model streams its first
piece, for the SIGKILL matrix's kill-during-inference case with the served binding.

Run as `python -m tests.support.served_crash_child CONFIG_JSON`. CONFIG: home, workspace, model (the served model's name),
marker (written, with the Session ID, at the first streamed piece; the process then sleeps holding the stream).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.models import ModelManager
from emelex_workers.host.manager import bind_model, get_plugin_manager
from emelex_workers.settings import WorkerSettings
from tests.support import agent as agent_support

PROMPT = "Peek at the label 'blue'."


def agent_parts(settings: WorkerSettings, name: str):
    """(model, binding, tools, snapshot) of the served agent both the crashed and the resuming process build."""
    with ModelManager(settings) as manager:
        model = manager.get(name)
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    tools = {k: v for k, v in registered_tools(pm).items() if k == "peek"}
    _, binding = bind_model(pm, model, settings)
    snapshot = build_snapshot(binding, tools, model_reference=model.reference, model_snapshot_id=model.snapshot_id,
                              system_prompt="You are a test agent. To look at a label, call the peek tool.",
                              round_tokens=64, chain_limit=1, calls_per_batch=1)
    return model, binding, tools, snapshot


async def main(config: dict) -> None:
    settings = WorkerSettings(home=Path(config["home"]), plugins_autoload=False)
    model, binding, tools, snapshot = agent_parts(settings, config["model"])
    store = MemoryStore.open(settings)
    agent = await DurableAgentSession.create(store, config["workspace"], binding, tools, snapshot, model=model)
    stream_chat = binding.stream_chat

    def held(*args, **kwargs):
        def hold(piece: str) -> None:  # on the model thread, inside the open HTTP stream
            Path(config["marker"]).write_text(agent.session_id)
            while True:
                time.sleep(60)

        return stream_chat(*args, **{**kwargs, "on_text": hold})

    binding.stream_chat = held
    await agent.turn(PROMPT, approve=lambda call, tool: "approve")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
