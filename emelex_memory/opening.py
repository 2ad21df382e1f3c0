"""First open, reopen and explicit re-initialisation of a database file.

Serialized by a process mutex plus an exclusive `flock` on a private sidecar,
`.<database-name>.lock`, beside the database. The sidecar doubles as the
record that a store existed here: once a database has been created, a reopen
that finds it missing (or emptied) fails closed instead of recreating it. The
sidecar's name starts with a dot so `rm emelex.sqlite3*` does not take it too.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from .connection import connect
from .errors import (
    ConfirmationRequiredError,
    DatabaseDeletedError,
    DatabaseEmptiedError,
    InsecurePathError,
    NotAnEmelexDatabaseError,
    StoreExistsError,
)
from .files import check_private_dir, check_private_file, create_private_file, fsync_dir, open_private_file
from .migrations import check_compatible, migrate

_PROCESS_MUTEX = threading.Lock()
_MARKER = b"emelex-store 1\n"
_SIDE_FILES = ("-wal", "-shm", "-journal")


def sidecar_path(database: Path) -> Path:
    """The lock-and-marker sidecar of `database`."""
    return database.with_name(f".{database.name}.lock")


@contextmanager
def open_lock(database: Path) -> Iterator[int]:
    """Hold the process mutex and an exclusive flock on the sidecar; yield the sidecar's fd."""
    with _PROCESS_MUTEX:
        fd = open_private_file(sidecar_path(database), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing drops the flock


def _marked(fd: int) -> bool:
    return os.fstat(fd).st_size > 0


def _mark(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, _MARKER, 0)
    os.fsync(fd)


def _check_side_files(database: Path) -> list[Path]:
    found = []
    for suffix in _SIDE_FILES:
        side = Path(f"{database}{suffix}")
        if check_private_file(side, what="database side file") is not None:
            found.append(side)
    return found


def _probe(database: Path, busy_timeout_ms: int) -> int:
    """Check a database through a read-only connection, before any pragma can write to a foreign file."""
    probe = apsw.Connection(str(database), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        probe.set_busy_timeout(busy_timeout_ms)
        return check_compatible(probe)
    except apsw.NotADBError:
        raise NotAnEmelexDatabaseError(f"{database} is not an SQLite database; point Emelex at the right file") from None
    finally:
        probe.close()


def open_database(database: Path, *, busy_timeout_ms: int) -> apsw.Connection:
    """Open (creating on first use) and migrate the database at `database`; return a hardened connection.

    The parent directory must be private (see `files.check_private_dir`);
    the file and its WAL side files must be ours with mode 0600. A store that
    existed here but lost its database raises `DatabaseDeletedError` and
    creates nothing.
    """
    check_private_dir(database.parent)
    check_private_file(database, what="database")  # refuse before the lock sidecar is created
    with open_lock(database) as fd:
        existed = _marked(fd)
        st = check_private_file(database, what="database")
        side_files = _check_side_files(database)
        if st is None:
            if existed:
                raise DatabaseDeletedError(
                    f"database {database} was deleted and nothing was recreated; restore it from a backup, "
                    "or start over with `emelex memory reinit --yes`"
                )
            if side_files:
                raise InsecurePathError(
                    f"{side_files[0]} is left over from a database that is gone; move it away before creating one"
                )
            create_private_file(database)
        version = _probe(database, busy_timeout_ms)
        if version == 0 and existed:
            raise DatabaseEmptiedError(
                f"database {database} was emptied (no schema) although a store existed here; restore a backup"
            )
        conn = connect(database, busy_timeout_ms=busy_timeout_ms)
        try:
            migrate(conn)
            if version == 0:
                with conn:
                    conn.executemany(
                        "INSERT INTO store_meta (key, value) VALUES (?, ?)",
                        [("store_id", str(uuid.uuid4())), ("created_at", repr(time.time()))],
                    )
            if not existed:
                _mark(fd)
        except BaseException:
            conn.close()
            raise
        return conn


def reinitialize_database(database: Path, *, confirm: bool) -> list[Path]:
    """Forget that a store existed at `database` so the next open creates a new one.

    Requires `confirm=True`. Refuses with `StoreExistsError` while the
    database file is present (nothing is ever overwritten). Leftover WAL/SHM
    files of the lost database are moved aside, never deleted, since a fresh
    database must not replay them; returns their new paths.
    """
    if not confirm:
        raise ConfirmationRequiredError("re-initialising needs explicit confirmation: pass --yes")
    check_private_dir(database.parent)
    with open_lock(database) as fd:
        if os.path.lexists(database):
            raise StoreExistsError(
                f"database {database} exists; re-initialise only replaces a deleted database, move it away first"
            )
        moved = []
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for side in _check_side_files(database):
            target = side.with_name(f"{side.name}.orphaned-{stamp}")
            os.rename(side, target)
            moved.append(target)
        os.ftruncate(fd, 0)
        os.fsync(fd)
        fsync_dir(database.parent)
        return moved
