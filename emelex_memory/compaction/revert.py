"""Reverting and redoing a compaction: the way back from a Summary, keeping the Summary and its provenance.

Nothing is ever deleted. A Summary's provenance record carries `reverted_at`
(migration `m010_summary_reversions`): NULL while it is in effect, the time it
was reverted otherwise. Replay starts from the newest Summary in effect, so
reverting the newest one shows again what it replaced: its base Summary (if
any) and the raw turns after that, or the raw history. Redo clears the mark.

The Summaries in effect always form one chain, each the base of the next:
- only the newest Summary in effect can be reverted (reverting S2, whose base
  is S1, shows S1 and its tail; reverting S1 next shows the raw history);
- a reverted Summary can be redone only while its base is the newest Summary
  in effect (or, for a Session's first Summary, while none is), so after
  reverting S2 and compacting anew into S3 (base S1), S2 comes back only once
  S3 is reverted; without a seq, redo picks the most recently reverted
  Summary that fits.
Replay's verification checks that chain (each Summary's base is the previous
Summary in effect), so an altered `reverted_at` that breaks it is refused, not
followed.

Each is one `BEGIN IMMEDIATE` transaction that refuses (changing nothing) while
the Session is leased or a worker holds a live claim on one of its compaction
jobs, verifies the Summary replay will start from (redo re-verifies the one it
restores), refuses a revert that would take the replay view over the media
cap, and cancels the Session's other compaction jobs still queued: they were
planned on the view it changes and could only fail.

Redo continues a compaction in steps as the original run did: when the job
that produced the restored Summary had queued the next step (its result's
`next_job`) and reverting cancelled that step, redo sets it pending again in
the same transaction (its source is bound to the restored Summary, so it
matches again), and the chain runs on to its goal.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from ..assets import links as assets_links
from .planning import COMPACTION_KIND
from ..core.cursors import check_position
from ..maintenance.deletion import check_not_busy
from ..core.database import Database
from ..queue.service import JobQueue
from ..sessions.rows import session_rowid
from ..errors import SummaryStateError
from ..queue.jobs import decode_diagnostics
from ..sessions.replay import check_recorded, newest_summary, verify_summary
from ..sessions.transcript import session_head


REVERTED_NOTE = "cancelled: the Summary it was planned on was reverted or restored; plan compaction again"
_AT_SEQ = (  # the event at a seq and, for a Summary, its record
    "SELECT e.id, e.kind, s.event_id, s.base_event_id, s.through_seq, s.reverted_at FROM events e "
    "LEFT JOIN summaries s ON s.event_id = e.id WHERE e.session_id = ? AND e.seq = ?"
)
_LAST_REVERTED = (  # the most recently reverted Summary whose base is ?2 (NULL: a Session's first)
    "SELECT event_id FROM summaries WHERE session_id = ?1 AND reverted_at IS NOT NULL AND base_event_id IS ?2 "
    "ORDER BY reverted_at DESC, event_id DESC LIMIT 1"
)


@dataclass(frozen=True)
class CompactionReversal:
    """What `revert_compaction` or `redo_compaction` did: the Summary reverted or restored (its seq, event ID and
    the newest raw seq it covers), the Summary replay now starts from (its seq; None: the raw history), the
    queued compaction jobs it cancelled and, for a redo, the next step of a compaction in steps it queued again."""

    session_id: str
    summary_seq: int
    summary_event_id: int
    through_seq: int
    view_summary_seq: int | None
    cancelled_jobs: tuple[str, ...]
    requeued_jobs: tuple[str, ...] = ()


class CompactionRevert:
    """`MemoryStore.revert_compaction` and `MemoryStore.redo_compaction`."""

    def __init__(self, db: Database, jobs: JobQueue) -> None:
        """Serve `db`, queueing and cancelling through `jobs`."""
        self._db = db
        self._jobs = jobs

    def revert_compaction(self, session_id: str, summary_seq: int | None = None) -> CompactionReversal:
        """Revert the Session's newest Summary in effect (`summary_seq` must name it, when given), in one transaction:
        replay then shows what it replaced again; the Summary stays stored with its provenance, marked reverted.

        Raises `SummaryStateError` when there is none, or `summary_seq` names
        another event or Summary, or the view would refer to more media than a
        replay may; `SessionBusyError` while the Session is leased or a worker
        runs one of its compaction jobs; `SummaryProvenanceError` when the
        Summary, or the one replay would start from, does not verify. Nothing
        is changed then.
        """
        if summary_seq is not None:
            check_position(summary_seq, "summary_seq")
        with self._db.write() as conn:
            rowid = session_rowid(conn, session_id)
            now = self._db.clock()
            check_not_busy(conn, rowid, session_id, now, kind=COMPACTION_KIND, unchanged="nothing was reverted")
            newest = newest_summary(conn, rowid)
            if summary_seq is not None:
                target = _summary_at(conn, rowid, session_id, summary_seq)
                if target[4] is not None:
                    raise SummaryStateError(f"Summary {summary_seq} of Session {session_id} is already reverted; redo "
                                            f"it with `emelex memory compaction redo {session_id}`")
                if newest is not None and target[0] != newest[0]:
                    raise SummaryStateError(
                        f"Summary {summary_seq} of Session {session_id} is not the newest Summary in effect; revert "
                        f"Summary {_seq(conn, newest[0])} first"
                    )
            if newest is None:
                raise SummaryStateError(f"Session {session_id} has no Summary in effect; nothing to revert")
            event_id, through = newest
            check_recorded(conn, rowid)
            verify_summary(conn, rowid, event_id)
            cancelled = self._cancel_queued_compactions(conn, rowid)
            conn.execute("UPDATE summaries SET reverted_at = ? WHERE event_id = ?", (now, event_id))
            restored = newest_summary(conn, rowid)
            if restored is not None:
                verify_summary(conn, rowid, restored[0])
            seq = _seq(conn, event_id)
            media = assets_links.view_media(conn, rowid, session_head(conn, rowid)[3])
            if media > assets_links.replay_media_cap():
                raise SummaryStateError(
                    f"reverting Summary {seq} would make the replay of Session {session_id} refer to {media} bytes of "
                    f"media, over the {assets_links.replay_media_cap()} byte replay cap; nothing was reverted"
                )
            view = None if restored is None else _seq(conn, restored[0])
            return CompactionReversal(session_id, seq, event_id, through, view, cancelled)

    def redo_compaction(self, session_id: str, summary_seq: int | None = None) -> CompactionReversal:
        """Put a reverted Summary back in effect, in one transaction, after re-verifying it: replay starts from it
        again. Without `summary_seq`, the most recently reverted Summary whose base is the newest Summary in effect
        (or none); with it, that Summary, whose base must be. The next step of a compaction in steps that
        reverting the Summary cancelled is pending again (`requeued_jobs`).

        Raises `SummaryStateError` when there is no such Summary or its base is
        not where replay now starts (the message says what to revert or redo
        first); `SessionBusyError` while the Session is leased or a worker runs
        one of its compaction jobs; `SummaryProvenanceError` when it does not
        verify. Nothing is changed then.
        """
        if summary_seq is not None:
            check_position(summary_seq, "summary_seq")
        with self._db.write() as conn:
            rowid = session_rowid(conn, session_id)
            check_not_busy(conn, rowid, session_id, self._db.clock(), kind=COMPACTION_KIND, unchanged="nothing was redone")
            newest = newest_summary(conn, rowid)
            start = None if newest is None else newest[0]
            if summary_seq is None:
                row = conn.execute(_LAST_REVERTED, (rowid, start)).fetchone()
                if row is None:
                    after = "the raw history" if start is None else f"Summary {_seq(conn, start)}"
                    raise SummaryStateError(f"Session {session_id} has no reverted Summary that follows {after}, where "
                                            "replay now starts; nothing to redo")
                event_id = row[0]
            else:
                event_id, _, base, _, reverted = _summary_at(conn, rowid, session_id, summary_seq)
                if reverted is None:
                    raise SummaryStateError(
                        f"Summary {summary_seq} of Session {session_id} is in effect; nothing to redo"
                    )
                if base != start:
                    raise SummaryStateError(_not_next(conn, session_id, summary_seq, base, start))
            cancelled = self._cancel_queued_compactions(conn, rowid)
            conn.execute("UPDATE summaries SET reverted_at = NULL WHERE event_id = ?", (event_id,))
            check_recorded(conn, rowid)
            verify_summary(conn, rowid, event_id)
            seq = _seq(conn, event_id)
            through = conn.execute("SELECT through_seq FROM summaries WHERE event_id = ?", (event_id,)).fetchone()[0]
            requeued = self._requeue_next_step(conn, event_id)
            return CompactionReversal(session_id, seq, event_id, through, seq, cancelled, requeued)

    def _requeue_next_step(self, conn: apsw.Connection, event_id: int) -> tuple[str, ...]:
        """Inside redo's transaction: set pending again the next step the job of Summary `event_id` queued, when a
        revert cancelled it (the cancellation is its newest diagnostic); return its ID, if so."""
        row = conn.execute(
            "SELECT n.uuid, n.diagnostics FROM summaries s JOIN jobs j ON j.id = s.job_id "
            "JOIN jobs n ON n.uuid = json_extract(j.result, '$.next_job') "
            "WHERE s.event_id = ? AND n.session_id = j.session_id AND n.state = 'cancelled'",
            (event_id,),
        ).fetchone()
        last = decode_diagnostics(row[1])[-1:] if row else ()
        if not last or last[0].message != REVERTED_NOTE:
            return ()
        return (self._jobs.retry_failed_job(row[0]).id,)

    def _cancel_queued_compactions(self, conn: apsw.Connection, rowid: int) -> tuple[str, ...]:
        """Inside the transaction: cancel the Session's pending compaction jobs and claims whose worker lease expired
        (live claims were refused before); return their IDs."""
        rows = conn.execute(
            "SELECT uuid FROM jobs WHERE session_id = ? AND kind = ? AND state IN ('pending', 'claimed') ORDER BY id",
            (rowid, COMPACTION_KIND),
        ).fetchall()
        return tuple(self._jobs.cancel_job(uuid, reason=REVERTED_NOTE).id for (uuid,) in rows)


def _summary_at(conn: apsw.Connection, rowid: int, session_id: str, seq: int) -> tuple:
    """(event ID, Summary event ID, base event ID, through seq, reverted_at) of the Summary at `seq`;
    `SummaryStateError` when no Summary with a record is there."""
    row = conn.execute(_AT_SEQ, (rowid, seq)).fetchone()
    if row is None or row[1] != "summary" or row[2] is None:
        raise SummaryStateError(f"seq {seq} of Session {session_id} is not a Summary; `emelex memory sessions show "
                                f"{session_id} --raw` shows which events are")
    return row[0], row[2], row[3], row[4], row[5]


def _seq(conn: apsw.Connection, event_id: int) -> int:
    return conn.execute("SELECT seq FROM events WHERE id = ?", (event_id,)).fetchone()[0]


def _not_next(conn: apsw.Connection, session_id: str, seq: int, base: int | None, start: int | None) -> str:
    """Why the Summary at `seq` (compacted from `base`) cannot come back while replay starts from `start`."""
    where = "the raw history" if start is None else f"Summary {_seq(conn, start)}"
    source = "the raw history" if base is None else f"Summary {_seq(conn, base)}"
    reverted_base = base is not None and conn.execute(
        "SELECT reverted_at IS NOT NULL FROM summaries WHERE event_id = ?", (base,)
    ).fetchone()[0]
    fix = f"redo Summary {_seq(conn, base)} first" if reverted_base else f"revert Summary {_seq(conn, start)} first"
    return f"Summary {seq} of Session {session_id} compacted {source}, but replay now starts from {where}: {fix}"
