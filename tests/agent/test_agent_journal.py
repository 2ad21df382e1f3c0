"""The active-turn and tool-call journal: ordered steps, idempotence, authority re-checks, reconciliation."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal as j
from emelex_memory.agent.processes import identify
from emelex_memory.errors import (
    InvalidInputError,
    JournalStateError,
    LeaseExpiredError,
    StaleCursorError,
    UnknownEffectsError,
    WorkspaceReplacedError,
)
from ..support.agent_engine import leased_session
from ..support import table_rows


def kinds(store: MemoryStore, session_id: str) -> list[tuple[str, dict]]:
    return [(e.kind, e.payload) for e in store.replay(session_id).events]


def ok(call_id: str, tool: str = "effect", output: str = "done") -> dict:
    return {"call_id": call_id, "tool": tool, "outcome": "ok", "output": output}


def planned(store, lease, calls=(("c1", "effect", {"path": "a"}), ("c2", "effect", {"path": "b"}))):
    j.open_turn(store, lease, "do it")
    j.plan_batch(store, lease, 1, '{"tool_calls": []}', list(calls))


def test_a_turn_with_one_batch_and_an_answer(store: MemoryStore, workspace):
    session, lease = leased_session(store, workspace)
    planned(store, lease)
    assert [c.state for c in j.read_journal(store, session.id).calls] == ["planned", "planned"]
    started = j.start_call(store, lease, "c1")
    j.complete_call(store, lease, "c1", ok("c1"))
    j.complete_call(store, lease, "c2", {**ok("c2"), "outcome": "denied", "output": "the user denied this call"})
    turn = j.read_journal(store, session.id)
    assert [(c.state, c.started_at) for c in turn.calls] == [("completed", started), ("completed", None)]
    assert kinds(store, session.id) == [("user", {"text": "do it"})]  # nothing replay-visible before the publish
    results = j.publish_batch(store, lease)
    assert [r["outcome"] for r in results] == ["ok", "denied"]
    assert j.read_journal(store, session.id).calls == ()
    j.close_answer(store, lease, "all done", {"event": "answer", "rounds": 2, "calls": 2, "model": "test/model"})
    assert j.read_journal(store, session.id) is None
    events = kinds(store, session.id)
    assert [k for k, _ in events] == ["user", "tool_calls", "tool_result", "tool_result", "assistant", "audit"]
    assert events[1][1] == {"round": 1, "calls": [{"call_id": "c1", "tool": "effect", "arguments": {"path": "a"}},
                                                  {"call_id": "c2", "tool": "effect", "arguments": {"path": "b"}}]}
    assert events[5][1] == {"event": "answer", "rounds": 2, "calls": 2, "model": "test/model"}
    turns = [e.turn for e in store.replay(session.id).events]
    assert turns[4] == turns[5] != turns[3]  # the answer and its audit close the turn together


def test_steps_are_restart_idempotent(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    planned(store, lease)
    before = table_rows(db_path)
    j.plan_batch(store, lease, 1, '{"tool_calls": []}', [("c1", "effect", {"path": "a"}), ("c2", "effect", {"path": "b"})])
    assert table_rows(db_path) == before
    first = j.start_call(store, lease, "c1")
    assert j.start_call(store, lease, "c1") == first
    j.complete_call(store, lease, "c1", ok("c1"))
    after = table_rows(db_path)
    j.complete_call(store, lease, "c1", ok("c1"))
    assert table_rows(db_path) == after
    with pytest.raises(JournalStateError):
        j.complete_call(store, lease, "c1", ok("c1", output="other"))
    with pytest.raises(JournalStateError):
        j.start_call(store, lease, "c1")  # completed calls never start again
    with pytest.raises(JournalStateError):
        j.plan_batch(store, lease, 2, "{}", [("c9", "effect", {})])
    assert table_rows(db_path) == after


def test_nothing_publishes_before_every_call_completed(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    planned(store, lease)
    j.start_call(store, lease, "c1")
    before = table_rows(db_path)
    with pytest.raises(JournalStateError, match="c1, c2"):
        j.publish_batch(store, lease)
    with pytest.raises(JournalStateError):
        j.close_answer(store, lease, "x", {"event": "answer"})
    with pytest.raises(JournalStateError):
        j.open_turn(store, lease, "another")
    assert table_rows(db_path) == before


def test_steps_recheck_the_lease(cstore: MemoryStore, clock, workspace, db_path):
    session, lease = leased_session(cstore, workspace)
    planned(cstore, lease)
    clock.now += 10_000
    before = table_rows(db_path)
    with pytest.raises(LeaseExpiredError):
        j.start_call(cstore, lease, "c1")
    assert table_rows(db_path) == before


def test_steps_recheck_the_cursor(store: MemoryStore, workspace, db_path):
    """Each journal step rechecks that the Session is still at this lease's own cursor: an event written behind the
    lease's back (here by another connection) stops every step, writing nothing."""
    import apsw

    session, lease = leased_session(store, workspace)
    planned(store, lease, calls=(("c1", "effect", {"path": "a"}),))
    other = apsw.Connection(str(db_path))
    try:
        with other:
            other.execute(
                "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, media_end, "
                "created_at) SELECT session_id, seq + 1, turn + 1, 0, 'user', '{\"text\": \"behind its back\"}', "
                "25, byte_end + 25, media_end, created_at FROM events WHERE session_id = "
                "(SELECT id FROM sessions WHERE uuid = ?) ORDER BY seq DESC LIMIT 1", (session.id,))
    finally:
        other.close()
    before = table_rows(db_path)
    for step in (lambda: j.start_call(store, lease, "c1"),
                 lambda: j.complete_call(store, lease, "c1", {**ok("c1"), "outcome": "denied", "output": "no"}),
                 lambda: j.record_process(store, lease, "c1", identify(os.getpid())),
                 lambda: j.close_failed(store, lease, "error", "stopped")):
        with pytest.raises(StaleCursorError, match="but this lease last saw"):
            step()
    assert table_rows(db_path) == before


