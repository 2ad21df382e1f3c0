"""Distillation jobs: idempotent queueing, bounded validated candidates applied all or none, pins respected."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import pytest

from emelex_memory import KnowledgeSource, MemoryStore, NewEvent
from emelex_memory.knowledge.distillation import (
    DISTILL_KIND,
    MAX_CANDIDATES,
    DistillationInput,
    DistillationResult,
    KnowledgeCandidate,
    validate_candidates,
)
from emelex_memory.errors import InvalidCandidateError
from emelex_memory.knowledge import distillation

from ..support import table_rows


@pytest.fixture
def store(cstore):
    return cstore


def knowledge_rows(db: Path) -> dict:
    rows = table_rows(db)
    return {t: rows[t] for t in ("knowledge", "knowledge_versions")}


def finished_session(store: MemoryStore, workspace: Path, *texts: str) -> str:
    session = store.create_session(workspace)
    append(store, session.id, workspace, *texts)
    return session.id


def append(store: MemoryStore, session_id: str, workspace: Path, *texts: str) -> None:
    with store.acquire_lease(session_id, workspace) as lease:
        for _ in lease.replay_all():
            pass
        for text in texts:
            lease.append_turn([NewEvent("user", {"text": text}), NewEvent("assistant", {"text": "ok"})])
        lease.release()


def upserts(n: int, prefix: str = "fact") -> list[KnowledgeCandidate]:
    return [KnowledgeCandidate(f"{prefix}-{i:03d}", f"content {i}", 0.5) for i in range(n)]


def returning(candidates):
    seen: list[DistillationInput] = []

    def distill(data: DistillationInput):
        seen.append(data)
        return candidates

    distill.seen = seen
    return distill


# -- queueing --------------------------------------------------------------------------------


def test_queueing_the_same_session_and_digest_twice_makes_one_job(store, workspace):
    sid = finished_session(store, workspace, "we use tabs")
    first = store.queue_distillation(sid)
    again = store.queue_distillation(sid)
    assert first.created and not again.created and again.job.id == first.job.id
    source = first.job.source
    assert (source["first_seq"], source["last_seq"]) == (1, 2)
    assert source["digest"] == store.knowledge_source(sid, 1, 2).digest
    direct = store.enqueue_job(DISTILL_KIND, sid, source, source_key=source["digest"])
    assert not direct.created and direct.job.id == first.job.id
    assert len(store.list_jobs(kind=DISTILL_KIND).jobs) == 1


def test_later_exits_queue_only_the_new_events(store, workspace):
    sid = finished_session(store, workspace, "one")
    store.queue_distillation(sid)
    append(store, sid, workspace, "two", "three")
    second = store.queue_distillation(sid)
    assert second.created and (second.job.source["first_seq"], second.job.source["last_seq"]) == (3, 6)
    assert store.queue_distillation(store.create_session(workspace).id) is None


def test_finish_session_queues_and_releases(store, workspace):
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    lease.append_turn([NewEvent("user", {"text": "remember: make test"})])
    enqueued = store.finish_session(lease)
    assert enqueued.created and enqueued.job.state == "pending"
    store.acquire_lease(session.id, workspace).release()  # the first lease was released


# -- applying ----------------------------------------------------------------------------------


def test_a_worker_applies_candidates_with_provenance(store, workspace):
    sid = finished_session(store, workspace, "we use tabs", "and make test")
    job = store.queue_distillation(sid).job
    distill = returning([KnowledgeCandidate("indent", "tabs", 0.9), KnowledgeCandidate("tests", "make test", 0.6)])
    outcome = store.work_distillation(distill)
    assert outcome.status == "done"
    assert outcome.job.result == {
        "candidates": 2, "applied": 2, "unchanged": 0, "skipped_pinned": 0, "skipped_missing": 0,
    }
    data = distill.seen[0]
    assert [e.seq for e in data.events] == [1, 2, 3, 4] and data.workspace == os.path.realpath(workspace)
    head = store.get_knowledge(workspace, "indent").head
    assert (head.content, head.confidence, head.origin) == ("tabs", 0.9, "distillation")
    assert head.source == KnowledgeSource(sid, 1, 4, job.source["digest"])
    assert store.work_distillation(distill) is None  # nothing else is due


def test_a_guarded_result_adds_its_rejection_counts_and_says_why_nothing_was_saved(store, workspace):
    sid = finished_session(store, workspace, "we use tabs")
    store.queue_distillation(sid)
    guarded = DistillationResult((KnowledgeCandidate("indent", "tabs", 0.9),), {"rejected_unsupported": 2})
    outcome = store.work_distillation(returning(guarded))
    assert outcome.job.result == {"candidates": 1, "applied": 1, "unchanged": 0, "skipped_pinned": 0,
                                  "skipped_missing": 0, "rejected_unsupported": 2}
    append(store, sid, workspace, "tabs again")
    store.queue_distillation(sid)
    result = store.work_distillation(returning(DistillationResult((), {"rejected_example": 3}))).job.result
    assert result["applied"] == 0 and result["nothing_saved"] == "nothing saved: 3 rejected (example)"
    append(store, sid, workspace, "and again")
    store.queue_distillation(sid)
    assert store.work_distillation(returning([])).job.result["nothing_saved"] == "the distiller proposed no Knowledge"


@pytest.mark.parametrize("rejected", [{"unsupported": 1}, {"rejected_x": -1}, {"rejected_x": True}, "counts"])
def test_malformed_rejection_counts_fail_the_batch_and_apply_nothing(store, workspace, db_path, rejected):
    sid = finished_session(store, workspace, "we use tabs")
    store.queue_distillation(sid)
    before = knowledge_rows(db_path)
    outcome = store.work_distillation(returning(DistillationResult((KnowledgeCandidate("k", "v"),), rejected)))
    assert outcome.status == "failed" and "rejected counts" in outcome.detail
    assert knowledge_rows(db_path) == before


def test_rerunning_the_same_candidates_appends_nothing(store, workspace):
    distill = returning([KnowledgeCandidate("indent", "tabs", 0.9)])
    sid = finished_session(store, workspace, "tabs")
    store.queue_distillation(sid)
    store.work_distillation(distill)
    append(store, sid, workspace, "still tabs")
    store.queue_distillation(sid)
    outcome = store.work_distillation(distill)
    assert outcome.job.result["applied"] == 1  # new provenance is a change
    assert outcome.job.result["unchanged"] == 0
    assert store.get_knowledge(workspace, "indent").head.version == 2


def test_a_pinned_entry_survives_distillation_that_tries_to_tombstone_it(store, workspace):
    store.remember(workspace, "indent", "tabs")
    store.pin(workspace, "indent")
    store.remember(workspace, "old", "obsolete")
    sid = finished_session(store, workspace, "forget about indentation")
    store.queue_distillation(sid)
    outcome = store.work_distillation(
        returning([
            KnowledgeCandidate("indent", tombstone=True, confidence=0.99),
            KnowledgeCandidate("old", tombstone=True),
            KnowledgeCandidate("never-existed", tombstone=True),
        ])
    )
    assert outcome.status == "done"
    assert outcome.job.result["skipped_pinned"] == 1 and outcome.job.result["skipped_missing"] == 1
    kept = store.get_knowledge(workspace, "indent")
    assert kept.pinned and not kept.tombstoned and kept.content == "tabs" and kept.head.version == 1
    assert store.get_knowledge(workspace, "old").tombstoned
    assert store.get_knowledge(workspace, "old").head.origin == "distillation"


def test_a_pinned_entry_is_not_rewritten_by_distillation(store, workspace):
    store.remember(workspace, "indent", "tabs")
    store.pin(workspace, "indent")
    sid = finished_session(store, workspace, "spaces now")
    store.queue_distillation(sid)
    outcome = store.work_distillation(returning([KnowledgeCandidate("indent", "spaces")]))
    assert outcome.job.result["skipped_pinned"] == 1
    assert store.get_knowledge(workspace, "indent").content == "tabs"


def test_candidates_apply_all_or_none_failure_at_the_100th(store, workspace, db_path, monkeypatch):
    store.remember(workspace, "fact-005", "older content")
    sid = finished_session(store, workspace, "lots of facts")
    store.queue_distillation(sid)
    before = knowledge_rows(db_path)
    calls = {"n": 0}
    real = distillation.upsert_version

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 100:
            raise RuntimeError("injected failure at the 100th candidate")
        return real(*args, **kwargs)

    monkeypatch.setattr(distillation, "upsert_version", failing)
    outcome = store.work_distillation(returning(upserts(120)))
    assert calls["n"] == 100
    assert outcome.status == "retrying" and outcome.job.attempts == 1
    assert "injected failure" in outcome.job.diagnostics[-1].message
    assert knowledge_rows(db_path) == before
    monkeypatch.undo()
    store.clock.now += 31  # past the first retry deadline
    outcome = store.work_distillation(returning(upserts(120)))
    assert outcome.status == "done" and outcome.job.result["applied"] == 120


def test_more_than_128_unique_candidates_apply_nothing(store, workspace, db_path):
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    before = knowledge_rows(db_path)
    outcome = store.work_distillation(returning(upserts(MAX_CANDIDATES + 1)))
    assert outcome.status == "failed" and "over the limit of 128" in outcome.job.diagnostics[-1].message
    assert knowledge_rows(db_path) == before
    store.retry_failed_job(outcome.job.id)  # a greedy distiller would repeat the batch: fixed, then retried
    outcome = store.work_distillation(returning(upserts(MAX_CANDIDATES)))
    assert outcome.status == "done" and outcome.job.result["applied"] == MAX_CANDIDATES


def test_exact_duplicates_collapse_and_conflicting_ones_are_refused(store, workspace, db_path):
    assert validate_candidates(upserts(100) + upserts(100)) == tuple(upserts(100))
    assert len(validate_candidates(upserts(MAX_CANDIDATES) * 4)) == MAX_CANDIDATES
    with pytest.raises(InvalidCandidateError, match="more than 512"):
        validate_candidates(upserts(MAX_CANDIDATES) * 4 + upserts(1))
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    before = knowledge_rows(db_path)
    conflicting = [KnowledgeCandidate("k", "one"), KnowledgeCandidate("k", "two")]
    outcome = store.work_distillation(returning(conflicting))
    assert outcome.status == "failed" and "disagree" in outcome.job.diagnostics[-1].message
    assert knowledge_rows(db_path) == before


@pytest.mark.parametrize(
    "bad, message",
    [
        ([KnowledgeCandidate("k", "v", 1.5)], "between 0 and 1"),
        ([KnowledgeCandidate("k", None)], "non-blank"),
        ([KnowledgeCandidate("k", "v", tombstone=True)], "no content"),
        ([KnowledgeCandidate("", "v")], "non-empty"),
        ([KnowledgeCandidate("k", "x" * 70_000)], "at most 65536"),
        ([("k", "v")], "not a KnowledgeCandidate"),
        ("not a list", "iterable"),
        (None, "iterable"),
    ],
)
def test_invalid_candidates_are_refused_before_anything_is_written(store, workspace, db_path, bad, message):
    with pytest.raises(InvalidCandidateError, match=message):
        validate_candidates(bad)
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    before = knowledge_rows(db_path)
    outcome = store.work_distillation(returning(bad))
    assert outcome.status == "failed" and outcome.job.attempts == 1 and knowledge_rows(db_path) == before


# -- the Session, the source and the workspace -------------------------------------------------------


def test_workers_skip_live_sessions(store, workspace):
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    lease = store.acquire_lease(sid, workspace)
    distill = returning([KnowledgeCandidate("k", "v")])
    assert store.work_distillation(distill) is None and distill.seen == []
    lease.release()
    assert store.work_distillation(distill).status == "done"


def test_a_session_going_live_after_the_claim_wins_without_consuming_an_attempt(store, workspace, db_path):
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    leases = []

    def distill_while_user_returns(data):
        leases.append(store.acquire_lease(sid, workspace))
        return [KnowledgeCandidate("k", "v")]

    before = knowledge_rows(db_path)
    outcome = store.work_distillation(distill_while_user_returns)
    assert outcome.status == "released" and outcome.job.attempts == 0 and outcome.job.state == "pending"
    assert knowledge_rows(db_path) == before
    leases[0].release()


def test_a_changed_source_fails_the_job_permanently(store, workspace, db_path):
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    conn = apsw.Connection(str(db_path))
    conn.execute("UPDATE events SET payload = '{\"text\":\"tampered\"}' WHERE seq = 1")
    conn.close()
    outcome = store.work_distillation(returning([KnowledgeCandidate("k", "v")]))
    assert outcome.status == "failed" and "changed" in outcome.detail


def test_a_single_event_over_the_byte_cap_or_token_budget_fails_permanently(store, workspace):
    sid = finished_session(store, workspace, "x" * 600)
    parent = store.queue_distillation(sid).job
    split = store.work_distillation(returning([]), safe_context_tokens=10)
    assert split.status == "done" and split.job.id == parent.id and split.job.result["split_into"] == 2
    big = store.work_distillation(returning([]), safe_context_tokens=10)  # the 600-byte user event alone
    assert big.status == "failed" and "event 1 alone" in big.detail and "safe context" in big.detail
    assert (big.job.source["first_seq"], big.job.source["last_seq"]) == (1, 1)
    small = store.work_distillation(returning([]), safe_context_tokens=10)  # the assistant's "ok" fits
    assert small.status == "done" and small.job.source["first_seq"] == 2
    store.settings.knowledge_source_max_bytes = 100
    store.retry_failed_job(big.job.id)
    outcome = store.work_distillation(returning([]))
    assert outcome.status == "failed" and "knowledge_source_max_bytes" in outcome.detail


def test_a_replaced_workspace_fails_the_job_and_writes_no_knowledge(store, workspace, tmp_path, db_path):
    sid = finished_session(store, workspace, "x")
    store.queue_distillation(sid)
    os.rename(workspace, tmp_path / "moved-away")
    workspace.mkdir()
    before = knowledge_rows(db_path)
    outcome = store.work_distillation(returning([KnowledgeCandidate("k", "v")]))
    assert outcome.status == "failed" and "retry the job" in outcome.detail
    assert knowledge_rows(db_path) == before
