"""`Database`: one open Emelex database file: its connection, lock, clock, settings and transactions.

Every service of `MemoryStore` (`store.sessions`, `store.jobs`, ...) holds the
same `Database` and reaches SQLite only through `read()` and `write()`, so
every read holds the lock and every write is one `BEGIN IMMEDIATE`
transaction. It knows no feature: it is the `Disk` to the store's `Cache`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import apsw

from ..errors import EmelexError, InvalidInputError, StoreClosedError
from .settings import Settings
from .directories import Directory
from .io_errors import IO_ERRORS, commit_unknown, detail_of, failure_remedy, sqlite_error

Clock = Callable[[], float]
T = TypeVar("T")


class Database:
    """An opened and migrated connection to `path`, the descriptor of its directory, and the policy every service
    shares: `settings`, `clock`, one re-entrant lock and one write transaction. Thread-safe."""

    def __init__(
        self, conn: apsw.Connection, path: Path, settings: Settings, clock: Clock, directory: Directory
    ) -> None:
        """Wrap `conn` (already opened and migrated) and `directory` (the database's, opened by the caller)."""
        self.conn = conn
        self.path = path
        self.settings = settings
        self.clock = clock
        self.directory = directory
        self.lock = threading.RLock()
        self._transaction = _WriteTransaction(self.lock, conn, path)
        self._reader = _ReadAccess(self.lock, conn, path)

    @classmethod
    def wrap(cls, conn: apsw.Connection, path: Path, settings: Settings, clock: Clock) -> Database:
        """Wrap `conn`, opening the database's directory (kept until `close()`: asset files are reached through it,
        never by path); close `conn` if that fails."""
        try:
            directory = Directory.open(path.parent)
        except BaseException:
            conn.close()
            raise
        return cls(conn, path, settings, clock, directory)

    def write(self) -> _WriteTransaction:
        """`with db.write() as conn:` one `BEGIN IMMEDIATE` transaction: commits on success, rolls back completely on
        any error raised before the commit; a failed commit raises `CommitOutcomeUnknownError`."""
        return self._transaction

    def read(self) -> _ReadAccess:
        """`with db.read() as conn:` holds the connection, for reads, against concurrent use by other threads."""
        return self._reader

    def page_limits(self, limit: int | None, max_bytes: int | None, *, min_bytes: int = 0) -> tuple[int, int]:
        """A page's item and byte bounds: the settings' defaults for None, refused outside the settings' maxima."""
        s = self.settings
        limit = s.page_items if limit is None else limit
        max_bytes = s.page_bytes if max_bytes is None else max_bytes
        if not 1 <= limit <= s.max_page_items:
            raise InvalidInputError(f"limit must be between 1 and {s.max_page_items}, got {limit}")
        if not max(min_bytes, 1) <= max_bytes <= s.page_bytes:
            raise InvalidInputError(f"max_bytes must be between {max(min_bytes, 1)} and {s.page_bytes}, got {max_bytes}")
        return limit, max_bytes

    def closed_error(self) -> StoreClosedError:
        """The error of any use of this database after `close()`."""
        return _closed(self.path)

    def close(self) -> None:
        """Close the connection and the directory descriptor."""
        with self.lock:
            self.conn.close()
            self.directory.close()


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


def read_in_snapshot(conn: apsw.Connection, read: Callable[..., T], *args: Any) -> T:
    """`read(conn, *args)` inside one read transaction (or the caller's), so its statements see one database state.

    A plain function rather than a context manager: replay pays this once per page.
    """
    if conn.in_transaction:
        return read(conn, *args)
    conn.execute("BEGIN DEFERRED")
    try:
        page = read(conn, *args)
    except BaseException:
        _end_after_error(conn)
        raise
    conn.execute("COMMIT")
    return page


def _end_after_error(conn: apsw.Connection) -> None:
    """End a failed read transaction; SQLite ends it itself after some I/O errors, and a failing ROLLBACK must never
    hide the error that caused it."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except apsw.Error:
            pass  # the connection reports the failure on its next use
