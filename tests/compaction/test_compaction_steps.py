"""Compaction in steps on real database files: a plan never exceeds what the summarizer can read, each step's
completion queues the next in its own transaction, and the chain ends under the target."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emelex_memory import (
    COMPACTION_KIND,
    Event,
    MemoryStore,
    NewEvent,
    Settings,
    TurnTooLargeError,
    compaction_handler,
    run_one_job,
)
from emelex_memory.compaction.policy import source_token_budget

from ..support import table_rows

WINDOW = 2000  # T = 1000, R = 200: a source may hold 1544 tokens beside a 200-token Summary


def tokens(event: Event) -> int:
    """The test tokenizer: a Summary counts as 50 tokens, any other event its payload's "t"."""
    return 50 if event.kind == "summary" else event.payload["t"]


def summarize(events: list[Event], job) -> str:
    return f"summary of {len(events)} events"


def session_of(store: MemoryStore, workspace: Path, turn_tokens: list[int]) -> str:
    """A Session whose turns are one user event of the given tokens each."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for t in turn_tokens:
            lease.append_turn([NewEvent("user", {"t": t})])
        lease.release()
    return session.id


def handler(window: int = WINDOW):
    return compaction_handler(summarize, context_window=window, count_tokens=tokens)


def view_tokens(store: MemoryStore, sid: str) -> int:
    return sum(map(tokens, store.replay(sid).events))


def test_a_session_of_several_windows_compacts_in_steps_each_within_the_budget(cstore, workspace) -> None:
    sid = session_of(cstore, workspace, [100] * 60)  # 6,000 tokens: three windows
    first = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert first.job.source["goal_through_seq"] == 52 and first.job.source["through_seq"] == 15
    jobs = []
    while (outcome := run_one_job(cstore, handler(), kinds=COMPACTION_KIND)) is not None:
        assert outcome.status == "done", outcome.detail
        jobs.append(outcome.job)
    assert len(jobs) == 4
    for job in jobs:
        source = job.source
        assert sum(map(tokens, cstore.read_compaction_source(job))) == source["source_tokens"]
        assert source["source_tokens"] <= source["max_source_tokens"] == source_token_budget(
            WINDOW, source["summary_budget_tokens"])
    for earlier, later in zip(jobs, jobs[1:]):
        assert later.source["base_summary_id"] == earlier.result["summary_event_id"]
        assert later.source["first_event_id"] == earlier.result["summary_event_id"]
    assert "next_job" not in jobs[-1].result and jobs[-1].source["through_seq"] == 52
    assert view_tokens(cstore, sid) == 50 + 800 <= 1000  # the target, the newest Summary included
    assert [e.seq for e in cstore.replay(sid).events[1:]] == list(range(53, 61))


def test_the_next_step_is_queued_in_the_transaction_that_appends_the_summary(
    cstore, workspace, db_path, clock, monkeypatch
) -> None:
    sid = session_of(cstore, workspace, [100] * 60)
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    before = table_rows(db_path)

    def refuse(*args, **kwargs):
        raise RuntimeError("queueing the next step failed")

    monkeypatch.setattr(cstore, "enqueue_job", refuse)
    outcome = run_one_job(cstore, handler(), kinds=COMPACTION_KIND)
    assert outcome.status == "retrying" and "queueing the next step failed" in outcome.detail
    rows = table_rows(db_path)
    assert rows["events"] == before["events"] and rows["summaries"] == []  # no Summary without its next step
    monkeypatch.undo()
    clock.now += 60  # past the retry deadline
    done = run_one_job(cstore, handler(), kinds=COMPACTION_KIND)
    assert done.status == "done" and cstore.get_job(done.job.result["next_job"]).state == "pending"


def test_a_chain_stops_once_the_view_is_under_the_target(cstore, workspace) -> None:
    sid = session_of(cstore, workspace, [100] * 16 + [200] * 4)  # the goal is 1,600 tokens, 56 over a step
    queued = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    source = queued.job.source
    assert source["goal_through_seq"] == 16 and source["through_seq"] == 15
    outcome = run_one_job(cstore, handler(), kinds=COMPACTION_KIND)
    assert outcome.status == "done" and "next_job" not in outcome.job.result
    assert view_tokens(cstore, sid) == 50 + 100 + 800  # the Summary, the one turn short of the goal, the tail
    assert run_one_job(cstore, handler(), kinds=COMPACTION_KIND) is None


def test_queueing_during_a_chain_returns_the_pending_step(cstore, workspace) -> None:
    sid = session_of(cstore, workspace, [100] * 60)
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    step = run_one_job(cstore, handler(), kinds=COMPACTION_KIND).job
    again = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert not again.created and again.job.id == step.result["next_job"] and "already queued" in again.reason


def test_a_turn_the_model_cannot_read_is_refused_at_planning_naming_the_fix(cstore, workspace, db_path) -> None:
    sid = session_of(cstore, workspace, [1600] + [100] * 20)
    before = table_rows(db_path)
    for force in (False, True):
        with pytest.raises(TurnTooLargeError, match="turn 1 .* holds 1600 tokens, more than the 1544") as refused:
            cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens, force=force)
        assert "emelex models install PATH" in str(refused.value)
        assert "model_max_context_tokens" in str(refused.value)
    assert table_rows(db_path) == before
    assert cstore.queue_compaction(sid, context_window=4 * WINDOW, count_tokens=tokens, force=True).created  # fits


def test_a_turn_past_the_next_step_ends_the_chain_and_planning_says_why(cstore, workspace) -> None:
    sid = session_of(cstore, workspace, [100] * 14 + [1500] + [100] * 20)
    queued = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert queued.job.source["through_seq"] == 14
    outcome = run_one_job(cstore, handler(), kinds=COMPACTION_KIND)
    assert outcome.status == "done" and "next_job" not in outcome.job.result  # this step's Summary still landed
    assert cstore.replay(sid).events[0].kind == "summary"
    with pytest.raises(TurnTooLargeError, match="turn 15 .* holds 1500 tokens after the 50-token Summary"):
        cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)


def test_a_source_planned_before_steps_existed_still_runs(cstore, workspace) -> None:
    sid = session_of(cstore, workspace, [100] * 20)
    source = dict(cstore.plan_compaction(sid, context_window=WINDOW, count_tokens=tokens).source)
    del source["max_source_tokens"], source["goal_through_seq"]
    cstore.enqueue_job(COMPACTION_KIND, sid, source, source_key=source["digest"])
    outcome = run_one_job(cstore, handler(), kinds=COMPACTION_KIND)
    assert outcome.status == "done" and "next_job" not in outcome.job.result


def test_the_same_plan_after_a_failure_names_the_failed_job_and_how_to_rerun_it(cstore, workspace) -> None:
    sid = session_of(cstore, workspace, [100] * 20)
    first = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    outcome = run_one_job(cstore, handler(window=WINDOW // 2), kinds=COMPACTION_KIND)  # a smaller model than planned
    assert outcome.status == "failed"
    assert "over the 544 a summarizer can read in this model's 1000-token window" in outcome.detail
    again = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert not again.created and again.job.id == first.job.id
    assert f"already failed as compaction job {first.job.id}" in again.reason
    assert f"emelex memory jobs retry {first.job.id}" in again.reason and "SourceTooLargeError" in again.reason
    smaller = cstore.queue_compaction(sid, context_window=WINDOW // 2, count_tokens=tokens)  # planned for it
    assert smaller.created
    while (outcome := run_one_job(cstore, handler(window=WINDOW // 2), kinds=COMPACTION_KIND)) is not None:
        assert outcome.status == "done", outcome.detail


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turn_tokens=st.lists(st.integers(0, 700), min_size=1, max_size=80), window=st.integers(900, 4000))
def test_every_step_of_any_chain_fits_and_the_chain_ends(turn_tokens: list[int], window: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "db").mkdir(mode=0o700)
        (root / "ws").mkdir()
        with MemoryStore.open_path(root / "db" / "p.sqlite3", Settings(home=root / "home")) as store:
            sid = session_of(store, root / "ws", turn_tokens)
            try:
                queued = store.queue_compaction(sid, context_window=window, count_tokens=tokens)
            except TurnTooLargeError:
                return
            if queued.job is None:
                return
            goal, final = queued.job.source["goal_through_seq"], None
            for _ in range(len(turn_tokens) + 1):  # each step covers at least one more turn
                outcome = run_one_job(store, handler(window), kinds=COMPACTION_KIND)
                if outcome is None:
                    break
                assert outcome.status == "done", outcome.detail
                source = outcome.job.source
                assert sum(map(tokens, store.read_compaction_source(outcome.job))) == source["source_tokens"]
                assert source["source_tokens"] <= source_token_budget(window, source["summary_budget_tokens"])
                final = outcome.job
            else:
                pytest.fail("the chain did not end")
            if final.source["through_seq"] != goal and view_tokens(store, sid) > final.source["target_tokens"]:
                with pytest.raises(TurnTooLargeError):  # it ended early only at a turn that cannot fit
                    store.plan_compaction(sid, context_window=window, count_tokens=tokens, force=True)
