"""Session -> model snapshot references: binding a model to a Session, and counting a snapshot's references.

`MemoryStore.bind_session_model` takes the Home-wide snapshot-mutation lock,
revalidates the `InstalledModel` (manifest, then the owned stamp or the linked
target's identity, inventory and full hash), derives its reference and exact
snapshot ID from disk, and records them for the Session in one `BEGIN
IMMEDIATE` transaction committed before the lock is released. Removal takes
the same lock and asks `MemorySnapshotReferenceGuard` (`snapshot_guard.py`), so no process can
remove a snapshot between another's check and commit. A reference lasts as
long as its Session: deleting the Session (or retention doing so) releases it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import apsw

from ..core.database import Database
from ..core.paging import Items, Page, take
from ..errors import InvalidInputError
from ..sessions.rows import session_rowid
from .installed import InstalledModel, revalidate, snapshot_mutation_lock


_SNAPSHOT_ID = re.compile(r"sha256:[0-9a-f]{64}\Z")  # what a page cursor (a snapshot ID) looks like
REFERENCE_EXAMPLES = 3  # Session IDs named in a refusal
REF_ROW_BYTES = 160  # generous per-row estimate on top of the reference, for byte-bounded pages
MIN_REF_PAGE_BYTES = REF_ROW_BYTES + 200  # a page's byte bound must fit the largest row (a 200-character reference)


@dataclass(frozen=True)
class SessionModelRef:
    """A Session's reference to a model snapshot: the stable reference, the exact snapshot ID, first/last bind."""

    session_id: str
    reference: str
    snapshot_id: str
    first_bound_at: float
    last_bound_at: float


@dataclass(frozen=True)
class SessionModelRefPage(Page[SessionModelRef]):
    """A page of a Session's model references by snapshot ID; `next_cursor` is None after the last page."""

    refs = Items[SessionModelRef]()


@dataclass(frozen=True)
class BoundModel:
    """What binding returns: the model as revalidated from disk and the reference recorded for the Session."""

    model: InstalledModel
    ref: SessionModelRef


def check_bindable(db: Database, model: InstalledModel) -> None:
    """Raise `InvalidInputError` unless `model` may be bound to a Session of `db`: an `InstalledModel` (never a path
    or a name) of the Home whose standard database `db` is."""
    if type(model) is not InstalledModel:
        raise InvalidInputError(
            f"model binding accepts an InstalledModel from ModelManager, not a {type(model).__name__}"
        )
    home = db.settings.home_dir
    if model.home != home or db.path != db.settings.database_path:
        raise InvalidInputError(
            f"models installed under {model.home} bind only to the standard database of that Home "
            f"({model.home}/memory/emelex.sqlite3), not {db.path}; open the store with MemoryStore.open"
        )


def lock_timeout(db: Database, lock_timeout_s: float | None) -> float:
    """The longest wait for the snapshot-mutation lock: `lock_timeout_s`, or the `model_lock_timeout_s` setting."""
    return db.settings.model_lock_timeout_s if lock_timeout_s is None else lock_timeout_s


def record_binding(
    conn: apsw.Connection, session_rowid: int, session_id: str, current: InstalledModel, now: float
) -> SessionModelRef:
    """Inside a write transaction, under the snapshot lock that revalidated `current`: record that the Session uses
    it (first binding now, or a later one: `last_bound_at` moves on)."""
    first, last = conn.execute(
        "INSERT INTO session_model_refs (session_id, snapshot_id, reference, first_bound_at, "
        "last_bound_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id, snapshot_id) DO UPDATE SET "
        "last_bound_at = max(last_bound_at, excluded.last_bound_at) "
        "RETURNING first_bound_at, last_bound_at",
        (session_rowid, current.snapshot_id, current.reference, now, now),
    ).fetchone()
    return SessionModelRef(session_id, current.reference, current.snapshot_id, first, last)


