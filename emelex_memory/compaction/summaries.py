"""Summary events: appending them, with provenance, at a compaction job's completion.

A Summary is an ordinary transcript row of kind "summary", appended at the end
of the Session (next seq, its own turn) by a compaction job's completion. A
`summaries` row records its provenance: the job, the source prefix it replaces
(base Summary, event count, first/last event IDs, newest covered raw seq) and
the digests of that source and of the Summary's own payload. Replay verifies
them and shows the Summary first (`sessions/replay.py`); a job reads its source
prefix here (`read_source_page`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import apsw

from ..core.database import read_in_snapshot
from ..core.jsonbound import encode_canonical
from ..errors import InvalidJobSourceError, SourceChangedError
from ..queue.jobs import CompletionContext
from ..sessions.prefix_digest import MAX_COVERED_BYTES, digest_prefix, summary_digest
from ..sessions.replay import (
    summary_event_page,
    with_events,
    newest_summary,
    provenance,
    source_matches,
    through_seq_of,
)
from ..sessions.transcript import SUMMARY_KIND, EncodedEvent, ReplayPage, read_page, session_head
from ..sessions.writing import Head, insert_turn


# The kinds that open a store turn continuing the agent turn before it: a tool batch the request caused, the
# answer that closes it, or its failure record. A compaction boundary never falls before one of them.
CONTINUATION_KINDS = frozenset({"tool_calls", "assistant", "turn_failed"})


def summary_payload(job_id: str, source: Mapping[str, Any], model_ref: str | None, text: str, max_bytes: int) -> bytes:
    """The canonical payload bytes of the Summary event a compaction job writes: its provenance and `text`.

    Raises `JsonTooLargeError` past `max_bytes` (the per-event cap).
    """
    return encode_canonical(
        {"provenance": provenance(job_id, source, model_ref), "text": text},
        max_bytes=max_bytes, max_depth=8, what="the Summary",
    )


def append_summary(ctx: CompletionContext, text: str, model_ref: str | None) -> dict[str, Any]:
    """Re-check the job's boundary, turns and source bytes, then append the Summary event and its provenance record.

    `ctx.job.source` must have a valid compaction source shape (see
    `compaction.validate_compaction_source`). Raises `SourceChangedError`
    when another Summary was committed since the job was planned or the
    source prefix no longer matches its digest, `InvalidJobSourceError` when
    the source does not end on a turn boundary or covers turns the plan had to
    preserve, and `SourceTooLargeError` past `MAX_COVERED_BYTES`; the caller's
    transaction then rolls back and nothing is written.
    """
    conn, rowid, source = ctx.conn, ctx.session_rowid, ctx.job.source
    newest = newest_summary(conn, rowid)
    base = source["base_summary_id"]
    if (newest[0] if newest else None) != base:
        raise SourceChangedError(
            f"compaction job {ctx.job.id} was planned on a Summary boundary that has changed; plan compaction again"
        )
    base_through = newest[1] if newest else 0
    facts = digest_prefix(conn, rowid, base, base_through, source["through_seq"], max_bytes=MAX_COVERED_BYTES)
    if not source_matches(facts, source):
        raise SourceChangedError(
            f"the source of compaction job {ctx.job.id} no longer matches its digest; plan compaction again"
        )
    check_replaceable(conn, rowid, ctx.job.id, source, base_through)
    payload = summary_payload(ctx.job.id, source, model_ref, text, ctx.store.settings.max_event_bytes)
    summary = EncodedEvent(SUMMARY_KIND, payload.decode("utf-8"), len(payload))
    head = insert_turn(conn, rowid, (summary,), Head(*session_head(conn, rowid)), ctx.now)  # the Session's next turn
    event_id = conn.last_insert_rowid()
    conn.execute(
        "INSERT INTO summaries (event_id, session_id, job_id, base_event_id, through_seq, source_count, "
        "first_event_id, last_event_id, source_digest, summary_digest, model_ref, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (event_id, rowid, ctx.job_rowid, base, source["through_seq"], facts.count, facts.first_event_id,
         facts.last_event_id, bytes.fromhex(facts.digest), summary_digest(payload), model_ref, ctx.now),
    )
    return {"summary_event_id": event_id, "summary_seq": head.seq}


def check_replaceable(
    conn: apsw.Connection, session_rowid: int, job_id: str, source: Mapping[str, Any], base_through: int
) -> None:
    """Raise `InvalidJobSourceError` unless the source ends on the last event of an agent turn (the next event
    opens no `CONTINUATION_KINDS` turn) after the base Summary's range, holds at least one raw event, and leaves at least `preserve_turns` raw turns uncovered."""
    through = source["through_seq"]

    def refuse(why: str) -> InvalidJobSourceError:
        return InvalidJobSourceError(
            f"compaction job {job_id} {why}; nothing was written: queue compaction with queue_compaction"
        )

    if through <= base_through or source["count"] <= (0 if source["base_summary_id"] is None else 1):
        raise refuse("covers no event after its base Summary")
    end = conn.execute(
        "SELECT e.id, e.turn, n.turn, n.kind FROM events e LEFT JOIN events n ON n.session_id = e.session_id "
        "AND n.seq = e.seq + 1 WHERE e.session_id = ? AND e.seq = ?",
        (session_rowid, through),
    ).fetchone()
    if end is None or end[0] != source["last_event_id"]:
        raise refuse(f"ends at seq {through}, which is not the last event of its source")
    if end[1] == end[2]:
        raise refuse(f"ends at seq {through}, in the middle of turn {end[1]}")
    if end[3] in CONTINUATION_KINDS:
        raise refuse(f"ends at seq {through}, inside an agent turn (a {end[3]} event continues it)")
    kept = conn.execute(
        "SELECT count(*) FROM (SELECT DISTINCT turn FROM events WHERE session_id = ? AND seq > ? "
        f"AND kind != '{SUMMARY_KIND}' LIMIT ?)",
        (session_rowid, through, source["preserve_turns"]),
    ).fetchone()[0]
    if kept < source["preserve_turns"]:
        raise refuse(f"leaves {kept} turns uncompacted, fewer than the {source['preserve_turns']} its plan preserves")


