"""Compaction end to end on real database files: planning, queueing, completion re-checks, Summary replay."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from emelex_memory.sessions.rows import session_rowid
from emelex_memory import (
    COMPACTION_KIND,
    CompactionPolicy,
    Event,
    InvalidInputError,
    JsonTooLargeError,
    MemoryStore,
    NewEvent,
    ReservedEventKindError,
    SessionLiveError,
    SourceChangedError,
    SummaryDraft,
    SummaryProvenanceError,
    WorkerLeaseLostError,
    compaction_handler,
    run_one_job,
)
from emelex_memory.queue.jobs import encode_json
from emelex_memory.sessions.prefix_digest import digest_prefix

from ..support import Clock, table_rows

WINDOW = 2000  # with 100 tokens per event, a turn of two events is 200 tokens: 8 turns trigger, 5 are the target
COVERED = 12  # events compacted from 10 turns: 6 turns, leaving 800 tokens = the target 1000 - the Summary reserve 200


def tokens(event: Event) -> int:
    return 100


@pytest.fixture
def clock() -> Clock:
    return Clock(3_000_000.0)


def add_turns(store: MemoryStore, session_id: str, workspace: Path, n: int, label: str = "t") -> None:
    with store.acquire_lease(session_id, workspace) as lease:
        list(lease.replay_all())
        for i in range(n):
            lease.append_turn([NewEvent("user", {"text": f"{label}{i} question"}),
                               NewEvent("assistant", {"text": f"{label}{i} answer"})])
        lease.release()


def summarize(events: list[Event], job) -> str:
    return "summary of " + ",".join(str(e.id) for e in events)


def compact(store: MemoryStore, session_id: str, **kw) -> dict:
    queued = store.queue_compaction(session_id, context_window=WINDOW, count_tokens=tokens, **kw)
    assert queued.job is not None, queued.reason
    outcome = run_one_job(store, compaction_handler(summarize, model_ref="smollm2@sha256:abc"), kinds=COMPACTION_KIND)
    assert outcome.status == "done", outcome.detail
    return outcome.job.result


def view(store: MemoryStore, session_id: str, limit: int | None = None) -> tuple[list[Event], int]:
    events, after = [], 0
    while True:
        page = store.replay(session_id, after, limit=limit)
        events += page.events
        after = page.next_cursor
        if page.done:
            return events, after


@pytest.fixture
def sid(cstore: MemoryStore, workspace: Path) -> str:
    session = cstore.create_session(workspace)
    add_turns(cstore, session.id, workspace, 10)
    return session.id


# -- planning and queueing ----------------------------------------------------------------


def test_planning_under_the_trigger_or_with_too_few_turns_queues_nothing(cstore: MemoryStore, sid: str) -> None:
    calm = cstore.queue_compaction(sid, context_window=10 * WINDOW, count_tokens=tokens)
    assert calm.job is None and "under the 80% trigger" in calm.reason
    keep_all = CompactionPolicy(preserve_turns=10)
    few = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens, policy=keep_all)
    assert few.job is None and "newest 10 are always kept" in few.reason
    assert cstore.list_jobs().jobs == []
    with pytest.raises(InvalidInputError):
        cstore.plan_compaction(sid, context_window=0)
    with pytest.raises(InvalidInputError):
        cstore.plan_compaction(sid, context_window=WINDOW, count_tokens=lambda e: -1)


def test_the_plan_records_the_exact_source_prefix_on_turn_boundaries(cstore: MemoryStore, sid: str) -> None:
    plan = cstore.plan_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    src = plan.source
    assert (plan.turns, plan.compact_turns, plan.history_tokens) == (10, 6, 2000)
    assert (src["count"], src["through_seq"], src["source_tokens"], src["tail_tokens"]) == (12, 12, 1200, 800)
    assert (src["target_tokens"], src["summary_budget_tokens"], src["preserve_turns"]) == (1000, 200, 4)
    events, _ = view(cstore, sid)
    assert (src["first_event_id"], src["last_event_id"]) == (events[0].id, events[11].id)
    assert events[11].turn != events[12].turn  # the boundary falls between turns
    with cstore.db.read() as conn:
        facts = digest_prefix(conn, session_rowid(conn, sid), None, 0, 12)
    assert facts.digest == src["digest"] and len(src["digest"]) == 64
    keep6 = CompactionPolicy(preserve_turns=6)
    forced = cstore.plan_compaction(sid, context_window=100 * WINDOW, count_tokens=tokens, force=True, policy=keep6)
    assert forced.compact_turns == 4 and forced.source["through_seq"] == 8  # all but the newest six


def test_queueing_only_plans_and_queues_even_while_the_session_is_live(
    cstore: MemoryStore, sid: str, workspace: Path, db_path: Path
) -> None:
    lease = cstore.acquire_lease(sid, workspace)  # chat is running /compact
    queued = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert queued.created and queued.job.state == "pending" and queued.job.source == queued.plan.source
    canonical = encode_json(queued.plan.source, max_bytes=16384, what="source").encode()
    assert queued.job.source_key == hashlib.sha256(canonical).hexdigest()  # keyed by the whole plan, not the digest
    again = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert not again.created and again.job.id == queued.job.id and "already queued" in again.reason
    assert cstore.get_session(sid).last_seq == 20  # no Summary was written in place
    assert run_one_job(cstore, compaction_handler(summarize)) is None  # the live Session's job is skipped
    lease.release()
    assert run_one_job(cstore, compaction_handler(summarize)).status == "done"


# -- replay with Summaries ----------------------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 1, 2, 3])
def test_replay_after_compaction_shows_the_summary_then_the_tail_never_the_prefix(
    cstore: MemoryStore, sid: str, limit: int | None
) -> None:
    raw, _ = view(cstore, sid)
    result = compact(cstore, sid)
    events, cursor = view(cstore, sid, limit)
    assert [e.kind for e in events] == ["summary"] + [e.kind for e in raw[COVERED:]]
    assert [e.id for e in events[1:]] == [e.id for e in raw[COVERED:]]
    assert not {e.id for e in raw[:COVERED]} & {e.id for e in events}
    summary = events[0]
    assert summary.id == result["summary_event_id"] and summary.seq == 21 == cursor
    doc = summary.payload
    assert doc["text"] == "summary of " + ",".join(str(e.id) for e in raw[:COVERED])
    assert doc["provenance"]["model"] == "smollm2@sha256:abc"
    assert doc["provenance"]["source"]["digest"] == cstore.list_jobs().jobs[0].source["digest"]
    assert doc["provenance"]["job"] == cstore.list_jobs().jobs[0].id
    tail = cstore.replay(sid, COVERED, limit=limit or 500)  # past the covered prefix: the tail only
    assert tail.events and tail.events[0].seq == COVERED + 1 and all(e.kind != "summary" for e in tail.events)


def test_a_lease_replays_the_summary_view_and_can_append_after_it(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    compact(cstore, sid)
    with cstore.acquire_lease(sid, workspace) as lease:
        replayed = list(lease.replay_all())
        assert replayed[0].kind == "summary" and len(replayed) == 1 + 20 - COVERED
        assert lease.cursor == cstore.get_session(sid).last_seq == 21
        appended = lease.append_turn([NewEvent("user", {"text": "after the summary"})])
        assert appended.first_seq == 22
        with pytest.raises(ReservedEventKindError):
            lease.append_turn([NewEvent("summary", {"text": "forged"})])
        lease.release()
    events, cursor = view(cstore, sid)
    assert events[-1].payload == {"text": "after the summary"} and cursor == 22


def test_repeated_compaction_compacts_a_summary_together_with_later_turns(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    first = compact(cstore, sid)
    add_turns(cstore, sid, workspace, 5, label="u")
    plan = cstore.plan_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert plan.source["base_summary_id"] == first["summary_event_id"]
    assert plan.source["first_event_id"] == first["summary_event_id"]
    source_events = []
    after = 0
    while True:
        page_src = cstore.compaction_source(cstore.queue_compaction(
            sid, context_window=WINDOW, count_tokens=tokens).job.id, after, limit=3)
        source_events += page_src.events
        after = page_src.next_cursor
        if page_src.done:
            break
    assert source_events[0].id == first["summary_event_id"] and len(source_events) == plan.source["count"]
    second = run_one_job(cstore, compaction_handler(summarize)).job.result
    events, cursor = view(cstore, sid, limit=2)
    assert events[0].id == second["summary_event_id"]
    assert first["summary_event_id"] not in {e.id for e in events}
    assert all(e.kind != "summary" for e in events[1:])
    assert cursor == cstore.get_session(sid).last_seq
    assert events[0].payload["text"] == "summary of " + ",".join(str(e.id) for e in source_events)
    add_turns(cstore, sid, workspace, 6, label="v")
    third = compact(cstore, sid)
    events, _ = view(cstore, sid)
    assert events[0].id == third["summary_event_id"] and [e.kind for e in events].count("summary") == 1
    with cstore.acquire_lease(sid, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([NewEvent("user", {"text": "still appendable"})])
        lease.release()


# -- completion re-checks --------------------------------------------------------------------------


def test_completion_after_the_boundary_moved_commits_nothing(cstore: MemoryStore, sid: str, db_path: Path) -> None:
    smaller = cstore.plan_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    larger = cstore.plan_compaction(sid, context_window=100 * WINDOW, count_tokens=tokens, force=True,
                                    policy=CompactionPolicy(preserve_turns=2))
    cstore.enqueue_job(COMPACTION_KIND, sid, larger.source, source_key=larger.source["digest"])
    cstore.enqueue_job(COMPACTION_KIND, sid, smaller.source, source_key=smaller.source["digest"])
    racer = cstore.claim_job(COMPACTION_KIND)
    winner = cstore.claim_job(COMPACTION_KIND)
    winner.complete(SummaryDraft("the winner's summary"))
    before = table_rows(db_path)
    with pytest.raises(SourceChangedError):
        racer.complete(SummaryDraft("too late"))
    assert table_rows(db_path) == before
    outcome = racer.fail("source changed", permanent=True)
    assert outcome.state == "failed"


def test_completion_after_the_source_bytes_changed_commits_nothing(
    cstore: MemoryStore, sid: str, db_path: Path
) -> None:
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    claim = cstore.claim_job(COMPACTION_KIND)
    with cstore.db.write() as conn:
        conn.execute("UPDATE events SET payload = '{\"text\":\"rewritten\"}' WHERE seq = 3")
    before = table_rows(db_path)
    with pytest.raises(SourceChangedError):
        claim.complete(SummaryDraft("summary of a source that changed"))
    assert table_rows(db_path) == before
    outcome = run_one_job(cstore, compaction_handler(summarize))  # nothing due: the claim is still held
    assert outcome is None
    claim.release()
    outcome = run_one_job(cstore, compaction_handler(summarize))
    assert outcome.status == "failed" and "SourceChangedError" in outcome.detail  # permanent, not retried


def test_completion_after_the_worker_lease_expired_commits_nothing(
    cstore: MemoryStore, sid: str, clock: Clock, db_path: Path
) -> None:
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    claim = cstore.claim_job(COMPACTION_KIND, ttl_s=30)
    clock.now += 31
    before = table_rows(db_path)
    with pytest.raises(WorkerLeaseLostError):
        claim.complete(SummaryDraft("slow summary"))
    assert table_rows(db_path) == before


def test_completion_after_the_session_went_live_commits_nothing(
    cstore: MemoryStore, sid: str, workspace: Path, db_path: Path
) -> None:
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    claim = cstore.claim_job(COMPACTION_KIND)
    lease = cstore.acquire_lease(sid, workspace)
    before = table_rows(db_path)
    with pytest.raises(SessionLiveError):
        claim.complete(SummaryDraft("summary"))
    assert table_rows(db_path) == before
    assert claim.release("Session became live").attempts == 0
    lease.release()


@pytest.mark.parametrize(
    "result",
    [None, "just text", SummaryDraft(""), SummaryDraft("ok", model_ref=""), SummaryDraft("x" * (2 * 1024 * 1024))],
)
def test_a_bad_summary_result_commits_nothing(cstore: MemoryStore, sid: str, db_path: Path, result) -> None:
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    claim = cstore.claim_job(COMPACTION_KIND)
    before = table_rows(db_path)
    with pytest.raises((InvalidInputError, JsonTooLargeError)):
        claim.complete(result)
    assert table_rows(db_path) == before


def test_a_source_over_the_safe_context_budget_fails_permanently(cstore: MemoryStore, sid: str) -> None:
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    outcome = run_one_job(cstore, compaction_handler(summarize, safe_context_tokens=999))
    assert outcome.status == "failed" and outcome.job.attempts == 1
    assert "SourceTooLargeError" in outcome.job.diagnostics[-1].message
    assert view(cstore, sid)[0][0].kind == "user"


# -- verification ------------------------------------------------------------------------------


TAMPERING = {
    "summary text": "UPDATE events SET payload = replace(payload, 'summary of', 'forged by') WHERE kind = 'summary'",
    "source event": "UPDATE events SET payload = replace(payload, 'question', 'questlon') WHERE seq = 3",
    "covered range": "UPDATE summaries SET through_seq = through_seq - 2",
    "summary digest": "UPDATE summaries SET summary_digest = zeroblob(32)",
    "job state": "UPDATE jobs SET state = 'failed', result = NULL",
    "model reference": "UPDATE summaries SET model_ref = 'another-model'",
}


@pytest.mark.parametrize("what", sorted(TAMPERING))
def test_a_tampered_summary_or_source_fails_verification(
    cstore: MemoryStore, sid: str, workspace: Path, what: str
) -> None:
    compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute(TAMPERING[what])
    with pytest.raises(SummaryProvenanceError, match="does not verify"):
        cstore.replay(sid)
    with cstore.acquire_lease(sid, workspace) as lease:
        with pytest.raises(SummaryProvenanceError):
            lease.replay()
        assert not lease.replayed
    with pytest.raises(SummaryProvenanceError):
        cstore.plan_compaction(sid, context_window=WINDOW, count_tokens=tokens)


def test_deleting_a_compacted_session_removes_its_summaries_and_jobs(cstore: MemoryStore, sid: str) -> None:
    compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute("DELETE FROM sessions")
        left = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("events", "summaries", "jobs")]
    assert left == [0, 0, 0]


def test_the_source_digest_covers_the_asset_references_of_compacted_events(
    cstore: MemoryStore, workspace: Path
) -> None:
    session = cstore.create_session(workspace)
    picture = cstore.put_asset(b"\x89PNG not really an image", "image/png")
    with cstore.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", {"text": "look at this"}, assets=(picture,))])
        lease.release()
    add_turns(cstore, session.id, workspace, 9)
    cstore.queue_compaction(session.id, context_window=WINDOW, count_tokens=tokens)
    job = cstore.list_jobs().jobs[0]
    first = cstore.compaction_source(job.id).events[0]
    assert first.assets == (picture,)  # the summarizer sees the media of the prefix
    compact_result = run_one_job(cstore, compaction_handler(summarize)).job.result
    assert view(cstore, session.id)[0][0].id == compact_result["summary_event_id"]
    with cstore.db.write() as conn:  # same bytes, other claimed size: only the asset reference text changes
        conn.execute("UPDATE events SET asset_refs = replace(asset_refs, ?, ?) WHERE seq = 1",
                     (f",{picture.size},", f",{picture.size + 1},"))
        assert conn.changes() == 1
    with pytest.raises(SummaryProvenanceError, match="no longer match"):
        cstore.replay(session.id)
