"""Cancelling the turn task at every await: the adapter stays poisoned, refuses reuse, its close queues nothing, and
a resume reconciles the journal (with explicit recovery when a started call's effect is unknown)."""

from __future__ import annotations

import asyncio
import json

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_memory.agent.recovery import recover_session
from emelex_memory.errors import AgentPoisonedError, UnknownEffectsError
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from tests.support import agent as agent_support
from tests.support.agent import ScriptedBinding, answer, calls

OUTPUTS = [calls(("effect", {"label": "a"}), ("effect", {"label": "b"})), answer("done")]


class Cancelling(DurableAgentSession):
    """Cancels its own turn task when the `at`-th offloaded step is awaited (the step's thread still runs it)."""

    at = -1
    count = 0

    async def _offload(self, executor, fn, *args, **kwargs):
        type(self).count += 1
        if type(self).count == type(self).at:
            asyncio.current_task().cancel()
        return await super()._offload(executor, fn, *args, **kwargs)


@pytest.fixture
def tools(settings, tmp_path, monkeypatch):
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(tmp_path / "effects.log")}))
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    return {name: tool for name, tool in registered_tools(pm).items() if name in ("effect", "peek")}


def snap(binding, tools):
    return build_snapshot(binding, tools, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.")


def awaits_of_a_turn(store, workspace, tools) -> int:
    """How many offloaded steps one full turn awaits (counted on an uncancelled run)."""
    Cancelling.at, Cancelling.count = -1, 0
    binding = ScriptedBinding(OUTPUTS)

    async def main():
        agent = await Cancelling.create(store, workspace, binding, tools, snap(binding, tools))
        start = Cancelling.count
        result = await agent.turn("go", approve=lambda c, t: "approve")
        n = Cancelling.count - start
        await agent.close()
        assert result.outcome == "answer"
        return n

    return asyncio.run(main())


def test_cancel_at_every_await(tmp_path, settings, tools, workspace):
    with MemoryStore.open_path(tmp_path / "count.sqlite3", settings) as store:
        total = awaits_of_a_turn(store, workspace, tools)
    assert total >= 9  # input, 2 rounds, plan, 2 x (start, run, complete), publish, answer
    effects = tmp_path / "effects.log"
    for at in range(1, total + 1):
        effects.unlink(missing_ok=True)
        with MemoryStore.open_path(tmp_path / f"cancel{at}.sqlite3", settings) as store:
            check_cancel_at(store, workspace, tools, at, effects)


def check_cancel_at(store: MemoryStore, workspace, tools, at: int, effects) -> None:
    binding = ScriptedBinding(OUTPUTS)

    async def crashed():
        agent = await Cancelling.create(store, workspace, binding, tools, snap(binding, tools))
        Cancelling.at, Cancelling.count = at, 0
        task = agent.turn("go", approve=lambda c, t: "approve")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert agent.poisoned, at
        with pytest.raises(AgentPoisonedError):
            agent.turn("again")
        await agent.close()
        return agent.session_id

    sid = asyncio.run(crashed())
    Cancelling.at = -1
    assert store.list_jobs().jobs == [], at  # a poisoned close queues nothing
    after = ScriptedBinding([answer("after")])

    async def resumed():
        agent = await DurableAgentSession.resume(store, sid, workspace, after, tools, snap(after, tools))
        result = await agent.turn("again")
        await agent.close()
        return result

    try:
        result = asyncio.run(resumed())
    except UnknownEffectsError:
        assert journal.read_journal(store, sid).unknown, at
        recover_session(store, sid, accept_unknown_effects=True)
        result = asyncio.run(resumed())
    assert result.outcome == "answer", at
    assert journal.read_journal(store, sid) is None
    lines = effects.read_text().splitlines() if effects.exists() else []
    assert len({line.split()[0] for line in lines}) == len(lines) <= 2, at  # no call ran twice
    kinds = [e.kind for e in store.replay(sid).events]
    assert kinds[-3:] == ["user", "assistant", "audit"], (at, kinds)  # the resumed turn after the reconciled one


def test_cancel_during_the_approval_prompt(store: MemoryStore, workspace, tools, tmp_path):
    binding = ScriptedBinding(OUTPUTS)

    async def approve(call, tool):
        asyncio.current_task().cancel()
        await asyncio.sleep(0)
        return "approve"

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        with pytest.raises(asyncio.CancelledError):
            await agent.turn("go", approve=approve)
        assert agent.poisoned
        await agent.close()
        return agent.session_id

    sid = asyncio.run(main())
    assert store.list_jobs().jobs == []
    turn = journal.read_journal(store, sid)
    assert [c.state for c in turn.calls] == ["planned", "planned"]  # nothing started: resume needs no acceptance
    after = ScriptedBinding([answer("after")])

    async def resumed():
        agent = await DurableAgentSession.resume(store, sid, workspace, after, tools, snap(after, tools))
        await agent.close()

    asyncio.run(resumed())
    outcomes = [e.payload["outcome"] for e in store.replay(sid).events if e.kind == "tool_result"]
    assert outcomes == ["not_executed", "not_executed"]
    assert not (tmp_path / "effects.log").exists()
