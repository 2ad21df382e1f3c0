"""Summaries without provenance never pass replay, and completion refuses sources that split or swallow turns."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory.sessions.rows import session_rowid
from emelex_memory import (
    COMPACTION_KIND,
    InvalidJobSourceError,
    MemoryStore,
    SourceTooLargeError,
    SummaryDraft,
    SummaryProvenanceError,
    compaction_handler,
    run_one_job,
)
from emelex_memory.compaction import summaries
from emelex_memory.sessions import replay
from emelex_memory.sessions.prefix_digest import digest_prefix
from emelex_memory.sessions.transcript import session_head

from ..support import table_rows
from .test_compaction import COVERED, WINDOW, add_turns, clock, compact, sid, summarize, tokens, view

__all__ = ["clock", "sid"]  # fixtures used here


def assert_replay_refused(store: MemoryStore, session_id: str, workspace: Path) -> None:
    """Every way to read the view raises: from the start, past the covered prefix, by a lease, and planning."""
    for after in (0, COVERED, store.get_session(session_id).last_seq - 1):
        with pytest.raises(SummaryProvenanceError, match="does not verify"):
            store.replay(session_id, after)
    with store.acquire_lease(session_id, workspace) as lease:
        with pytest.raises(SummaryProvenanceError):
            lease.replay()
        assert not lease.replayed
        lease.release()
    with pytest.raises(SummaryProvenanceError):
        store.plan_compaction(session_id, context_window=WINDOW, count_tokens=tokens)


def test_the_only_summary_without_its_provenance_record_is_refused_not_skipped(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute("DELETE FROM summaries")
    assert_replay_refused(cstore, sid, workspace)


def test_the_newest_summary_without_its_record_never_falls_back_to_an_older_one(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    first = compact(cstore, sid)
    add_turns(cstore, sid, workspace, 5, label="u")
    second = compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute("DELETE FROM summaries WHERE event_id = ?", (second["summary_event_id"],))
        assert conn.execute("SELECT event_id FROM summaries").fetchall() == [(first["summary_event_id"],)]
    assert_replay_refused(cstore, sid, workspace)


def test_an_older_summary_without_its_record_is_refused(cstore: MemoryStore, sid: str, workspace: Path) -> None:
    first = compact(cstore, sid)
    add_turns(cstore, sid, workspace, 5, label="u")
    compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute("DELETE FROM summaries WHERE event_id = ?", (first["summary_event_id"],))
    with pytest.raises(SummaryProvenanceError, match=f"Summary event {first['summary_event_id']}"):
        cstore.replay(sid)


def test_a_summary_turned_into_an_ordinary_event_is_refused(cstore: MemoryStore, sid: str, workspace: Path) -> None:
    compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute("UPDATE events SET kind = 'assistant' WHERE kind = 'summary'")
    assert_replay_refused(cstore, sid, workspace)


def test_a_summary_event_written_without_compaction_is_refused(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    with cstore.db.write() as conn:
        rowid = session_rowid(conn, sid)
        assert session_head(conn, rowid)[:2] == (20, 10)
        conn.execute(
            "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, created_at) "
            "VALUES (?, 21, 11, 0, 'summary', '{\"text\":\"forged\"}', 17, ?, 0)",
            (rowid, session_head(conn, rowid)[2] + 17),
        )
    for after in (0, 20):
        with pytest.raises(SummaryProvenanceError, match="provenance record is missing"):
            cstore.replay(sid, after)


# -- completion refuses sources that split or swallow turns ------------------------------------------


def forged(store: MemoryStore, session_id: str, through: int, **changes) -> dict:
    """A well-formed compaction source over raw seqs 1..`through` whose digest matches the events."""
    source = dict(store.plan_compaction(session_id, context_window=WINDOW, count_tokens=tokens).source)
    with store.db.read() as conn:
        facts = digest_prefix(conn, session_rowid(conn, session_id), None, 0, through)
    source.update(count=facts.count, first_event_id=facts.first_event_id, last_event_id=facts.last_event_id,
                  digest=facts.digest, through_seq=through, goal_through_seq=through)
    source.update(changes)
    return source


@pytest.mark.parametrize(
    ("through", "changes", "why"),
    [
        (5, {}, "in the middle of turn 3"),  # seq 5 is turn 3's question; its answer is seq 6
        (16, {}, "leaves 2 turns uncompacted, fewer than the 4"),
        (20, {"preserve_turns": 1}, "leaves 0 turns uncompacted, fewer than the 1"),
        (999, {}, "ends at seq 999, which is not the last event of its source"),  # would hide later appends
    ],
)
def test_completion_refuses_a_source_that_splits_a_turn_or_covers_preserved_turns(
    cstore: MemoryStore, sid: str, db_path: Path, through: int, changes: dict, why: str
) -> None:
    source = forged(cstore, sid, through, **changes)
    cstore.enqueue_job(COMPACTION_KIND, sid, source)
    claim = cstore.claim_job(COMPACTION_KIND)
    before = table_rows(db_path)
    with pytest.raises(InvalidJobSourceError, match=why):
        claim.complete(SummaryDraft("a summary of a forged source"))
    assert table_rows(db_path) == before
    claim.release()
    outcome = run_one_job(cstore, compaction_handler(summarize))
    assert outcome.status == "failed" and outcome.job.attempts == 1  # permanent at once
    assert "InvalidJobSourceError" in outcome.detail
    assert view(cstore, sid)[0][0].kind == "user"  # nothing was replaced


def test_completion_refuses_a_source_of_nothing_but_the_base_summary(
    cstore: MemoryStore, sid: str, db_path: Path
) -> None:
    first = compact(cstore, sid)
    base = first["summary_event_id"]
    with cstore.db.read() as conn:
        facts = digest_prefix(conn, session_rowid(conn, sid), base, COVERED, COVERED)
    source = dict(cstore.list_jobs().jobs[0].source, base_summary_id=base, count=facts.count, digest=facts.digest,
                  first_event_id=base, last_event_id=base)
    cstore.enqueue_job(COMPACTION_KIND, sid, source)
    claim = cstore.claim_job(COMPACTION_KIND)
    before = table_rows(db_path)
    with pytest.raises(InvalidJobSourceError, match="covers no event after its base Summary"):
        claim.complete(SummaryDraft("a summary of a summary"))
    assert table_rows(db_path) == before
    claim.release()


def test_a_source_over_the_covered_byte_cap_is_refused_and_verification_reads_no_more(
    cstore: MemoryStore, sid: str, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    claim = cstore.claim_job(COMPACTION_KIND)
    monkeypatch.setattr(summaries, "MAX_COVERED_BYTES", 500)  # the source's frames hold about 1,100 bytes
    before = table_rows(db_path)
    with pytest.raises(SourceTooLargeError):
        claim.complete(SummaryDraft("summary"))
    assert table_rows(db_path) == before
    monkeypatch.setattr(summaries, "MAX_COVERED_BYTES", 64 * 1024 * 1024)
    claim.complete(SummaryDraft("summary"))
    assert view(cstore, sid)[0][0].kind == "summary"
    monkeypatch.setattr(replay, "MAX_COVERED_BYTES", 500)  # what replay's verification reads at most
    with pytest.raises(SummaryProvenanceError, match="more than the 500 bytes"):
        cstore.replay(sid)
