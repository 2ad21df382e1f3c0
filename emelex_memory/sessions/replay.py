"""One page of a Session's replay view: what `MemoryStore.replay` and `SessionLease.replay` both read."""

from __future__ import annotations

from ..compaction.summaries import read_view_page
from ..core.cursors import check_position
from ..core.database import Database
from .rows import session_rowid
from .transcript import ReplayPage


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