class SessionModelRefs:
    """Model-binding methods of `MemoryStore`."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    def bind_session_model(
        self, session_id: str, model: InstalledModel, *, lock_timeout_s: float | None = None
    ) -> BoundModel:
        """Validate `model` and record that the Session uses it, holding the snapshot lock through the commit.

        Accepts only an `InstalledModel` (never a path or name) of this
        store's Home, bound to that Home's standard database (where the
        removal guard looks). Raises `ModelNotInstalledError` /
        `ModelTamperedError` from validation and `SessionNotFoundError`; in
        every error case nothing is written.
        """
        check_bindable(self._db, model)
        with snapshot_mutation_lock(self._db.settings.home_dir, timeout_s=lock_timeout(self._db, lock_timeout_s)):
            current = revalidate(model)
            with self._db.write() as conn:
                ref = record_binding(conn, session_rowid(conn, session_id), session_id, current, self._db.clock())
        return BoundModel(current, ref)

    def session_model_refs(
        self,
        session_id: str,
        *,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> SessionModelRefPage:
        """Page through the model snapshots a Session was bound to, by snapshot ID, bounded in items and bytes.

        `max_bytes` must be at least `MIN_REF_PAGE_BYTES` (360), so every page
        holds at least one reference. Pass `next_cursor` back to continue; it
        is None after the last page.
        """
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MIN_REF_PAGE_BYTES)
        if cursor is not None and (not isinstance(cursor, str) or not _SNAPSHOT_ID.match(cursor)):
            raise InvalidInputError(f"bad model reference cursor {cursor!r}; pass a next_cursor from a previous page")
        with self._db.read() as conn:
            rowid = session_rowid(conn, session_id)
            rows = conn.execute(
                "SELECT reference, snapshot_id, first_bound_at, last_bound_at FROM session_model_refs "
                "WHERE session_id = ? AND snapshot_id > ? ORDER BY snapshot_id LIMIT ?",
                (rowid, cursor or "", limit + 1),
            ).fetchall()
        taken, next_cursor = take(rows, limit, max_bytes, lambda row: REF_ROW_BYTES + len(row[0]), lambda row: row[1])
        return SessionModelRefPage([SessionModelRef(session_id, *row) for row in taken], next_cursor)

    def snapshot_references(
        self, snapshot_id: str, *, limit: int = REFERENCE_EXAMPLES
    ) -> tuple[int, list[str]]:
        """(how many retained Sessions reference `snapshot_id`, up to `limit` of their IDs)."""
        with self._db.read() as conn:
            count = conn.execute(
                "SELECT count(*) FROM session_model_refs WHERE snapshot_id = ?", (snapshot_id,)
            ).fetchone()[0]
            ids = [r[0] for r in conn.execute(
                "SELECT s.uuid FROM session_model_refs r JOIN sessions s ON s.id = r.session_id "
                "WHERE r.snapshot_id = ? ORDER BY r.session_id LIMIT ?",
                (snapshot_id, limit),
            )]
        return count, ids

    def model_name_references(
        self, name: str, *, limit: int = REFERENCE_EXAMPLES
    ) -> tuple[int, list[str]]:
        """(how many retained Sessions reference any snapshot installed as model `name`, up to `limit` of their IDs),
        read from the references' `<name>@` prefix."""
        low, high = f"{name}@", f"{name}A"  # "A" follows "@": every reference of this name, and no other
        with self._db.read() as conn:
            count = conn.execute(
                "SELECT count(DISTINCT session_id) FROM session_model_refs WHERE reference >= ? AND reference < ?",
                (low, high),
            ).fetchone()[0]
            ids = [r[0] for r in conn.execute(
                "SELECT s.uuid FROM sessions s WHERE s.id IN (SELECT session_id FROM session_model_refs "
                "WHERE reference >= ? AND reference < ?) ORDER BY s.id LIMIT ?",
                (low, high, limit),
            )]
        return count, ids
