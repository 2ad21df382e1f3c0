"""The raw history of a Session: every stored event, including those a Summary replaced, with what covers each.

Replay shows the view (the newest Summary in effect and what follows it);
`MemoryStore.raw_events` pages through everything that is stored, in seq
order, bounded like replay, and says for each ordinary event which Summary in
effect replaced it (its seq; None when replay shows the event), and for each
Summary event its record: the raw seq range it covers, its base Summary, the
job and model that wrote it, and its state ("in effect": replay starts from it;
"compacted again": a newer Summary in effect replaced it, `replaced_by`;
"reverted"). It reads what is there without verifying provenance (replay
does), so it also shows a history that no longer verifies; a Summary event
without a record has `summary=None`.

The Summaries in effect form a chain whose covered ranges follow each other,
so an event at seq q is covered by the first Summary in effect covering seq q
or later; one page reads at most one such Summary per event it holds, through
the `summaries_in_effect_by_seq` index.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from ..core.cursors import check_position
from ..core.database import read_in_snapshot
from ..sessions.replay import in_effect
from ..sessions.transcript import SUMMARY_KIND, Event, read_page

from ..core.database import Database
from ..sessions.rows import session_rowid

_COVERING = (  # the Summaries in effect covering seq ?2 or later, by covered seq: (Summary seq, covered-through seq)
    "SELECT e.seq, s.through_seq FROM summaries s JOIN events e ON e.id = s.event_id "
    "WHERE s.session_id = ?1 AND s.reverted_at IS NULL AND s.through_seq >= ?2 ORDER BY s.through_seq LIMIT ?3"
)
_RECORD = (
    "SELECT b.seq, bs.through_seq, s.through_seq, s.source_count, j.uuid, s.model_ref, s.reverted_at "
    "FROM summaries s JOIN jobs j ON j.id = s.job_id LEFT JOIN events b ON b.id = s.base_event_id "
    "LEFT JOIN summaries bs ON bs.event_id = s.base_event_id WHERE s.event_id = ? AND s.session_id = ?"
)


@dataclass(frozen=True)
class SummaryRecord:
    """What the raw history says about one Summary event: its state ("in effect", "compacted again" or
    "reverted"), the raw seqs `first_seq..through_seq` its own source covered (older ones through its base, the
    Summary at `base_seq`), the events of that source, the job and model that wrote it, when it was reverted, and
    the seq of the Summary in effect that compacted it again."""

    state: str
    first_seq: int
    through_seq: int
    base_seq: int | None
    source_events: int
    job_id: str
    model_ref: str | None
    reverted_at: float | None
    replaced_by: int | None


@dataclass(frozen=True)
class RawEvent:
    """One stored event of the raw history: the event, the seq of the Summary in effect that replaced it (None when
    replay shows it, and for Summary events), and for a Summary event its `SummaryRecord`."""

    event: Event
    covered_by: int | None
    summary: SummaryRecord | None


@dataclass(frozen=True)
class RawPage:
    """A page of the raw history; `next_cursor` and `done` as for a `ReplayPage`."""

    events: list[RawEvent]
    next_cursor: int
    done: bool
    media_bytes: int = 0


def read_raw_page(conn: apsw.Connection, session_rowid: int, after_seq: int, limit: int, max_bytes: int) -> RawPage:
    """One page of every stored event after `after_seq`, bounded like a replay page, each with what covers it."""
    return read_in_snapshot(conn, _raw_page, session_rowid, after_seq, limit, max_bytes)


def _raw_page(conn: apsw.Connection, session_rowid: int, after_seq: int, limit: int, max_bytes: int) -> RawPage:
    page = read_page(conn, session_rowid, after_seq, limit, max_bytes)
    ordinary = [e for e in page.events if e.kind != SUMMARY_KIND]
    covering = conn.execute(
        _COVERING, (session_rowid, ordinary[0].seq, len(ordinary) + 1)
    ).fetchall() if ordinary else []
    newest = in_effect(conn, session_rowid)
    out, i = [], 0
    for event in page.events:
        if event.kind == SUMMARY_KIND:
            out.append(RawEvent(event, None, _record(conn, session_rowid, event, newest)))
            continue
        while i < len(covering) and covering[i][1] < event.seq:
            i += 1
        out.append(RawEvent(event, covering[i][0] if i < len(covering) else None, None))
    return RawPage(out, page.next_cursor, page.done, page.media_bytes)


def _record(
    conn: apsw.Connection, session_rowid: int, event: Event, newest: tuple[int, int] | None
) -> SummaryRecord | None:
    row = conn.execute(_RECORD, (event.id, session_rowid)).fetchone()
    if row is None:
        return None
    base_seq, base_through, through, count, job_id, model_ref, reverted_at = row
    replaced_by = None
    if reverted_at is not None:
        state = "reverted"
    elif newest is not None and newest[0] == event.id:
        state = "in effect"
    else:
        state = "compacted again"
        later = conn.execute(_COVERING, (session_rowid, through + 1, 1)).fetchone()
        replaced_by = later[0] if later else None
    return SummaryRecord(state, (base_through or 0) + 1, through, base_seq, count, job_id, model_ref, reverted_at,
                         replaced_by)


class RawHistory:
    """`MemoryStore.raw_events`."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    def raw_events(
        self, session_id: str, after_seq: int = 0, *, limit: int | None = None,
        max_bytes: int | None = None,
    ) -> RawPage:
        """One page of every stored event of a Session after `after_seq`, in seq order, including the events a Summary
        replaced and Summary events themselves, each with what covers it (see the module docstring).

        Bounded in items and bytes like `replay` (`max_bytes` at least the
        per-event cap); read-only, and it verifies no provenance.
        """
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=self._db.settings.max_event_bytes)
        check_position(after_seq, "after_seq")
        with self._db.read() as conn:
            rowid = session_rowid(conn, session_id)
            return read_raw_page(conn, rowid, after_seq, limit, max_bytes)
