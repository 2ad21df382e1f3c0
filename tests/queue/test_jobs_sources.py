"""Job kinds validate their source shape: at enqueue (nothing written), before a worker runs one, and in readers."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory import (
    COMPACTION_KIND,
    DISTILL_KIND,
    InvalidInputError,
    InvalidJobSourceError,
    JobClaim,
    MemoryStore,
    compaction_handler,
    run_one_job,
)

from emelex_memory.queue.kinds import JobKindRegistry

from ..support import seed_session, table_rows

WINDOW = 2000


def tokens(event) -> int:
    return 100


@pytest.fixture
def sid(store: MemoryStore, workspace: Path) -> str:
    return seed_session(store, workspace, 10)


@pytest.fixture
def compaction_source(store: MemoryStore, sid: str) -> dict:
    return store.plan_compaction(sid, context_window=WINDOW, count_tokens=tokens).source


def changed(source: dict, **changes) -> dict:
    out = dict(source, **changes)
    return {k: v for k, v in out.items() if v is not ...}


BAD_COMPACTION = {
    "not a source at all": lambda s: {"hello": "world"},
    "missing field": lambda s: changed(s, preserve_turns=...),
    "unknown field": lambda s: changed(s, extra=1),
    "uppercase digest": lambda s: changed(s, digest=s["digest"].upper()),
    "short digest": lambda s: changed(s, digest="ab"),
    "negative count": lambda s: changed(s, count=-1),
    "boolean seq": lambda s: changed(s, through_seq=True),
    "float seq": lambda s: changed(s, through_seq=10.5),
    "text base": lambda s: changed(s, base_summary_id="7"),
    "huge id": lambda s: changed(s, first_event_id=2**64),
    "zero window": lambda s: changed(s, context_window=0),
}


@pytest.mark.parametrize("what", sorted(BAD_COMPACTION))
def test_enqueue_refuses_a_malformed_compaction_source_and_writes_nothing(
    store: MemoryStore, sid: str, compaction_source: dict, db_path: Path, what: str
) -> None:
    before = table_rows(db_path)
    with pytest.raises(InvalidJobSourceError, match="a compaction job source .*queue_compaction") as raised:
        store.enqueue_job(COMPACTION_KIND, sid, BAD_COMPACTION[what](compaction_source))
    assert isinstance(raised.value, InvalidInputError)
    assert table_rows(db_path) == before


@pytest.mark.parametrize(
    "source",
    [{"hello": "world"}, {"first_seq": 0, "last_seq": 3, "digest": "0" * 64},
     {"first_seq": 4, "last_seq": 3, "digest": "0" * 64}, {"first_seq": 1, "last_seq": 3, "digest": None}],
)
def test_enqueue_refuses_a_malformed_distill_source_and_writes_nothing(
    store: MemoryStore, sid: str, db_path: Path, source: dict
) -> None:
    before = table_rows(db_path)
    with pytest.raises(InvalidJobSourceError, match="distill job source"):
        store.enqueue_job(DISTILL_KIND, sid, source)
    assert table_rows(db_path) == before


def test_a_well_formed_source_is_queued(store: MemoryStore, sid: str, compaction_source: dict) -> None:
    assert store.enqueue_job(COMPACTION_KIND, sid, compaction_source).created
    assert store.queue_distillation(sid).created


def test_a_malformed_source_already_stored_fails_its_job_at_once_and_readers_raise_typed_errors(
    store: MemoryStore, sid: str, compaction_source: dict
) -> None:
    compaction = store.enqueue_job(COMPACTION_KIND, sid, compaction_source).job
    distill = store.queue_distillation(sid).job
    with store.db.write() as conn:  # written by an older version, or by hand: bypasses enqueue's check
        conn.execute("UPDATE jobs SET source = '{\"hello\":\"world\"}'")
    with pytest.raises(InvalidJobSourceError):
        store.compaction_source(compaction.id)
    with pytest.raises(InvalidJobSourceError):
        store.read_compaction_source(store.get_job(compaction.id))
    with pytest.raises(InvalidJobSourceError):
        store.read_distillation_source(store.get_job(distill.id))
    calls = []

    def handler(claim: JobClaim) -> None:
        calls.append(claim.id)
        claim.job.source["summary_budget_tokens"]  # what the CLI worker reads first: never reached

    for _ in range(2):
        outcome = run_one_job(store, handler)
        assert outcome.status == "failed" and outcome.job.attempts == 1  # permanent at once, not three KeyErrors
        assert "InvalidJobSourceError" in outcome.detail and "lacks" in outcome.detail
    assert calls == []
    assert run_one_job(store, compaction_handler(lambda events, job: "x")) is None


def test_custom_kinds_may_register_a_source_validator(
    store: MemoryStore, kinds: JobKindRegistry, sid: str, db_path: Path
) -> None:
    def needs_url(source) -> None:
        if not isinstance(source.get("url"), str):
            raise InvalidJobSourceError("a fetch job source needs a url; pass {'url': ...}")

    def sloppy(source) -> None:
        source["missing"]  # a validator that raises an untyped error is still reported as a typed one

    kinds.register("fetch", validate=needs_url)
    kinds.register("sloppy", validate=sloppy)
    assert store.enqueue_job("fetch", sid, {"url": "https://example.org"}).created
    before = table_rows(db_path)
    with pytest.raises(InvalidJobSourceError, match="needs a url"):
        store.enqueue_job("fetch", sid, {"uri": "https://example.org"})
    with pytest.raises(InvalidJobSourceError, match="sloppy job source .*KeyError"):
        store.enqueue_job("sloppy", sid, {})
    assert table_rows(db_path) == before
