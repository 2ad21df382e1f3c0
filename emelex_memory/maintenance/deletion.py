"""`MemoryStore.delete_session`: remove one Session, its transcript, jobs and the assets only it referenced.

Deletion is one `BEGIN IMMEDIATE` transaction: the Session row goes, and with
it (by cascading foreign keys) its lease record, events, asset links, jobs
and Summaries. Knowledge that cited the Session keeps its provenance (source
Session UUID, sequence range, digest) for audit; only the nullable foreign
key is cleared. Catalog entries of assets that no other event links, and
that nobody put or linked within the asset grace period, are deleted in the
same transaction; their files are removed only after it has
committed, each after re-checking that no entry names it again (see
`assets_gc`), so a crash in between leaves orphan files for a later
collection, never a catalog entry without its file.

This is not forensic erasure: SQLite keeps deleted content in free pages and
in the WAL until a checkpoint and `VACUUM` (see `maintain`) overwrite them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import apsw

from ..assets.refs import DEFAULT_GRACE_S
from ..assets.collection import AssetCollection, collect_entries
from ..assets.service import remove_asset_files
from ..errors import EmelexError, OpenJournalError, SessionBusyError
from ..core.io_errors import with_committed

from ..core.database import Database
from ..sessions.holders import holder_is_dead, live_holder, open_journal
from ..sessions.rows import session_rowid


@dataclass(frozen=True)
class SessionDeletion:
    """What `delete_session` removed: counts of events and jobs, Knowledge versions whose source link was
    cleared (their audit fields remain), asset catalog entries and files removed, and the bytes freed; and
    `assets_left`, the catalog entries no Session uses any more that were put or linked too recently (within the
    asset grace period) to remove now: a later `maintain` collects them."""

    session_id: str
    events: int
    jobs: int
    knowledge_versions_detached: int
    asset_entries: int
    asset_files: int
    asset_bytes: int
    assets_left: int


def check_not_busy(
    conn: apsw.Connection, rowid: int, session_id: str, now: float, *, kind: str | None = None,
    unchanged: str = "nothing was deleted",
) -> None:
    """Inside a transaction: raise `SessionBusyError` while the Session has a live lease or a live worker claim (on a
    job of `kind`, when given); the message ends with `unchanged`. A holder that `holder_is_dead` is named as dead,
    with when its lease frees (a Session lease) or the command that frees it now (a worker claim)."""
    held = live_holder(conn, rowid, now)
    if held and holder_is_dead(held[0]):
        raise SessionBusyError(
            f"Session {session_id} is leased by {held[0]}, but that process is gone (no such pid on this host); "
            f"its lease frees at {_when(held[1])}, as nobody renews it: run this command again then, {unchanged}"
        )
    if held:
        raise SessionBusyError(
            f"Session {session_id} is leased by {held[0]} for another {held[1] - now:.0f}s; "
            f"wait for it to finish or expire, {unchanged}"
        )
    job = conn.execute(
        "SELECT uuid, lease_holder FROM jobs WHERE session_id = ? AND state = 'claimed' AND lease_expires_at > ? "
        "AND (?3 IS NULL OR kind = ?3)",
        (rowid, now, kind),
    ).fetchone()
    if job and holder_is_dead(job[1]):
        raise SessionBusyError(
            f"worker {job[1]} holds {kind + ' ' if kind else ''}job {job[0]} on Session {session_id}, but that process "
            f"is gone (no such pid on this host); free it now with `emelex memory jobs rescue {job[0]}`, then run this "
            f"command again, {unchanged}"
        )
    if job:
        raise SessionBusyError(
            f"worker {job[1]} is running {kind + ' ' if kind else ''}job {job[0]} on Session {session_id}; wait for "
            f"it or cancel it with `emelex memory jobs cancel {job[0]}`, {unchanged}"
        )


def check_no_open_journal(conn: apsw.Connection, rowid: int, session_id: str) -> None:
    """Inside a transaction: raise `OpenJournalError` while the Session has an open agent journal."""
    if conn.execute(f"SELECT {open_journal('?')}", (rowid,)).fetchone()[0]:
        raise OpenJournalError(
            f"Session {session_id} has an open agent turn whose tool calls may have run; reconcile it with "
            f"`emelex memory sessions recover {session_id}`, or delete it anyway with --discard-journal; "
            "nothing was deleted"
        )


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


class Deletion:
    """Deleting one Session (`MemoryStore.delete_session`)."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    def delete_session(self, session_id: str, *, discard_journal: bool = False) -> SessionDeletion:
        """Delete a Session transactionally, and the assets that become unreferenced; return what was removed.

        Refuses with `SessionBusyError` (deleting nothing) while the Session
        has a live lease or a worker holds a live claim on one of its jobs,
        and with `OpenJournalError` while it has an open agent journal (the
        record of a tool call that may have run) unless `discard_journal`;
        raises `SessionNotFoundError` for an unknown ID. Knowledge citing the
        Session keeps the source Session UUID, sequence range and digest.
        Assets put or linked within the asset grace period (one hour) or
        after the Session's last update (e.g. just put by a writer about to
        link them) are left to `maintain`'s collection. Files are removed
        after the deletion committed: if that fails (the typed error of the
        I/O failure is raised, saying so), the Session is deleted all the
        same and the files stay as orphans that a later collection removes.
        """
        with self._db.write() as conn:
            rowid = session_rowid(conn, session_id)
            if not discard_journal:
                check_no_open_journal(conn, rowid, session_id)
            deletion, emptied = delete_session_in(conn, rowid, session_id, self._db.clock())
        try:
            removed = remove_asset_files(self._db, emptied)
        except EmelexError as exc:
            raise with_committed(
                exc, f"Session {session_id} was deleted all the same (that had committed); its asset files stay as "
                "orphans until `emelex memory maintain` collects them"
            ) from exc
        return SessionDeletion(
            session_id, deletion.events, deletion.jobs, deletion.knowledge_versions_detached,
            deletion.asset_entries, removed.removed_files, removed.freed_bytes, deletion.assets_left,
        )


