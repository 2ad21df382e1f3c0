"""A way back: the raw history behind the replay view, and reverting and redoing a compaction, on real database files.

Reverting the newest Summary in effect makes replay show what it replaced again (the Summary stays stored with its
provenance, marked reverted); redoing it shows it again after re-verifying it. Both are one transaction, refused
while the Session is in use, and bad input changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    COMPACTION_KIND,
    AssetMediaCapError,
    CompactionPolicy,
    InvalidInputError,
    MemoryStore,
    NewEvent,
    SessionBusyError,
    SessionNotFoundError,
    SummaryProvenanceError,
    SummaryStateError,
    compaction_handler,
    run_one_job,
)
from emelex_memory.assets import links

from ..support import Clock, table_rows
from .test_compaction import WINDOW, add_turns, compact, tokens, view


@pytest.fixture
def clock() -> Clock:
    return Clock(3_000_000.0)


@pytest.fixture
def sid(cstore: MemoryStore, workspace: Path) -> str:
    session = cstore.create_session(workspace)
    add_turns(cstore, session.id, workspace, 10)
    return session.id


def seqs(events) -> list[int]:
    return [e.seq for e in events]


def twice_compacted(store: MemoryStore, sid: str, workspace: Path) -> tuple[dict, dict]:
    """S1 at seq 21 covering 1..12, then six more turns and S2 at seq 34 (base S1) covering up to seq 25."""
    first = compact(store, sid)
    add_turns(store, sid, workspace, 6, label="later")
    second = compact(store, sid)
    return first, second


def summary_rows(db: Path) -> dict[int, tuple]:
    """Summary event ID -> (base event ID, through_seq, reverted_at), read through a connection of its own."""
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute("SELECT event_id, base_event_id, through_seq, reverted_at FROM summaries").fetchall()
    finally:
        conn.close()
    return {r[0]: r[1:] for r in rows}


# -- revert and redo ------------------------------------------------------------------------------------------


def test_revert_replays_the_raw_prefix_and_redo_the_summary_again_both_verified(
    cstore: MemoryStore, sid: str, workspace: Path, db_path: Path, clock: Clock
) -> None:
    raw, _ = view(cstore, sid)
    done = compact(cstore, sid)
    summary_id, summary_seq = done["summary_event_id"], done["summary_seq"]
    compacted, _ = view(cstore, sid)
    assert compacted[0].id == summary_id

    clock.now += 5
    reverted = cstore.revert_compaction(sid)
    assert (reverted.summary_seq, reverted.summary_event_id, reverted.through_seq) == (summary_seq, summary_id, 12)
    assert reverted.view_summary_seq is None and reverted.cancelled_jobs == ()
    assert view(cstore, sid)[0] == raw  # the raw prefix again, and never the Summary event
    assert summary_rows(db_path)[summary_id] == (None, 12, clock.now)  # still stored, marked reverted
    assert cstore.get_job(cstore.list_jobs(kind=COMPACTION_KIND).jobs[0].id).state == "done"
    with cstore.acquire_lease(sid, workspace) as lease:  # a lease replays the raw view and appends after it
        assert seqs(lease.replay_all()) == seqs(raw)
        lease.append_turn([NewEvent("user", {"text": "after the revert"})])
        lease.release()

    redone = cstore.redo_compaction(sid)
    assert (redone.summary_seq, redone.view_summary_seq) == (summary_seq, summary_seq)
    again, _ = view(cstore, sid)  # verifies the Summary's provenance again
    assert again[0].id == summary_id and seqs(again[1:]) == [*range(13, 21), 22]
    assert summary_rows(db_path)[summary_id][2] is None


def test_reverting_a_chain_steps_back_one_summary_at_a_time_and_redo_steps_forward(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    first, second = twice_compacted(cstore, sid, workspace)
    s1, s2 = first["summary_seq"], second["summary_seq"]
    back = cstore.revert_compaction(sid)
    assert (back.summary_seq, back.view_summary_seq) == (s2, s1)
    shown, _ = view(cstore, sid)
    assert shown[0].seq == s1 and seqs(shown[1:]) == [*range(13, 21), *range(22, 34)]  # S1 and its tail
    assert cstore.revert_compaction(sid).view_summary_seq is None
    assert all(e.kind != "summary" for e in view(cstore, sid)[0])
    assert cstore.redo_compaction(sid).summary_seq == s1  # the most recently reverted that fits the view
    assert cstore.redo_compaction(sid).summary_seq == s2
    final, _ = view(cstore, sid)
    assert final[0].seq == s2 and seqs(final[1:]) == list(range(26, 34))


def test_a_plan_after_a_revert_starts_from_the_summary_in_effect(cstore: MemoryStore, sid: str, workspace: Path):
    first, second = twice_compacted(cstore, sid, workspace)
    cstore.revert_compaction(sid)
    add_turns(cstore, sid, workspace, 4, label="more")
    queued = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert queued.job.source["base_summary_id"] == first["summary_event_id"]
    third = compact(cstore, sid)
    shown, _ = view(cstore, sid)  # the new Summary's chain skips the reverted one and verifies
    assert shown[0].id == third["summary_event_id"]
    assert shown[0].payload["provenance"]["source"]["base_summary_id"] == first["summary_event_id"]
    with pytest.raises(SummaryStateError, match=f"revert Summary {third['summary_seq']} first"):
        cstore.redo_compaction(sid, summary_seq=second["summary_seq"])  # superseded by the newer Summary


def test_the_same_plan_after_a_revert_points_at_redo(cstore: MemoryStore, sid: str) -> None:
    done = compact(cstore, sid)
    cstore.revert_compaction(sid)
    again = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    assert not again.created and f"Summary (seq {done['summary_seq']}) was reverted" in again.reason
    assert f"emelex memory compaction redo {sid}" in again.reason


def test_revert_cancels_pending_compaction_planned_on_the_view_it_changes(cstore: MemoryStore, sid: str, workspace):
    compact(cstore, sid)
    add_turns(cstore, sid, workspace, 8, label="later")
    pending = cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens).job
    reverted = cstore.revert_compaction(sid)
    assert reverted.cancelled_jobs == (pending.id,)
    job = cstore.get_job(pending.id)
    assert job.state == "cancelled" and "reverted" in job.diagnostics[-1].message


# -- refusals change nothing ---------------------------------------------------------------------------------


def test_only_the_newest_summary_in_effect_can_be_reverted(
    cstore: MemoryStore, sid: str, workspace: Path, db_path: Path
) -> None:
    first, second = twice_compacted(cstore, sid, workspace)
    before = table_rows(db_path)
    refusals = [
        ({"summary_seq": first["summary_seq"]},
         f"not the newest Summary in effect; revert Summary {second['summary_seq']}"),
        ({"summary_seq": 3}, "seq 3 of Session .* is not a Summary"),
        ({"summary_seq": 999}, "seq 999 of Session .* is not a Summary"),
    ]
    for kwargs, message in refusals:
        with pytest.raises(SummaryStateError, match=message):
            cstore.revert_compaction(sid, **kwargs)
    with pytest.raises(SummaryStateError, match="no reverted Summary"):
        cstore.redo_compaction(sid)
    with pytest.raises(SummaryStateError, match="is in effect"):
        cstore.redo_compaction(sid, summary_seq=second["summary_seq"])
    for bad in (-1, True, "21"):
        with pytest.raises(InvalidInputError):
            cstore.revert_compaction(sid, summary_seq=bad)
    with pytest.raises(SessionNotFoundError):
        cstore.revert_compaction("no-such-session")
    assert table_rows(db_path) == before
    cstore.revert_compaction(sid)
    with pytest.raises(SummaryStateError, match="already reverted; redo it"):
        cstore.revert_compaction(sid, summary_seq=second["summary_seq"])


def test_a_session_without_a_summary_has_nothing_to_revert(cstore: MemoryStore, sid: str, db_path: Path) -> None:
    before = table_rows(db_path)
    with pytest.raises(SummaryStateError, match="has no Summary in effect"):
        cstore.revert_compaction(sid)
    with pytest.raises(SummaryStateError, match="no reverted Summary"):
        cstore.redo_compaction(sid)
    assert table_rows(db_path) == before


def test_revert_and_redo_are_refused_while_the_session_is_leased_or_its_compaction_is_claimed(
    cstore: MemoryStore, sid: str, workspace: Path, db_path: Path
) -> None:
    compact(cstore, sid)
    lease = cstore.acquire_lease(sid, workspace)
    before = table_rows(db_path)
    for action in (cstore.revert_compaction, cstore.redo_compaction):
        with pytest.raises(SessionBusyError, match="is leased by"):
            action(sid)
    assert table_rows(db_path) == before
    list(lease.replay_all())
    lease.append_turn([NewEvent("user", {"text": "more"})])
    lease.release()
    add_turns(cstore, sid, workspace, 8, label="later")
    cstore.queue_compaction(sid, context_window=WINDOW, count_tokens=tokens)
    claim = cstore.claim_job(COMPACTION_KIND)
    before = table_rows(db_path)
    with pytest.raises(SessionBusyError, match=f"running compaction job {claim.id}"):
        cstore.revert_compaction(sid)
    assert table_rows(db_path) == before
    claim.release()
    assert cstore.revert_compaction(sid).cancelled_jobs == (claim.id,)


def test_redo_re_verifies_the_summary_and_refuses_a_tampered_one(
    cstore: MemoryStore, sid: str, db_path: Path
) -> None:
    compact(cstore, sid)
    cstore.revert_compaction(sid)
    with cstore.db.write() as conn:
        conn.execute("UPDATE events SET payload = replace(payload, 'summary of', 'forged by') WHERE kind = 'summary'")
    before = table_rows(db_path)
    with pytest.raises(SummaryProvenanceError, match="differs from the digest"):
        cstore.redo_compaction(sid)
    assert table_rows(db_path) == before


def test_revert_refuses_a_summary_that_does_not_verify(cstore: MemoryStore, sid: str, db_path: Path) -> None:
    compact(cstore, sid)
    with cstore.db.write() as conn:
        conn.execute("UPDATE events SET payload = replace(payload, 'question', 'questlon') WHERE seq = 3")
    before = table_rows(db_path)
    with pytest.raises(SummaryProvenanceError):
        cstore.revert_compaction(sid)
    assert table_rows(db_path) == before


def test_a_reverted_summary_no_longer_makes_room_for_media(cstore: MemoryStore, workspace: Path, db_path, monkeypatch):
    monkeypatch.setattr(links, "MAX_REPLAY_MEDIA_BYTES", 100)
    session = cstore.create_session(workspace)

    def turn(text: str, byte: int):
        return [NewEvent("user", {"text": text}, assets=(cstore.put_asset(bytes([byte]) * 40, "image/png"),)),
                NewEvent("assistant", {"text": "ok"})]

    with cstore.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn(turn("first", 1))
        lease.append_turn([NewEvent("user", {"text": "kept"})])
        lease.release()
    queued = cstore.queue_compaction(session.id, context_window=WINDOW, force=True,
                                     policy=CompactionPolicy(preserve_turns=1))
    assert queued.job is not None
    assert run_one_job(cstore, compaction_handler(lambda events, job: "a summary")).status == "done"
    with cstore.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn(turn("second", 2))  # 40 bytes in the view; 80 in the Session
        lease.release()
    cstore.revert_compaction(session.id)  # the view refers to 80 bytes again
    with cstore.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        third = turn("third", 3)
        before = table_rows(db_path)
        with pytest.raises(AssetMediaCapError):
            lease.append_turn(third)
        assert table_rows(db_path) == before
        lease.release()
    cstore.redo_compaction(session.id)
    with cstore.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn(turn("third", 3))  # with the Summary in effect, 80 bytes in the view
        lease.release()
    before = table_rows(db_path)
    with pytest.raises(SummaryStateError, match="120 bytes of media, over the 100 byte replay cap"):
        cstore.revert_compaction(session.id)
    assert table_rows(db_path) == before


# -- the raw history ---------------------------------------------------------------------------------------------


def test_raw_events_show_every_stored_event_with_the_summary_covering_it(
    cstore: MemoryStore, sid: str, workspace: Path
) -> None:
    first, second = twice_compacted(cstore, sid, workspace)
    s1, s2 = first["summary_seq"], second["summary_seq"]

    def raw(**kw) -> list:
        out, after = [], 0
        while True:
            page = cstore.raw_events(sid, after, **kw)
            out += page.events
            after = page.next_cursor
            if page.done:
                return out

    events = raw()
    assert seqs(r.event for r in events) == list(range(1, 35))  # everything, Summaries included, in seq order
    covered = {r.event.seq: r.covered_by for r in events if r.event.kind != "summary"}
    assert {q for q, by in covered.items() if by == s1} == set(range(1, 13))
    assert {q for q, by in covered.items() if by == s2} == {*range(13, 21), *range(22, 26)}
    assert {q for q, by in covered.items() if by is None} == set(range(26, 34))  # what replay shows after S2
    info = {r.event.seq: r.summary for r in events if r.summary is not None}
    assert set(info) == {s1, s2}
    assert (info[s1].state, info[s1].replaced_by, info[s1].first_seq, info[s1].through_seq) == (
        "compacted again", s2, 1, 12)
    assert (info[s2].state, info[s2].base_seq, info[s2].first_seq, info[s2].through_seq) == ("in effect", s1, 13, 25)
    assert info[s2].job_id == cstore.list_jobs(kind=COMPACTION_KIND).jobs[0].id
    assert raw(limit=3) == events and raw(max_bytes=cstore.settings.max_event_bytes) == events  # bounded pages

    cstore.revert_compaction(sid)
    after = {r.event.seq: r for r in raw()}
    assert after[s2].summary.state == "reverted" and after[s2].summary.reverted_at is not None
    assert after[s1].summary.state == "in effect" and after[s1].summary.replaced_by is None
    assert {q for q, r in after.items() if r.covered_by is None and r.event.kind != "summary"} == {
        *range(13, 21), *range(22, 34)}


def test_raw_events_refuse_bad_input(cstore: MemoryStore, sid: str) -> None:
    with pytest.raises(InvalidInputError):
        cstore.raw_events(sid, -1)
    with pytest.raises(InvalidInputError):
        cstore.raw_events(sid, limit=0)
    with pytest.raises(SessionNotFoundError):
        cstore.raw_events("no-such-session")