def test_steps_recheck_the_workspace(store: MemoryStore, tmp_path, workspace, db_path):
    session, lease = leased_session(store, workspace)
    planned(store, lease)
    lease._unpin()  # as if the pinned directory were closed: the path is re-read
    shutil.rmtree(workspace)
    workspace.mkdir()
    before = table_rows(db_path)
    with pytest.raises(WorkspaceReplacedError):
        j.start_call(store, lease, "c1")
    assert table_rows(db_path) == before


def test_reconcile_keeps_completed_exact_and_refuses_unknown_effects(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    planned(store, lease, [("c1", "effect", {"path": "a"}), ("c2", "effect", {"path": "b"}),
                           ("c3", "effect", {"path": "c"})])
    j.start_call(store, lease, "c1")
    j.complete_call(store, lease, "c1", ok("c1", output="exact output"))
    j.start_call(store, lease, "c2")
    before = table_rows(db_path)
    with pytest.raises(UnknownEffectsError, match=r'effect \{"path":"b"\} \(call c2, started') as info:
        j.reconcile(store, lease)
    assert "--accept-unknown-effects" in str(info.value)
    assert [c.call_id for c in info.value.calls] == ["c2"]
    assert table_rows(db_path) == before
    done = j.reconcile(store, lease, accept_unknown_effects=True)
    assert [r["outcome"] for r in done.results] == ["ok", "unknown_effect", "not_executed"]
    assert done.results[0] == ok("c1", output="exact output")
    assert done.results[1]["output"] == j.UNKNOWN_EFFECT and done.results[2]["output"] == j.NOT_EXECUTED
    assert j.read_journal(store, session.id) is None
    assert [k for k, _ in kinds(store, session.id)] == ["user", "tool_calls", "tool_result", "tool_result",
                                                        "tool_result", "turn_failed"]
    assert j.reconcile(store, lease) is None  # nothing open: a no-op


def test_a_tool_free_interrupted_turn_closes_with_a_failure_record(store: MemoryStore, workspace):
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "hello")
    done = j.reconcile(store, lease)
    assert done.results == ()
    assert kinds(store, session.id)[-1] == ("turn_failed", {"reason": "interrupted", "diagnostic": done.failure[
        "diagnostic"]})
    assert j.read_journal(store, session.id) is None


