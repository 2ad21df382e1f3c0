"""Looking a Session up by its public ID inside a caller's transaction: the one function every service shares."""

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