def read_source_page(
    conn: apsw.Connection, session_rowid: int, source: Mapping[str, Any], after_seq: int, limit: int, max_bytes: int
) -> ReplayPage:
    """One page of a compaction job's source prefix in replay order (base Summary first), cursor as in replay.

    Raises `SourceChangedError` when the job's base Summary no longer exists.
    """
    return read_in_snapshot(conn, source_page, session_rowid, source, after_seq, limit, max_bytes)


def source_page(
    conn: apsw.Connection, session_rowid: int, source: Mapping[str, Any], after_seq: int, limit: int, max_bytes: int
) -> ReplayPage:
    """`read_source_page` inside the caller's read transaction."""
    base, through = source["base_summary_id"], source["through_seq"]
    base_through = through_seq_of(conn, session_rowid, base)
    if base_through is None:
        raise SourceChangedError(f"the base Summary {base} of this compaction source is gone; plan compaction again")
    head = []
    if base is not None and after_seq < base_through:
        head = summary_event_page(conn, session_rowid, base, max_bytes).events
        limit, max_bytes = limit - 1, max_bytes - head[0].size
    start = max(after_seq, base_through)
    page = read_page(conn, session_rowid, start, limit, max_bytes, partial=bool(head))
    within = [e for e in page.events if e.seq <= through]
    next_cursor = within[-1].seq if within else start
    done = page.done or len(within) < len(page.events) or next_cursor >= through
    events = head + [e for e in within if e.kind != SUMMARY_KIND]
    return dataclasses.replace(with_events(page, events), next_cursor=next_cursor, done=done)