"""What every service reads of a Session inside its caller's transaction: its rowid by public ID, and the stored
size of a range of its events."""

from __future__ import annotations

import apsw

from ..core.utf8 import is_utf8
from ..errors import SessionNotFoundError


def session_rowid(conn: apsw.Connection, session_id: str) -> int:
    """The rowid of Session `session_id`; raise `SessionNotFoundError` naming the list command if there is none."""
    row = None
    if is_utf8(session_id):  # a non-UTF-8 ID (from the command line) names no Session and cannot be bound
        row = conn.execute("SELECT id FROM sessions WHERE uuid = ?", (session_id,)).fetchone()
    if row is None:
        raise SessionNotFoundError(f"no Session {session_id!r}; list them with `emelex memory sessions list`")
    return row[0]


def range_bytes(conn: apsw.Connection, session_rowid: int, first: int, last: int) -> int:
    """The summed stored sizes of a Session's events `first..last` (0 when none), read from sizes alone."""
    return conn.execute(
        "SELECT coalesce(sum(size), 0) FROM events WHERE session_id = ? AND seq BETWEEN ? AND ?",
        (session_rowid, first, last),
    ).fetchone()[0]
