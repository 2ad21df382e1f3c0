"""What one chat turn costs the store: its write transactions and its reads, counted at the store's one door
(`Database.write` and `Database.read`) during a turn with one tool call, over the scripted binding and a real store."""

from __future__ import annotations

import asyncio
from collections import Counter

from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from tests.support import agent as agent_support
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
