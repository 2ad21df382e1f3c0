"""`MemoryStore`: the entry point to one Emelex database."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import apsw

from .assets.refs import asset_dir_for
from .assets.service import AssetStoreMixin
from .compaction.planning import CompactionMixin
from .compaction.revert import CompactionRevertMixin
from .core.cursors import check_position, cursor_float, cursor_int
from .maintenance.deletion import DeletionMixin
from .core.directories import Directory
from .knowledge.distillation import DistillationMixin
from .errors import (
    CommitOutcomeUnknownError,
    EmelexError,
    InvalidInputError,
    LeaseHeldError,
    SessionNotFoundError,
    StoreClosedError,
    WorkspaceReplacedError,
)
from .core.private_files import absolute, check_home, check_no_symlinks, check_private_dir, ensure_private_dir
from .core.id_prefix import IdPrefixMixin
from .core.io_errors import IO_ERRORS, commit_unknown, detail_of, failure_remedy, restated, sqlite_error
from .queue.status import JobStatusMixin
from .knowledge.service import KnowledgeMixin
from .sessions.leases import SessionLease, holder_label, new_token, token_digest
from .snapshots.refs import ModelRefMixin
from .core.opening import check_missing_database, open_database, reinitialize_database
from .queue.service import JobQueueMixin
from .compaction.raw_history import RawHistoryMixin
from .maintenance.retention import MaintenanceMixin
from .sessions.identity import SESSION_COLUMNS, Session, WorkspaceIdentity, not_the_workspace, session_from_row
from .settings import Settings
from .compaction.summaries import read_view_page
from .sessions.transcript import ReplayPage
from .core.utf8 import check_utf8, is_utf8
from .sessions.workspace_admin import WorkspaceAdminMixin
from .sessions.workspaces import WORKSPACE_COLUMNS, identity_of, register_workspace, settle_workspace

Clock = Callable[[], float]
STORE_MARKER = ".memory-store"  # in Emelex Home: records that the standard store was created
MAX_SESSION_ROW_BYTES = 8192  # bound of one Session's row in a page estimate (title <= 512 chars, path <= 4096 bytes)


@dataclass(frozen=True)
class SessionPage:
    """A page of Sessions, newest first. Pass `next_cursor` back to continue; it is None after the last page."""

    sessions: list[Session]
    next_cursor: str | None


def _closed(path: Path) -> StoreClosedError:
    return StoreClosedError(f"the store {path} was closed; open it again")


class _ReadAccess:
    """`with store._read() as conn:` holds the store's lock around reads on its connection. One stateless
    instance per store serves every use, from any thread: a plain class rather than a generator context
    manager halves the fixed Python cost, which every replay page and queue transaction pays. An I/O-class
    SQLite error leaving the block is raised as its typed error (`io_errors.sqlite_error`), and the one of a
    closed store as `StoreClosedError`."""

    __slots__ = ("_lock", "_conn", "_path")

    def __init__(self, lock: threading.RLock, conn: apsw.Connection, path: Path) -> None:
        self._lock = lock
        self._conn = conn
        self._path = path

    def __enter__(self) -> apsw.Connection:
        self._lock.acquire()
        return self._conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._lock.release()
        if exc_type is not None:
            if issubclass(exc_type, IO_ERRORS):
                raise sqlite_error(exc, self._path, "reading", self._conn) from exc  # type: ignore[arg-type]
            if issubclass(exc_type, apsw.ConnectionClosedError):
                raise _closed(self._path) from None


class _WriteTransaction(_ReadAccess):
    """`with store._write() as conn:` holds the store's lock around one `BEGIN IMMEDIATE` transaction on its
    connection (a savepoint when nested); like `_ReadAccess`, one instance serves every transaction.

    An error in the block rolls back; if SQLite already rolled back itself (it does after some I/O errors),
    the rollback's own complaint never replaces the error that caused it. An I/O-class error is raised as its
    typed error, and nothing was written; only when the outermost COMMIT itself fails is the outcome unknown
    (`CommitOutcomeUnknownError`, see `_failed_commit`).
    """

    __slots__ = ("_depth",)

    def __init__(self, lock: threading.RLock, conn: apsw.Connection, path: Path) -> None:
        super().__init__(lock, conn, path)
        self._depth = 0  # open blocks; only read and changed under the lock

    def __enter__(self) -> apsw.Connection:
        self._lock.acquire()
        try:
            conn = self._conn.__enter__()
        except BaseException as exc:
            self._lock.release()
            if isinstance(exc, IO_ERRORS):
                raise sqlite_error(exc, self._path, "beginning a write", self._conn) from exc
            if isinstance(exc, apsw.ConnectionClosedError):
                raise _closed(self._path) from None
            raise
        self._depth += 1
        return conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._depth -= 1
        try:
            if exc_type is None:
                try:
                    self._conn.__exit__(None, None, None)
                except apsw.Error as failure:
                    replacement = self._failed_commit(failure)
                    if replacement is None:
                        raise
                    raise replacement from failure
                return
            self._roll_back(exc_type, exc, tb)
        finally:
            self._lock.release()
        if issubclass(exc_type, IO_ERRORS):
            raise sqlite_error(exc, self._path, "writing", self._conn) from exc  # type: ignore[arg-type]

    def _roll_back(self, exc_type: type[BaseException], exc: BaseException | None, tb: object) -> None:
        """Roll the block back after `exc`; a failure to do so is not reported, so `exc` propagates."""
        try:
            self._conn.__exit__(exc_type, exc, tb)
        except apsw.Error:  # "cannot rollback - no transaction is active": SQLite rolled back already
            self._abandon()

    def _abandon(self) -> None:
        """After a failed COMMIT or rollback of the outermost block: make sure no transaction stays open."""
        if self._depth == 0 and self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except apsw.Error:
                pass  # the connection reports the failure on its next use

    def _failed_commit(self, failure: apsw.Error) -> EmelexError | None:
        """The error to raise for `failure` of a block's COMMIT (or savepoint release); None: raise it unchanged.

        An I/O-class failure of the outermost COMMIT has an unknown outcome (`CommitOutcomeUnknownError`): in WAL
        mode a failed fsync leaves the transaction's frames in the -wal file beyond what the wal-index records, so
        this connection no longer sees them and its next write overwrites them, but the next open after a crash
        recovers them. Any other failure left the transaction rolled back.
        """
        self._abandon()
        if not isinstance(failure, IO_ERRORS):
            return None  # busy, constraint: SQLite refused the commit and the transaction was rolled back
        if self._depth:  # a savepoint's release: the outermost block has not committed yet
            return sqlite_error(failure, self._path, "writing", self._conn)
        return commit_unknown(
            detail_of(failure, self._conn), self._path, "a write", "re-read what it wrote before retrying it",
            failure_remedy(failure),
        )


def _check_database_path(path: Path) -> None:
    check_no_symlinks(path, what="database", fix="open {real} instead")


class MemoryStore(
    ModelRefMixin,
    KnowledgeMixin,
    DeletionMixin,
    DistillationMixin,
    MaintenanceMixin,
    JobQueueMixin,
    CompactionMixin,
    CompactionRevertMixin,
    RawHistoryMixin,
    AssetStoreMixin,
    WorkspaceAdminMixin,
    IdPrefixMixin,
    JobStatusMixin,
):
    """One open Emelex database. Thread-safe; use it as a context manager or call `close()`."""

    def __init__(self, conn: apsw.Connection, path: Path, settings: Settings, clock: Clock = time.time) -> None:
        """Wrap an already opened and migrated connection (closing it if this fails); use `open` or `open_path`.
        (`doctor` also wraps a connection opened as it is, unmigrated, for its reads.)

        Opens the database's directory and keeps its descriptor until
        `close()`: asset files are reached through it, never by path.
        """
        try:
            self._dir = Directory.open(path.parent)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.path = path
        self.settings = settings
        self.clock = clock
        self._lock = threading.RLock()
        self._transaction = _WriteTransaction(self._lock, conn, path)
        self._reader = _ReadAccess(self._lock, conn, path)

    # -- opening --------------------------------------------------------------

    @classmethod
    def open(cls, settings: Settings | None = None, *, create: bool = True, clock: Clock = time.time) -> MemoryStore:
        """Open the standard database `<Emelex Home>/memory/emelex.sqlite3`, creating it on first use only.

        Home and its `memory/` directory are created mode 0700 when missing
        and must otherwise be ours and not group/world-writable. Raises a
        `StoreError` subclass when anything is unsafe or the database of an
        existing store is missing. With `create=False` (for commands that
        only read) a Home without a store raises `NoStoreError` and nothing
        at all is created.
        """
        settings = settings or Settings()
        home = settings.home_dir
        check_home(home)
        if os.path.lexists(home):
            check_private_dir(home)  # a file or an unsafe directory is that, not "no store yet"
        marker = home / STORE_MARKER
        database = settings.database_path
        evidence = (asset_dir_for(database),)
        if not os.path.lexists(settings.memory_dir):  # checked before Home or memory/ is created
            check_missing_database(database, create=create, where=home, marker=marker, evidence=evidence)
        ensure_private_dir(home)
        ensure_private_dir(settings.memory_dir)
        conn = open_database(
            database, busy_timeout_ms=settings.busy_timeout_ms, marker=marker, evidence=evidence, create=create,
            where=home,
        )
        return cls(conn, database, settings, clock)

    @classmethod
    def open_path(
        cls,
        path: str | os.PathLike[str],
        settings: Settings | None = None,
        *,
        create: bool = True,
        clock: Clock = time.time,
    ) -> MemoryStore:
        """Open the database file at `path` (its directory must exist and be private), creating it on first use.

        With `create=False` a missing store raises `NoStoreError` and nothing is created.
        """
        settings = settings or Settings()
        path = absolute(path, what="database")
        _check_database_path(path)
        conn = open_database(
            path, busy_timeout_ms=settings.busy_timeout_ms, evidence=(asset_dir_for(path),), create=create
        )
        return cls(conn, path, settings, clock)

    @staticmethod
    def reinitialize(settings: Settings | None = None, *, confirm: bool = False) -> list[Path]:
        """Allow the standard database to be created anew after it was deleted; see `reinitialize_path`."""
        settings = settings or Settings()
        check_home(settings.home_dir)
        ensure_private_dir(settings.home_dir)
        ensure_private_dir(settings.memory_dir)
        return reinitialize_database(
            settings.database_path,
            confirm=confirm,
            marker=settings.home_dir / STORE_MARKER,
            asset_dir=asset_dir_for(settings.database_path),
        )

    @staticmethod
    def reinitialize_path(path: str | os.PathLike[str], *, confirm: bool = False) -> list[Path]:
        """Explicitly forget a deleted database at `path` so the next open creates a new one.

        Needs `confirm=True`; refuses while the database file exists; moves
        leftover WAL/SHM files and the old asset folder aside (never deleting
        them) and returns where they went.
        """
        path = absolute(path, what="database")
        _check_database_path(path)
        return reinitialize_database(path, confirm=confirm, asset_dir=asset_dir_for(path))

    def close(self) -> None:
        """Close the connection. Leases taken through this store stay durable until released or expired."""
        with self._lock:
            self._conn.close()
            self._dir.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals shared with the feature modules ---------------------------------

    def _write(self) -> _WriteTransaction:
        """One `BEGIN IMMEDIATE` transaction: commits on success, rolls back completely on any error raised before
        the commit; a failed commit raises `CommitOutcomeUnknownError`."""
        return self._transaction

    def _read(self) -> _ReadAccess:
        """`with store._read() as conn:` holds the connection, for reads, against concurrent use by other threads."""
        return self._reader

    def _lease_ttl(self, ttl_s: float | None) -> float:
        ttl = self.settings.session_lease_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl <= 86_400:
            raise InvalidInputError(f"lease TTL must be between 0 and 86400 seconds, got {ttl}")
        return ttl

    def _page_limits(self, limit: int | None, max_bytes: int | None, *, min_bytes: int = 0) -> tuple[int, int]:
        s = self.settings
        limit = s.page_items if limit is None else limit
        max_bytes = s.page_bytes if max_bytes is None else max_bytes
        if not 1 <= limit <= s.max_page_items:
            raise InvalidInputError(f"limit must be between 1 and {s.max_page_items}, got {limit}")
        if not max(min_bytes, 1) <= max_bytes <= s.page_bytes:
            raise InvalidInputError(f"max_bytes must be between {max(min_bytes, 1)} and {s.page_bytes}, got {max_bytes}")
        return limit, max_bytes

    def _session_rowid(self, conn: apsw.Connection, session_id: str) -> int:
        row = None
        if is_utf8(session_id):  # a non-UTF-8 ID (from the command line) names no Session and cannot be bound
            row = conn.execute("SELECT id FROM sessions WHERE uuid = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no Session {session_id!r}; list them with `emelex memory sessions list`")
        return row[0]

    # -- Sessions ---------------------------------------------------------------

    def create_session(
        self, workspace: str | os.PathLike[str], *, title: str | None = None, new_workspace: bool = False
    ) -> Session:
        """Create a Session in the canonical `workspace` directory: the known workspace that directory is, or a new
        one recorded with its identity (see `WorkspaceIdentity`).

        A directory at the path where another known workspace was last seen
        (a re-clone, say) raises `WorkspaceReplacedError` naming the rebind
        command, unless `new_workspace` says it is a new, unrelated workspace.
        """
        if title is not None and (not isinstance(title, str) or len(title) > 512):
            raise InvalidInputError("a Session title must be a string of at most 512 characters")
        check_utf8(title, "the Session title")
        found = WorkspaceIdentity.inspect(workspace)
        now = self.clock()
        session_id = str(uuid.uuid4())
        with self._write() as conn:
            workspace_id, ident = register_workspace(conn, found, now, new_workspace=new_workspace)
            conn.execute(
                "INSERT INTO sessions (uuid, title, workspace_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                (session_id, title, workspace_id, now, now),
            )
        return Session(session_id, title, ident, now, now, 0, 0, 0, workspace_id)

    def get_session(self, session_id: str) -> Session:
        """Return a snapshot of one Session; raise `SessionNotFoundError` if there is none."""
        row = None
        if is_utf8(session_id):
            with self._read() as conn:
                row = conn.execute(f"SELECT {SESSION_COLUMNS} FROM session_heads WHERE uuid = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no Session {session_id!r}; list them with `emelex memory sessions list`")
        return session_from_row(row)

    def list_sessions(
        self, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> SessionPage:
        """Page through Sessions newest first with a stable `(created_at, id)` cursor, bounded in items and bytes."""
        limit, max_bytes = self._page_limits(limit, max_bytes, min_bytes=MAX_SESSION_ROW_BYTES)
        where, params = "", ()
        if cursor is not None:
            try:
                created, rowid = cursor.split(":")
                where, params = "WHERE (created_at, id) < (?, ?)", (cursor_float(created), cursor_int(rowid))
            except (AttributeError, ValueError):
                raise InvalidInputError(f"bad Session cursor {cursor!r}; pass a next_cursor from a previous page") from None
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT id, {SESSION_COLUMNS} FROM session_heads {where} ORDER BY created_at DESC, id DESC LIMIT ?",
                (*params, limit + 1),
            ).fetchall()
        sessions, total, last = [], 0, None
        for row in rows[:limit]:
            total += 200 + len((row[2] or "").encode()) + len(row[3].encode())  # generous per-row estimate
            if total > max_bytes:
                break
            sessions.append(session_from_row(row[1:]))
            last = row
        more = len(sessions) < len(rows)
        return SessionPage(sessions, f"{last[8]!r}:{last[0]}" if more and last else None)

    # -- leases and replay --------------------------------------------------------

    def acquire_lease(
        self, session_id: str, workspace: str | os.PathLike[str], *, ttl_s: float | None = None
    ) -> SessionLease:
        """Take the one live lease on a Session from `workspace` (its current path).

        Validates the workspace identity first (a renamed directory is
        accepted and the stored path updated; components the workspace did
        not record yet are recorded). Raises `WorkspaceReplacedError` when the
        directory is not the Session's workspace, `LeaseHeldError` while
        another holder's lease is live; an expired lease is replaced (its
        holder's later writes are refused with `LeaseLostError`). The new
        lease must replay before appending. It keeps the directory open until
        it ends, so that its inode number cannot be reused meanwhile.
        """
        ttl = self._lease_ttl(ttl_s)
        found, fd = WorkspaceIdentity.open(workspace)
        try:
            return self._acquire_lease(session_id, found, fd, ttl)
        except CommitOutcomeUnknownError as exc:
            os.close(fd)
            raise restated(
                exc, self.path, f"a lease on Session {session_id}",
                f"if it is durable, its token never reached you and the Session stays leased until it expires (at "
                f"most {ttl:g}s); acquire it again: a LeaseHeldError then means it was, and acquiring succeeds once "
                "that lease has expired",
            ) from exc.__cause__
        except BaseException:
            os.close(fd)
            raise

    def _acquire_lease(self, session_id: str, found: WorkspaceIdentity, fd: int, ttl: float) -> SessionLease:
        token = new_token()
        with self._write() as conn:
            rowid = self._session_rowid(conn, session_id)
            row = conn.execute(
                f"SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE id = (SELECT workspace_id FROM sessions WHERE id = ?)",
                (rowid,),
            ).fetchone()
            if not found.same_directory(identity_of(row)):
                raise WorkspaceReplacedError(not_the_workspace(found.path, session_id, row[0], row[1]))
            now = self.clock()
            held = conn.execute(
                "SELECT holder, expires_at FROM session_leases WHERE session_id = ? AND state = 'active' "
                "AND expires_at > ?",
                (rowid, now),
            ).fetchone()
            if held:
                raise LeaseHeldError(
                    f"Session {session_id} is leased by {held[0]} for another {held[1] - now:.0f}s; "
                    "wait for it to finish or expire"
                )
            ident = settle_workspace(conn, row, found)
            epoch = conn.execute("SELECT workspace_epoch FROM sessions WHERE id = ?", (rowid,)).fetchone()[0]
            conn.execute(
                "INSERT INTO session_leases (session_id, token_hash, holder, state, acquired_at, expires_at) "
                "VALUES (?, ?, ?, 'active', ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
                "token_hash = excluded.token_hash, holder = excluded.holder, state = 'active', "
                "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, ended_at = NULL, failure = NULL",
                (rowid, token_digest(token), holder_label(), now, now + ttl),
            )
        return SessionLease(self, rowid, session_id, token, now + ttl, ident, row[0], epoch, fd)

    def replay(
        self, session_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> ReplayPage:
        """Read one page of a Session's transcript after `after_seq` (exclusive), bounded in items and bytes.

        `max_bytes` must be at least the per-event cap so every page can make
        progress. Read-only: this does not satisfy a lease's replay duty.
        """
        return self._replay_page(session_id, after_seq, limit, max_bytes)

    def _replay_page(
        self, session: int | str, after_seq: int, limit: int | None, max_bytes: int | None
    ) -> ReplayPage:
        """`replay` of a Session given by its rowid (a lease's) or its public ID."""
        limit, max_bytes = self._page_limits(limit, max_bytes, min_bytes=self.settings.max_event_bytes)
        check_position(after_seq, "after_seq")
        with self._read() as conn:
            rowid = session if type(session) is int else self._session_rowid(conn, session)  # type: ignore[arg-type]
            return read_view_page(conn, rowid, after_seq, limit, max_bytes)