def test_diagnostics_are_bounded(store: MemoryStore, workspace):
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "hello")
    j.close_failed(store, lease, "error", "é" * 5000)
    diagnostic = kinds(store, session.id)[-1][1]["diagnostic"]
    assert len(diagnostic.encode()) <= j.MAX_DIAGNOSTIC_BYTES and set(diagnostic) == {"é"}
    with pytest.raises(InvalidInputError):
        j.close_failed(store, lease, "whatever", "x")


def test_workers_skip_a_session_with_an_open_journal(cstore: MemoryStore, clock, workspace):
    session, lease = leased_session(cstore, workspace)
    j.open_turn(cstore, lease, "hello")
    assert cstore.queue_distillation(session.id).created
    lease.release()
    assert cstore.claim_job() is None  # the lease ended but the journal is open
    clock.now += 1
    with cstore.acquire_lease(session.id, workspace) as again:
        list(again.replay_all())
        j.reconcile(cstore, again)
    claim = cstore.claim_job()
    assert claim is not None and claim.job.session_id == session.id


def test_set_title_goes_through_the_lease(cstore: MemoryStore, clock, workspace, db_path):
    session, lease = leased_session(cstore, workspace)
    j.set_title(cstore, lease, "a title")
    assert cstore.get_session(session.id).title == "a title"
    clock.now += 10_000
    before = table_rows(db_path)
    with pytest.raises(LeaseExpiredError):
        j.set_title(cstore, lease, "other")
    assert table_rows(db_path) == before


def test_journal_to_json_lists_calls(store: MemoryStore, workspace):
    session, lease = leased_session(store, workspace)
    planned(store, lease)
    j.start_call(store, lease, "c1")
    shown = j.read_journal(store, session.id).to_json()
    assert [(c["call_id"], c["state"]) for c in shown["calls"]] == [("c1", "started"), ("c2", "planned")]
    assert json.dumps(shown)


def test_a_due_compaction_job_waits_for_an_open_journal(cstore: MemoryStore, clock, workspace, db_path):
    from emelex_memory import COMPACTION_KIND, NewEvent, SessionLiveError, SummaryDraft, compaction_handler, run_one_job

    def summarize(events, job):
        return "summary of " + ",".join(str(e.id) for e in events)

    def plan():
        return cstore.queue_compaction(session.id, context_window=2000, count_tokens=lambda e: 100)

    session, lease = leased_session(cstore, workspace)
    for i in range(10):  # 100 tokens an event: 10 turns over a 2000-token window plan a compaction
        lease.append_turn([NewEvent("user", {"text": f"t{i} question"}), NewEvent("assistant", {"text": f"t{i} a"})])
    lease.release()
    claim = cstore.claim_job(COMPACTION_KIND) if plan().job else None  # claimed before the journal opened ...
    assert claim is not None
    clock.now += 1
    with cstore.acquire_lease(session.id, workspace) as again:
        list(again.replay_all())
        j.open_turn(cstore, again, "hello")
        again.release()
    before = table_rows(db_path)
    with pytest.raises(SessionLiveError):  # ... commits nothing while it is open
        claim.complete(SummaryDraft("summary"))
    assert table_rows(db_path) == before
    claim.release("the Session has an open agent journal")
    queued = plan()
    assert queued.job is not None and queued.job.state == "pending"
    before = table_rows(db_path)
    assert run_one_job(cstore, compaction_handler(summarize), kinds=COMPACTION_KIND) is None  # due, not claimed
    assert table_rows(db_path) == before
    clock.now += 1
    with cstore.acquire_lease(session.id, workspace) as again:
        list(again.replay_all())
        j.reconcile(cstore, again)
        again.release()
    outcome = run_one_job(cstore, compaction_handler(summarize), kinds=COMPACTION_KIND)
    assert outcome is not None and outcome.status == "done" and outcome.job.id == queued.job.id


def test_the_agent_code_reaches_no_store_internals():
    from pathlib import Path
    import re

    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("emelex_memory/agent/*.py"), *root.glob("emelex_workers/agent/*.py"),
             root / "emelex_workers/cli/recover.py"]
    private = re.compile(r"\bstore\._[a-z]")
    offenders = [f.name for f in files if private.search(f.read_text())]
    assert offenders == []
