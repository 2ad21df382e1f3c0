"""Distillation of Sessions larger than the model's budget: the job splits into parts and every event is distilled."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory import DistillationSplit, InvalidInputError, MemoryStore, NewEvent
from emelex_memory.knowledge.distillation import DISTILL_KIND, KnowledgeCandidate
from emelex_memory.knowledge.splitting import MAX_SPLIT

from ..support import table_rows


def estimate(event) -> int:
    return (event.size + 3) // 4


@pytest.fixture
def kstore(db_path, settings):
    s = MemoryStore.open_path(db_path, settings)
    yield s
    s.close()


def long_session(store: MemoryStore, workspace: Path, turns: int, text_bytes: int = 200) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for i in range(turns):
            lease.append_turn([NewEvent("user", {"text": f"{i:04d} " + "y" * text_bytes}),
                               NewEvent("assistant", {"text": "ok"})])
        lease.release()
    return session.id


def recording_distiller(calls: list):
    def distill(data):
        seqs = [e.seq for e in data.events]
        calls.append((seqs[0], seqs[-1], sum(map(estimate, data.events))))
        return [KnowledgeCandidate(f"part-{seqs[0]:04d}", f"events {seqs[0]}..{seqs[-1]}", 0.5)]

    return distill


def drain(store: MemoryStore, distill, budget: int) -> list:
    outcomes = []
    while (outcome := store.work_distillation(distill, safe_context_tokens=budget)) is not None:
        outcomes.append(outcome)
        assert len(outcomes) < 500
    return outcomes


def test_a_session_larger_than_the_model_budget_is_distilled_in_parts(kstore, workspace):
    sid = long_session(kstore, workspace, 30)  # 60 events of ~56 tokens per turn: far over a 200-token budget
    parent = kstore.queue_distillation(sid).job
    calls: list = []
    outcomes = drain(kstore, recording_distiller(calls), budget=200)
    assert {o.status for o in outcomes} == {"done"}
    assert outcomes[0].job.id == parent.id and outcomes[0].job.result["split_into"] >= 2
    assert all(tokens <= 200 for _, _, tokens in calls)
    covered = sorted((first, last) for first, last, _ in calls)  # each event distilled exactly once, none missed
    assert covered[0][0] == 1 and covered[-1][1] == 60
    assert all(a[1] + 1 == b[0] for a, b in zip(covered, covered[1:]))
    entries = kstore.recall(workspace).entries
    assert len(entries) == len(calls)
    for entry in entries:
        source = entry.head.source
        assert source.session_id == sid and entry.content == f"events {source.first_seq}..{source.last_seq}"
        assert source.digest == kstore.knowledge_source(sid, source.first_seq, source.last_seq).digest
    assert kstore.queue_distillation(sid).created is False  # the parts cover the whole history: nothing new


def test_a_split_queues_each_part_once_and_later_exits_continue_after_them(kstore, workspace):
    sid = long_session(kstore, workspace, 12)
    kstore.queue_distillation(sid)
    split = kstore.work_distillation(recording_distiller([]), safe_context_tokens=200)
    parts = [kstore.get_job(j) for j in split.job.result["jobs"]]
    assert parts[0].source["first_seq"] == 1 and parts[-1].source["last_seq"] == 24
    assert all(p.state == "pending" for p in parts)
    for p in parts:  # the same range again is the same job
        again = kstore.enqueue_job(DISTILL_KIND, sid, p.source, source_key=p.source["digest"])
        assert not again.created and again.job.id == p.id
    with kstore.acquire_lease(sid, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([NewEvent("user", {"text": "one more"})])
        lease.release()
    newest = kstore.queue_distillation(sid).job
    assert (newest.source["first_seq"], newest.source["last_seq"]) == (25, 25)


def test_a_huge_source_is_cut_by_bytes_without_reading_it_and_at_most_max_split_parts_at_once(kstore, workspace):
    sid = long_session(kstore, workspace, 80, text_bytes=100)
    kstore.queue_distillation(sid)
    read = []
    original = kstore.read_distillation_source
    kstore.read_distillation_source = lambda job: read.append(job.id) or original(job)
    split = kstore.work_distillation(recording_distiller([]), safe_context_tokens=2)  # 16 bytes per part
    assert read == [] and split.job.result["split_into"] == MAX_SPLIT
    last = kstore.get_job(split.job.result["jobs"][-1])
    assert (last.source["first_seq"], last.source["last_seq"]) == (MAX_SPLIT, 160)  # the remainder splits later


def test_a_split_that_does_not_cover_the_source_exactly_is_refused(kstore, workspace, db_path):
    sid = long_session(kstore, workspace, 3)
    kstore.queue_distillation(sid)
    claim = kstore.claim_job(DISTILL_KIND)
    before = table_rows(db_path)
    for ranges in [((1, 2), (4, 6)), ((1, 6),), ((2, 3), (4, 6)), ((1, 3), (4, 5))]:
        with pytest.raises(InvalidInputError, match="cover seqs 1..6 exactly"):
            claim.complete(DistillationSplit(ranges))
        assert table_rows(db_path) == before
    done = claim.complete(DistillationSplit(((1, 3), (4, 6))))
    assert done.result["split_into"] == 2
