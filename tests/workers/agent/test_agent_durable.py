"""`DurableAgentSession` in process: turns, journal order, poison, close, resume, subset, title, compaction."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_memory.errors import (
    AgentPoisonedError,
    LeaseHeldError,
    SnapshotMismatchError,
    TurnInProgressError,
    UnknownEffectsError,
    WorkspaceReplacedError,
)
from emelex_workers.agent import durable
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.protocol import PROTOCOL_V2
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from tests.support import agent as agent_support
from tests.support.agent import ScriptedBinding, answer, calls
from tests.support import eventually, table_rows

NAMES = ("effect", "peek", "boom")


@pytest.fixture
def effects(tmp_path, monkeypatch):
    """The effects log of the `effect` tool (through its EMELEX_AGENT_TEST options)."""
    path = tmp_path / "effects.log"
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(path)}))
    return path


@pytest.fixture
def tools(settings):
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    return {name: tool for name, tool in registered_tools(pm).items() if name in NAMES}


def snap(binding, tools, **changes):
    return build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                          system_prompt="Test agent.", **changes)


def run(coro):
    return asyncio.run(coro)


def without_leases(rows: dict) -> dict:
    return {table: r for table, r in rows.items() if table != "session_leases"}


def lines(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def kinds(store, session_id):
    return [e.kind for e in store.replay(session_id).events]


async def approve_all(call, tool):
    return "approve"


def test_a_turn_with_tools_then_an_answer(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([calls(("effect", {"label": "a"}), ("peek", {"label": "b"})), answer("done")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        result = await agent.turn("go", approve=approve_all)
        assert not agent.poisoned
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert (result.outcome, result.answer, result.rounds, result.calls) == ("answer", "done", 2, 2)
    assert kinds(store, agent.session_id) == ["user", "tool_calls", "tool_result", "tool_result", "assistant", "audit"]
    results = [e.payload for e in store.replay(agent.session_id).events if e.kind == "tool_result"]
    assert [(r["outcome"], r["output"]) for r in results] == [("ok", "did a"), ("ok", "peeked b")]
    assert [line.split()[1] for line in lines(effects)] == ["a"]
    assert journal.read_journal(store, agent.session_id) is None
    assert [j.kind for j in store.list_jobs().jobs] == ["distill"]  # clean close queued distillation
    assert store.get_session(agent.session_id).id == agent.session_id
    with store.acquire_lease(agent.session_id, workspace):  # and released the lease
        pass


def test_approval_deny_and_abort(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([calls(("effect", {"label": "a"})), calls(("effect", {"label": "b"}),
                                                                         ("effect", {"label": "c"}))])
    decisions = iter(["deny", "abort"])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        result = await agent.turn("go", approve=lambda call, tool: next(decisions))
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert result.outcome == "aborted"
    events = store.replay(agent.session_id).events
    outcomes = [e.payload["outcome"] for e in events if e.kind == "tool_result"]
    assert outcomes == ["denied", "not_executed", "not_executed"]
    assert events[-1].kind == "turn_failed" and events[-1].payload["reason"] == "aborted"
    assert lines(effects) == []


def test_a_disabled_tool_is_rejected_by_the_gate(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([calls(("peek", {"label": "a"})), answer("ok")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        agent.disable_tool("peek")
        assert agent.enabled_tools == {"effect", "boom"}
        await agent.turn("go")
        await agent.close()
        return agent

    agent = run(main())
    result = next(e.payload for e in store.replay(agent.session_id).events if e.kind == "tool_result")
    assert result["outcome"] == "error" and "peek" in result["output"]
    assert "peek" not in json.dumps(binding.rounds[0]["schema"])  # absent from the grammar too


def test_interrupt_during_generation_closes_the_turn_with_a_failure_record(store, workspace, tools, tmp_path,
                                                                           monkeypatch, effects):
    hold = tmp_path / "hold"
    generating = tmp_path / "generating"
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(effects), "hold_generation": str(hold),
                                                      "generating": str(generating)}))
    binding = ScriptedBinding([answer("never")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        task = agent.turn("go")
        await eventually(generating.exists, "the model round starting")
        agent.interrupt()
        result = await task
        assert not agent.poisoned  # closed durably: the adapter stays usable
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert result.outcome == "interrupted"
    assert kinds(store, agent.session_id) == ["user", "turn_failed"]


def test_a_model_error_is_a_bounded_diagnostic(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding(["not json at all"])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        result = await agent.turn("go")
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert result.outcome == "error" and "RoundOutputError" in result.diagnostic
    last = store.replay(agent.session_id).events[-1]
    assert last.kind == "turn_failed" and len(last.payload["diagnostic"].encode()) <= journal.MAX_DIAGNOSTIC_BYTES


def test_the_chain_limit_forces_an_answer(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([*(calls(("peek", {"label": str(i)})) for i in range(2)), answer("from the results"),
                               calls(("peek", {"label": "x"})), calls(("peek", {"label": "y"})),
                               calls(("peek", {"label": "z"}))])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools,
                                                 snap(binding, tools, chain_limit=2, protocol=PROTOCOL_V2))
        first = await agent.turn("go")
        second = await agent.turn("again")  # a binding that ignores the answer-only grammar: the turn fails
        await agent.close()
        return agent, first, second

    agent, result, second = run(main())
    assert (result.outcome, result.answer, result.forced, result.rounds) == ("answer", "from the results",
                                                                             "chain_limit", 3)
    assert binding.rounds[2]["schema"] == {"type": "object", "properties": {"answer": {"type": "string",
                                           "maxLength": 500}}, "required": ["answer"], "additionalProperties": False}
    assert "used its 2 tool rounds" in binding.rounds[2]["messages"][-1]["content"]
    assert "'go'" in binding.rounds[2]["messages"][-1]["content"]  # the request, quoted
    assert binding.rounds[2]["messages"][-1]["role"] == "system"
    events = store.replay(agent.session_id).events
    audit = next(e.payload for e in events if e.kind == "audit")
    assert audit["forced"] == "chain_limit" and audit["rounds"] == 3
    assert [e.kind for e in events].count("tool_calls") == 4
    assert second.outcome == "error" and "constrained to an answer" in second.diagnostic


def test_poison_is_armed_before_the_task_runs(store: MemoryStore, workspace, tools, effects, db_path):
    binding = ScriptedBinding([answer("hi")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        task = agent.turn("go")
        assert agent.poisoned
        with pytest.raises(TurnInProgressError):
            agent.turn("again")
        task.cancel()  # before its first step: nothing of it runs
        with pytest.raises(asyncio.CancelledError):
            await task
        assert agent.poisoned
        with pytest.raises(AgentPoisonedError):
            agent.turn("again")
        await agent.close()
        return agent

    agent = run(main())
    assert store.list_jobs().jobs == []  # a poisoned close queues nothing
    with store.acquire_lease(agent.session_id, workspace):  # but releases
        pass


def test_resume_rebuilds_messages_and_requires_the_identical_snapshot(store, workspace, tools, effects, db_path):
    binding = ScriptedBinding([answer("first")])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent.turn("hello")
        await agent.close()
        return agent.session_id

    sid = run(first())
    before = without_leases(table_rows(db_path))
    other = ScriptedBinding([], template="another template")
    with pytest.raises(SnapshotMismatchError, match="template_digest"):
        run(DurableAgentSession.resume(store, sid, workspace, other, tools, snap(other, tools)))
    with pytest.raises(SnapshotMismatchError, match=r"seed"):
        run(DurableAgentSession.resume(store, sid, workspace, binding, tools, snap(binding, tools, seed=1)))
    assert without_leases(table_rows(db_path)) == before  # nothing changed but a lease taken and released
    second = ScriptedBinding([answer("second")])

    async def again():
        agent = await DurableAgentSession.resume(store, sid, workspace, second, tools, snap(second, tools))
        agent.disable_tool("peek")
        await agent.turn("again")
        await agent.close()

    run(again())
    text = json.dumps(second.rounds[0]["messages"])
    assert "hello" in text and "first" in text
    assert kinds(store, sid) == ["user", "assistant", "audit"] * 2


def test_resume_preflights_the_workspace(store, workspace, tools, effects, tmp_path):
    binding = ScriptedBinding([])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent.close()
        return agent.session_id

    sid = run(first())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(WorkspaceReplacedError):
        run(DurableAgentSession.resume(store, sid, elsewhere, binding, tools, snap(binding, tools)))


def test_resume_refuses_unknown_effects_and_releases(store, workspace, tools, effects):
    binding = ScriptedBinding([])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent._offload(agent._db, journal.open_turn, store, agent._lease, "go")
        await agent._offload(agent._db, journal.plan_batch, store, agent._lease, 1, "{}", [("c1", "effect", {"label": "x"})])
        await agent._offload(agent._db, journal.start_call, store, agent._lease, "c1")
        agent._poisoned = True  # as a crashed turn leaves it
        await agent.close()
        return agent.session_id

    sid = run(first())
    with pytest.raises(UnknownEffectsError, match="call c1"):
        run(DurableAgentSession.resume(store, sid, workspace, binding, tools, snap(binding, tools)))
    with store.acquire_lease(sid, workspace):  # the refused resume released its lease
        pass


def test_title_updates_use_the_adapters_lease(store, workspace, tools, effects):
    binding = ScriptedBinding([])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        with pytest.raises(LeaseHeldError):
            store.acquire_lease(agent.session_id, workspace)
        await agent.set_title("named")
        queued = await agent.queue_compaction()
        await agent.close()
        return agent, queued

    agent, queued = run(main())
    assert store.get_session(agent.session_id).title == "named"
    assert queued.job is None and "nothing queued" in queued.reason


def test_lease_renewal_runs_during_a_tool(cstore, clock, workspace, tools, tmp_path, monkeypatch, effects):
    started, hold = tmp_path / "started", tmp_path / "hold"
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(effects), "tool_started": str(started),
                                                      "hold_tool": str(hold)}))
    binding = ScriptedBinding([calls(("effect", {"label": "a"})), answer("done")])

    async def main():
        agent = await DurableAgentSession.create(cstore, workspace, binding, tools, snap(binding, tools), ttl_s=0.3)
        first = agent._lease.expires_at
        task = agent.turn("go", approve=approve_all)
        await eventually(started.exists, "the tool starting")
        clock.now += 0.1
        await eventually(lambda: agent._lease.expires_at != first, "a lease renewal while the tool held")
        hold.write_text("go")
        result = await task
        await agent.close()
        return result

    assert run(main()).outcome == "answer"


def test_no_blocking_step_runs_on_the_loop_thread(store, workspace, tools, effects, monkeypatch):
    loop_threads = set()
    seen = []
    real = journal.start_call

    def spy(*args):
        seen.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(journal, "start_call", spy)
    binding = ScriptedBinding([calls(("effect", {"label": "a"})), answer("done")])

    async def main():
        loop_threads.add(threading.get_ident())
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent.turn("go", approve=approve_all)
        await agent.close()

    run(main())
    assert seen and not loop_threads & set(seen)


def test_a_fresh_resume_enables_every_tool_and_history_keeps_a_disabled_tools_declaration(store, workspace, tools,
                                                                                          effects):
    binding = ScriptedBinding([calls(("peek", {"label": "a"})), answer("peeked"), answer("fine")])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent.turn("look")  # a complete tool round that called peek
        agent.disable_tool("peek")
        await agent.turn("and now?")
        await agent.close()
        return agent.session_id

    sid = run(first())
    later = binding.rounds[2]  # the round after peek was disabled
    assert "peek" not in json.dumps(later["schema"])  # the grammar cannot propose it ...
    system = later["messages"][0]["content"]
    assert "- peek: Look at a label" in system  # ... but its declaration, needed to read the prior round, remains
    assert any(m["role"] == "assistant" and '"name":"peek"' in m["content"] for m in later["messages"])
    again = ScriptedBinding([answer("back")])

    async def resumed():
        agent = await DurableAgentSession.resume(store, sid, workspace, again, tools, snap(again, tools))
        enabled = agent.enabled_tools
        await agent.turn("check the label")
        await agent.close()
        return enabled

    assert run(resumed()) == frozenset(NAMES)  # the subset was process-local: a fresh resume enables all
    assert "peek" in json.dumps(again.rounds[0]["schema"])


def test_every_persistence_step_runs_on_a_blocking_worker(store, workspace, tools, effects, monkeypatch):
    from emelex_memory.sessions.leases import SessionLease
    from emelex_workers.agent.tools import RegisteredTool, ToolOutput, ToolSpec

    seen: dict[str, set[int]] = {}

    def spy(owner, name):
        real = getattr(owner, name)

        def recorded(*args, **kwargs):
            seen.setdefault(name, set()).add(threading.get_ident())
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, recorded)

    for name in ("record_snapshot", "require_snapshot", "reconcile", "open_turn", "plan_batch", "start_call",
                 "complete_call", "publish_batch", "close_answer", "close_failed", "set_title"):
        spy(journal, name)
    spy(durable, "create_agent_session")  # a new Session, its lease and its snapshot, in one transaction
    spy(MemoryStore, "put_asset")
    spy(MemoryStore, "finish_session")
    spy(SessionLease, "renew")
    big = ToolSpec("big", "Print a lot.", tools["peek"].spec.input_schema,
                   lambda inv: ToolOutput("x" * 5000), approval="never", max_output_bytes=1000)
    all_tools = {**tools, "big": RegisteredTool(big, "test-tools", "1.0")}
    binding = ScriptedBinding([calls(("big", {"label": "a"})), answer("stored")])  # then no output: a failed turn
    loop_thread = set()

    async def main():
        loop_thread.add(threading.get_ident())
        agent = await DurableAgentSession.create(store, workspace, binding, all_tools, snap(binding, all_tools),
                                                 ttl_s=0.3)
        assert (await agent.turn("go")).outcome == "answer"
        assert (await agent.turn("fail")).outcome == "error"
        await agent.set_title("named")
        await eventually(lambda: "renew" in seen, "a lease renewal (the renewer ticks every TTL/3)")
        await agent.close()
        again = ScriptedBinding([])
        resumed = await DurableAgentSession.resume(store, agent.session_id, workspace, again, all_tools,
                                                   snap(again, all_tools))
        await resumed.close()

    run(main())
    assert set(seen) == {"create_agent_session", "require_snapshot", "reconcile", "open_turn", "plan_batch",
                         "start_call", "complete_call", "publish_batch", "close_answer", "close_failed", "set_title",
                         "put_asset", "finish_session", "renew"}
    assert not loop_thread & set().union(*seen.values())



def test_resume_verifies_replay_and_changes_nothing_on_a_tampered_event(store, workspace, tools, effects, db_path):
    import apsw

    from emelex_memory import CorruptEventError

    binding = ScriptedBinding([answer("first")])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent.turn("hello")
        await agent.close()
        return agent.session_id

    sid = run(first())
    conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READWRITE)
    conn.execute("""UPDATE events SET payload = '{"text": "fir' WHERE seq = 2""")
    conn.close()
    before = without_leases(table_rows(db_path))
    with pytest.raises(CorruptEventError):
        run(DurableAgentSession.resume(store, sid, workspace, binding, tools, snap(binding, tools)))
    assert without_leases(table_rows(db_path)) == before
    with store.acquire_lease(sid, workspace):  # the refused resume released its lease
        pass


def test_a_checkpointed_batch_survives_a_later_failing_round_and_a_failing_consumer(store, workspace, tools, effects):
    binding = ScriptedBinding([calls(("peek", {"label": "a"})), "not json"])

    def consumer(piece):
        raise RuntimeError("the screen went away")

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        result = await agent.turn("go", on_token=consumer)
        messages = list(agent.agent.messages)
        await agent.close()
        return agent, result, messages

    agent, result, messages = run(main())
    assert result.outcome == "error" and result.calls == 1
    assert kinds(store, agent.session_id) == ["user", "tool_calls", "tool_result", "turn_failed"]
    assert any("Result of peek" in m["content"] for m in messages)  # the model history keeps the batch too


def test_a_reenabled_tool_still_needs_approval_and_tools_must_match_the_snapshot(store, workspace, tools, effects):
    from emelex_workers.agent.tools import RegisteredTool

    binding = ScriptedBinding([calls(("effect", {"label": "a"})), answer("ok")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        agent.disable_tool("effect")
        agent.enable_tool("effect")
        await agent.turn("go")  # no approve callback: an approval-"always" call is denied
        await agent.close()
        return agent.session_id

    sid = run(main())
    [result] = [e.payload for e in store.replay(sid).events if e.kind == "tool_result"]
    assert result["outcome"] == "denied" and lines(effects) == []
    newer = {**tools, "peek": RegisteredTool(tools["peek"].spec, tools["peek"].plugin, "9.9")}
    with pytest.raises(SnapshotMismatchError, match=r"tools\[peek\]\.plugin_version"):
        run(DurableAgentSession.resume(store, sid, workspace, binding, newer, snap(binding, tools)))


def test_lease_renewal_runs_during_inference(cstore, clock, workspace, tools, tmp_path, monkeypatch, effects):
    generating, hold = tmp_path / "generating", tmp_path / "hold"
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(effects), "generating": str(generating),
                                                      "hold_generation": str(hold)}))
    binding = ScriptedBinding([answer("done")])

    async def main():
        agent = await DurableAgentSession.create(cstore, workspace, binding, tools, snap(binding, tools), ttl_s=0.3)
        first = agent._lease.expires_at
        task = agent.turn("go")
        await eventually(generating.exists, "the model round starting")
        clock.now += 0.1
        await eventually(lambda: agent._lease.expires_at != first, "a lease renewal while the model generated")
        hold.write_text("go")
        result = await task
        await agent.close()
        return result

    assert run(main()).outcome == "answer"


def test_clean_close_queues_distillation_idempotently(store, workspace, tools, effects):
    binding = ScriptedBinding([answer("hi")])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        await agent.turn("hello")
        await agent.close()
        await agent.close()
        return agent.session_id

    sid = run(first())

    async def again():
        agent = await DurableAgentSession.resume(store, sid, workspace, binding, tools, snap(binding, tools))
        await agent.close()

    run(again())  # nothing new since: the same source is queued once
    assert [j.kind for j in store.list_jobs().jobs] == ["distill"]
