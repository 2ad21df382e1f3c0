"""What one chat turn costs the store: its write transactions and its reads, counted at the store's one door
(`Database.write` and `Database.read`) during a turn with one tool call, over the scripted binding and a real store."""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import pytest

from emelex_workers.agent import workspace_map
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from tests.support import agent as agent_support
from emelex_workers.agent.workspace_map import workspace_map_source
from tests.support.agent import ScriptedBinding, answer, calls


class _Counting:
    """A `Database.write()` or `read()` block that counts itself into `counts[kind]` unless it is nested in another
    block (a nested write is a savepoint of the transaction around it, not a transaction)."""

    depth = 0  # blocks open now, of either kind

    def __init__(self, block, counts: Counter, kind: str) -> None:
        self._block, self._counts, self._kind = block, counts, kind

    def __enter__(self):
        if _Counting.depth == 0:
            self._counts[self._kind] += 1
        _Counting.depth += 1
        return self._block.__enter__()

    def __exit__(self, *exc):
        _Counting.depth -= 1
        return self._block.__exit__(*exc)


def counted(store, counts: Counter) -> None:
    """Count every write transaction and every read of `store` (outside a transaction) into `counts`."""
    db = store.db
    write, read = db.write, db.read
    db.write = lambda: _Counting(write(), counts, "write")
    db.read = lambda: _Counting(read(), counts, "read")


def test_a_turn_with_one_tool_call_writes_six_transactions_and_reads_nothing(store, workspace, settings) -> None:
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    tools = {name: tool for name, tool in registered_tools(pm).items() if name == "peek"}
    binding = ScriptedBinding([answer("hello"), calls(("peek", {"label": "a"})), answer("peeked a")])
    snapshot = build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                              system_prompt="Test agent.")
    counts: Counter = Counter()

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot)
        await agent.turn("hi")
        counted(store, counts)
        result = await agent.turn("peek at a")
        measured = dict(counts)
        await agent.close()
        return result, measured

    result, measured = asyncio.run(main())
    assert (result.outcome, result.calls) == ("answer", 1)
    # the input and open turn, the planned batch, the call started, completed, the batch published, the answer
    assert measured == {"write": 6}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names a directory read through /proc/self/fd")
def test_a_turn_reads_each_directory_of_its_workspace_once(store, workspace, settings, monkeypatch,
                                                           tmp_path) -> None:
    """The workspace map, the files the request names and every round's narrowed paths of one (first) turn share one
    walk: each directory is read once, whatever asks; a call that may have changed the workspace has it read again."""
    (workspace / "config.ini").write_text("port = 8421\n")
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("print(1)\n")
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)  # `effect`: a tool that asks first, so it may change the workspace
    tools = {name: tool for name, tool in registered_tools(pm).items() if name in ("read_file", "effect")}
    binding = ScriptedBinding([calls(("read_file", {"path": "src/app.py"})), answer("config.ini: port = 8421"),
                               calls(("effect", {"label": "a"})), calls(("read_file", {"path": "config.ini"})),
                               answer("done")])
    snapshot = build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                              system_prompt="Test agent.", context=(workspace_map.SOURCE,), chain_limit=2)
    monkeypatch.setenv(agent_support.ENV, '{"effects": "%s"}' % (tmp_path / "effects.log"))
    reads: Counter = Counter()
    scandir = os.scandir

    def counting_scandir(target):
        reads[os.readlink(f"/proc/self/fd/{target}") if isinstance(target, int) else os.fspath(target)] += 1
        return scandir(target)

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot,
                                                 context_sources={workspace_map.SOURCE: workspace_map_source})
        monkeypatch.setattr(os, "scandir", counting_scandir)
        first = await agent.turn("What port does config.ini set?")
        once = dict(reads)
        reads.clear()
        second = await agent.turn("go on", approve=lambda call, tool: "approve")
        monkeypatch.setattr(os, "scandir", scandir)
        await agent.close()
        return first, once, second, dict(reads)

    first, once, second, again = asyncio.run(main())
    assert (first.rounds, second.rounds) == (2, 3) and first.context  # the map, a read, an answer
    assert once == {str(workspace): 1, str(workspace / "src"): 1}
    assert again == {str(workspace): 2, str(workspace / "src"): 2}  # read again after the effect
