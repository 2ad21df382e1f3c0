"""The one writer of the `events` table: a turn's rows, each with its seq, turn, position, running byte total and
media total, inserted by one statement.

`insert_turn` writes a turn after a head the caller read and checked in its own transaction (a lease's append
after its full check, a compaction job's Summary at its completion). `insert_checked_turn` is a lease's common case:
one `INSERT` that carries the lease's whole re-check and inserts only when it holds. The interchange writes rows
whose every column its source decided: an imported history's runs (`insert_rows`, keeping the source's turns) and
an export's events read back (`insert_restored`, keeping their IDs where free). A turn is written by one
statement, not one per event, because FTS5 flushes its pending terms into a new index segment at every statement
that writes it (the search index's triggers), so a turn written event by event costs a segment per event.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import apsw

from .holders import live_lease, open_journal
from .transcript import EncodedEvent

_INSERT_SQL = (
    "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, media_end, created_at) VALUES "
)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


class Head(NamedTuple):
    """A Session's newest event as a writer continues from it: its seq, turn, the transcript bytes through it
    (`byte_end`) and the media bytes through it (`media_end`); zeros for a Session without events."""

    seq: int
    turn: int
    byte_end: int
    media_end: int


@functools.lru_cache(maxsize=None)
def _insert_sql(count: int) -> str:
    """The one `INSERT` of `count` events."""
    return _INSERT_SQL + ", ".join([_ROW] * count)


@functools.lru_cache(maxsize=None)
def _checked_insert_sql(count: int, journaled: bool) -> str:
    """The one `INSERT` of a turn of `count` events without media that inserts only when the Session is as the lease
    expects: its workspace and epoch, the lease token, state and expiry, no open agent journal (unless `journaled`),
    and the head the lease last wrote. It inserts all of the rows or none: `changes()` tells which. Bound: ?1 Session
    row ID, ?2 workspace ID, ?3 epoch, ?4 token digest, ?5 now, ?6-?9 that head (seq, turn, byte_end, media_end),
    then each event's kind, payload, size and byte_end. The rest of a row follows from those: seq and position from
    the head and the event's place, the next turn, the unchanged media_end, created_at now. The rows come from one
    `VALUES` list joined to the one row of the check, so they are inserted in order."""
    journal = "" if journaled else f"AND NOT {open_journal('?1')} "
    rows = ", ".join(f"({i}, ?{10 + 4 * i}, ?{11 + 4 * i}, ?{12 + 4 * i}, ?{13 + 4 * i})" for i in range(count))
    return (
        _INSERT_SQL.removesuffix("VALUES ") + "SELECT ?1, ?6 + 1 + v.column1, ?7 + 1, v.column1, v.column2, v.column3, "
        "v.column4, v.column5, ?9, ?5 FROM (SELECT 1 FROM sessions s JOIN session_leases l ON l.session_id = s.id "
        "WHERE s.id = ?1 AND s.workspace_id = ?2 AND s.workspace_epoch = ?3 AND l.token_hash = ?4 "
        f"AND {live_lease('l', '?5')} {journal}AND (SELECT seq, turn, byte_end, media_end FROM events "
        f"WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1) = (?6, ?7, ?8, ?9)) CROSS JOIN (VALUES {rows}) AS v"
    )


def insert_turn(
    conn: apsw.Connection, session_rowid: int, encoded: Sequence[EncodedEvent], head: Head, now: float,
    media: dict[int, int] | None = None,
) -> Head:
    """Inside the caller's write transaction, which has read and checked `head`: insert `encoded` as the next turn
    (seqs, positions and the running byte total after `head`, the turn after its turn, the media total growing by
    `media`: position -> bytes) and return the new head. The rows' IDs are consecutive, ending at
    `conn.last_insert_rowid()`."""
    values: list = []
    media = media or {}
    byte_end, media_end, turn = head.byte_end, head.media_end, head.turn + 1
    for i, e in enumerate(encoded):
        byte_end += e.size
        media_end += media.get(i, 0)
        values += (session_rowid, head.seq + i + 1, turn, i, e.kind, e.payload, e.size, byte_end, media_end, now)
    conn.execute(_insert_sql(len(encoded)), values)
    return Head(head.seq + len(encoded), turn, byte_end, media_end)


def insert_rows(conn: apsw.Connection, rows: Sequence[tuple]) -> None:
    """Inside the caller's write transaction: insert events whose columns the caller computed, each row (session_id,
    seq, turn, position, kind, payload, size, byte_end, media_end, created_at), in order."""
    conn.executemany(_insert_sql(1), rows)


def insert_restored(conn: apsw.Connection, event_id: int | None, row: tuple) -> int:
    """Inside the caller's write transaction: insert one event read back from an export, its columns as
    `insert_rows` takes them, with the ID `event_id` (None: the next free one); return its ID."""
    return conn.execute(
        "INSERT INTO events (id, session_id, seq, turn, position, kind, payload, size, byte_end, media_end, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id", (event_id, *row)
    ).fetchone()[0]


def insert_checked_turn(
    conn: apsw.Connection, session_rowid: int, encoded: Sequence[EncodedEvent], head: Head, now: float, *,
    workspace_id: int, epoch: int, token_digest: bytes, journaled: bool,
) -> Head | None:
    """Inside the caller's write transaction: insert `encoded` (no media) as the next turn after `head` only when the
    Session still has that head, the workspace row (`workspace_id`, `epoch`) and the live lease of `token_digest`,
    and no open agent journal unless `journaled`; return the new head, or None when nothing was inserted (the
    caller then checks in full, raising what changed)."""
    byte_end = head.byte_end
    values = [session_rowid, workspace_id, epoch, token_digest, now, *head]
    for e in encoded:  # (kind, payload, size) and the running byte total
        byte_end += e.size
        values += e
        values.append(byte_end)
    conn.execute(_checked_insert_sql(len(encoded), journaled), values)
    if not conn.changes():
        return None
    return Head(head.seq + len(encoded), head.turn + 1, byte_end, head.media_end)