def delete_session_in(
    conn: apsw.Connection, rowid: int, session_id: str, now: float
) -> tuple[SessionDeletion, list[str]]:
    """Inside a write transaction: delete the Session and the catalog entries only it referenced.

    Returns the counts (with the unused entries left for the grace period)
    and the digests no entry names any more, whose files the caller removes
    once this transaction has committed.
    """
    check_not_busy(conn, rowid, session_id, now)
    updated = conn.execute("SELECT updated_at FROM session_heads WHERE id = ?", (rowid,)).fetchone()[0]
    count = lambda sql: conn.execute(sql, (rowid,)).fetchone()[0]  # noqa: E731
    events = count("SELECT count(*) FROM events WHERE session_id = ?")
    jobs = count("SELECT count(*) FROM jobs WHERE session_id = ?")
    detached = count("SELECT count(*) FROM knowledge_versions WHERE source_session_id = ?")
    linked = conn.execute("SELECT DISTINCT digest FROM event_assets WHERE session_id = ?", (rowid,))
    digests = [d for (d,) in linked]
    conn.execute("DELETE FROM sessions WHERE id = ?", (rowid,))
    # An asset put or linked within the asset grace period, or since the Session's last update, may be about
    # to be linked by another writer: it is left to `maintain`'s collection.
    cutoff = min(now - DEFAULT_GRACE_S, updated)
    collected = AssetCollection()
    emptied = collect_entries(conn, cutoff, len(digests), digests, collected)
    left = sum(conn.execute("SELECT count(*) FROM assets WHERE digest = ? AND links = 0", (d,)).fetchone()[0]
               for d in digests)
    return SessionDeletion(session_id, events, jobs, detached, collected.removed_entries, 0, 0, left), emptied
