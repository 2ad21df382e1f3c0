"""The replay view of a Session, what `MemoryStore.replay` and `SessionLease.replay` read: its newest verified
Summary first, then the events that Summary does not cover.

Replay view of a Session whose newest Summary in effect S covers raw seqs up
to K: S first (after its provenance verifies), then every non-Summary event
with seq > K, by seq. The raw prefix S replaced, older Summaries and reverted
ones (see `compaction/revert.py`) are never shown; with every Summary reverted
the view is the raw history. Every page first checks that the Session's newest
Summary event and its newest provenance record, reverted or not, are the same
Summary, and the page that shows S (or
any page meeting a Summary event) checks that every Summary event has its
record: a Summary without provenance raises `SummaryProvenanceError`, it is
never skipped and replay never falls back to an older Summary. Page cursors
stay raw seqs: the page holding S continues from K, and skipped Summary rows
still advance the cursor, so paging to the end reaches the Session's last seq
and a lease can append afterwards. Sessions without a Summary pay one indexed
probe per page and read through `read_page` as before; so do Sessions whose
newest Summary is in effect, while a reverted newest Summary costs one more
probe of the Summaries in effect.

A Summary is an ordinary transcript row of kind "summary", appended at the end
of the Session by a compaction job's completion (`compaction/summaries.py`). A
`summaries` row records its provenance: the job, the source prefix it replaces
(base Summary, event count, first/last event IDs, newest covered raw seq) and
the digests of that source and of the Summary's own payload (`prefix_digest.py`);
verifying a Summary recomputes them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import apsw

from ..core.cursors import check_position
from ..core.database import Database, read_in_snapshot
from ..errors import SourceTooLargeError, SummaryProvenanceError
from .prefix_digest import MAX_COVERED_BYTES, SourceFacts, digest_prefix, summary_digest
from .rows import session_rowid
from .transcript import SUMMARY_KIND, Event, ReplayPage, media_of, read_page


SOURCE_FIELDS = ("base_summary_id", "count", "digest", "first_event_id", "last_event_id", "through_seq")


_BOUNDARY = (  # the newest Summary event, and the newest provenance record (covered seq, reverted): the same Summary
    "SELECT (SELECT id FROM events WHERE session_id = ?1 AND kind = 'summary' ORDER BY seq DESC LIMIT 1), "
    "r.event_id, r.through_seq, r.reverted_at FROM (SELECT 1) LEFT JOIN (SELECT event_id, through_seq, reverted_at "
    "FROM summaries WHERE session_id = ?1 ORDER BY event_id DESC LIMIT 1) r"
)


_IN_EFFECT = (
    "SELECT event_id, through_seq FROM summaries WHERE session_id = ? AND reverted_at IS NULL "
    "ORDER BY event_id DESC LIMIT 1"
)


_UNRECORDED = (  # a Summary event without its record, or a record whose event is not a Summary of the Session
    "SELECT e.id FROM events e WHERE e.session_id = ?1 AND e.kind = 'summary' AND NOT EXISTS "
    "(SELECT 1 FROM summaries s WHERE s.event_id = e.id AND s.session_id = ?1) "
    "UNION ALL SELECT s.event_id FROM summaries s JOIN events e ON e.id = s.event_id WHERE s.session_id = ?1 "
    "AND (e.kind != 'summary' OR e.session_id != ?1) LIMIT 1"
)


_RECORD = (
    "SELECT s.base_event_id, s.through_seq, s.source_count, s.first_event_id, s.last_event_id, "
    "s.source_digest, s.summary_digest, s.model_ref, e.session_id, e.kind, e.payload, j.uuid, j.kind, "
    "j.state, j.result, j.session_id FROM summaries s JOIN events e ON e.id = s.event_id "
    "JOIN jobs j ON j.id = s.job_id WHERE s.event_id = ?"
)


def _unverified(event_id: int, what: str) -> SummaryProvenanceError:
    return SummaryProvenanceError(
        f"Summary event {event_id} does not verify: {what}; the history may have been tampered with, "
        "restore the database from a backup"
    )


def view_boundary(conn: apsw.Connection, session_rowid: int) -> tuple[bool, tuple[int, int] | None]:
    """(whether the Session has any Summary, (event ID, covered-through seq) of its newest Summary in effect or None).

    Raises `SummaryProvenanceError` when the newest Summary event and the
    newest provenance record are not the same Summary (a record was deleted,
    or an event of kind "summary" has none).
    """
    event_id, recorded, through, reverted_at = conn.execute(_BOUNDARY, (session_rowid,)).fetchone()
    if event_id != recorded:
        if event_id is None or (recorded is not None and recorded > event_id):
            raise _unverified(recorded, "its provenance record has no Summary event")
        raise _unverified(event_id, "its provenance record is missing")
    if event_id is None:
        return False, None
    return True, (event_id, through) if reverted_at is None else in_effect(conn, session_rowid)


def newest_summary(conn: apsw.Connection, session_rowid: int) -> tuple[int, int] | None:
    """(event ID, covered-through seq) of the Session's newest Summary in effect, or None when it has none (no
    Summary, or every one reverted). Raises `SummaryProvenanceError` as `view_boundary` does."""
    return view_boundary(conn, session_rowid)[1]


def in_effect(conn: apsw.Connection, session_rowid: int) -> tuple[int, int] | None:
    """(event ID, covered-through seq) of the newest Summary in effect by its record alone, unchecked; None if none."""
    return conn.execute(_IN_EFFECT, (session_rowid,)).fetchone()


def check_recorded(conn: apsw.Connection, session_rowid: int) -> None:
    """Raise `SummaryProvenanceError` unless every Summary event of the Session has its provenance record and
    every record belongs to a Summary event of the Session; reads one row per Summary at most."""
    row = conn.execute(_UNRECORDED, (session_rowid,)).fetchone()
    if row is not None:
        raise _unverified(row[0], "it has no provenance record, or its record belongs to another event")


def through_seq_of(conn: apsw.Connection, session_rowid: int, summary_event_id: int | None) -> int | None:
    """The newest raw seq a Summary covers (0 for no Summary); None when there is no such Summary in the Session."""
    if summary_event_id is None:
        return 0
    row = conn.execute(
        "SELECT through_seq FROM summaries WHERE event_id = ? AND session_id = ?", (summary_event_id, session_rowid)
    ).fetchone()
    return None if row is None else row[0]


def source_matches(facts: SourceFacts, source: Mapping[str, Any]) -> bool:
    """True when recomputed source facts equal a recorded source description."""
    return (facts.count, facts.first_event_id, facts.last_event_id, facts.digest) == (
        source["count"], source["first_event_id"], source["last_event_id"], source["digest"]
    )


def provenance(job_id: str, source: Mapping[str, Any], model_ref: str | None) -> dict[str, Any]:
    """The provenance a Summary event carries: job ID, exact source prefix and digest, model snapshot reference."""
    return {"job": job_id, "model": model_ref, "source": {k: source[k] for k in SOURCE_FIELDS}}


def verify_summary(conn: apsw.Connection, session_rowid: int, event_id: int) -> None:
    """Verify one Summary's provenance; raise `SummaryProvenanceError` saying what does not verify.

    Checks the Summary payload against its digest, the provenance in the
    payload against the record, the producing job (done, same Session,
    pointing at this event), the chain to the previous Summary in effect
    (reverted ones are skipped: it must be the base), and the
    source prefix's count, first/last IDs and digest recomputed from the
    events themselves, reading at most `MAX_COVERED_BYTES` of them.
    """

    def bad(what: str) -> SummaryProvenanceError:
        return _unverified(event_id, what)

    row = conn.execute(_RECORD, (event_id,)).fetchone()
    if row is None:
        raise bad("its provenance record or compaction job is missing")
    (base, through, count, first, last, src_digest, sum_digest, model_ref, ev_session, ev_kind, payload, job_uuid,
     job_kind, job_state, job_result, job_session) = row
    if ev_session != session_rowid or job_session != session_rowid or ev_kind != SUMMARY_KIND:
        raise bad("it does not belong to this Session")
    if summary_digest(payload.encode("utf-8")) != sum_digest:
        raise bad("its content differs from the digest recorded when it was written")
    source = {"base_summary_id": base, "count": count, "digest": src_digest.hex(), "first_event_id": first,
              "last_event_id": last, "through_seq": through}
    try:
        document = json.loads(payload)
        recorded = document["provenance"]
        text_ok = isinstance(document["text"], str)
    except (ValueError, TypeError, KeyError):
        raise bad("its payload is not a Summary document") from None
    if recorded != provenance(job_uuid, source, model_ref) or not text_ok:
        raise bad("its provenance differs from the recorded one")
    produced = json.loads(job_result or "{}").get("summary_event_id")
    if job_kind != "compaction" or job_state != "done" or produced != event_id:
        raise bad(f"compaction job {job_uuid} did not produce it")
    previous = conn.execute(
        "SELECT event_id FROM summaries WHERE session_id = ? AND reverted_at IS NULL AND event_id < ? "
        "ORDER BY event_id DESC LIMIT 1",
        (session_rowid, event_id),
    ).fetchone()
    if (previous[0] if previous else None) != base:
        raise bad("the Summary it compacted again is not the previous Summary in effect")
    base_through = through_seq_of(conn, session_rowid, base)
    if base_through is None or base_through >= through:
        raise bad("its base Summary's record is missing or covers more than it does")
    try:
        facts = digest_prefix(conn, session_rowid, base, base_through, through, max_bytes=MAX_COVERED_BYTES)
    except SourceTooLargeError:
        raise bad(f"its source holds more than the {MAX_COVERED_BYTES} bytes a Summary may cover") from None
    if not source_matches(facts, source):
        raise bad("the source events it replaced no longer match the recorded digest")


def summary_event_page(conn: apsw.Connection, session_rowid: int, event_id: int, max_bytes: int) -> ReplayPage:
    seq = conn.execute("SELECT seq FROM events WHERE id = ?", (event_id,)).fetchone()[0]
    return read_page(conn, session_rowid, seq - 1, 1, max_bytes)


def read_view_page(conn: apsw.Connection, session_rowid: int, after_seq: int, limit: int, max_bytes: int) -> ReplayPage:
    """One page of the Session's replay view after raw seq `after_seq`, bounded by `limit` items and `max_bytes`.

    `max_bytes` must be at least the per-event cap. Raises
    `SummaryProvenanceError` when the newest Summary event and record
    disagree, when the page would show the newest Summary and it does not
    verify, or when a Summary event it meets has no provenance record.
    """
    return read_in_snapshot(conn, _view_page, session_rowid, after_seq, limit, max_bytes)


def _view_page(conn: apsw.Connection, session_rowid: int, after_seq: int, limit: int, max_bytes: int) -> ReplayPage:
    any_summary, newest = view_boundary(conn, session_rowid)
    if not any_summary:
        return read_page(conn, session_rowid, after_seq, limit, max_bytes)
    event_id, through = newest or (None, 0)
    head = []
    if after_seq < through:
        check_recorded(conn, session_rowid)
        verify_summary(conn, session_rowid, event_id)
        head = summary_event_page(conn, session_rowid, event_id, max_bytes).events
        limit, max_bytes, after_seq = limit - 1, max_bytes - head[0].size, through
    page = read_page(conn, session_rowid, after_seq, limit, max_bytes, partial=bool(head))
    tail = [e for e in page.events if e.kind != SUMMARY_KIND]
    if not head and len(tail) != len(page.events):
        check_recorded(conn, session_rowid)
    return with_events(page, head + tail)


def with_events(page: ReplayPage, events: list[Event]) -> ReplayPage:
    """`page` holding `events` instead (a subset of its own, plus a Summary), with their media counted."""
    media = media_of(events) if page.media_bytes or (events and events[0].asset_refs) else 0
    return dataclasses.replace(page, events=events, media_bytes=media)


def replay_page(
    db: Database, session: int | str, after_seq: int, limit: int | None, max_bytes: int | None
) -> ReplayPage:
    """A page of the replay view after `after_seq` of a Session given by its rowid (a lease's) or its public ID,
    bounded in items and bytes (`max_bytes` at least the per-event cap, so every page makes progress)."""
    limit, max_bytes = db.page_limits(limit, max_bytes, min_bytes=db.settings.max_event_bytes)
    check_position(after_seq, "after_seq")
    with db.read() as conn:
        rowid = session if type(session) is int else session_rowid(conn, session)  # type: ignore[arg-type]
        return read_view_page(conn, rowid, after_seq, limit, max_bytes)
