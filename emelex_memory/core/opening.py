"""First open, reopen and explicit re-initialisation of a database file.

Serialized by a process mutex plus an exclusive `flock` on a private sidecar,
`.<database-name>.lock`, beside the database. Three things record that a
store existed, so that a reopen which finds its database missing (or emptied)
fails closed instead of recreating it: the sidecar (its name starts with a dot
so `rm emelex.sqlite3*` does not take it too), an optional marker file
elsewhere (the standard store keeps `<Home>/.memory-store`, which survives
`rm -rf <Home>/memory`), and the store's asset folder, created with the store
(so `rm db .db.lock` leaves it behind). `store_evidence` finds them; the
removal guard of model snapshots asks the same question through an open
that does not create. A refused open creates nothing, not even the sidecar.
A new database is built under a temporary name and renamed into place
complete (`_create`), so a first open cut short never leaves a half-made
database under the real name.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from .connection import OPEN_FLAGS, connect
from ..errors import (
    ConfirmationRequiredError,
    DatabaseDeletedError,
    DatabaseEmptiedError,
    InsecurePathError,
    NoStoreError,
    NotAnEmelexDatabaseError,
    StoreExistsError,
    StoreIOError,
)
from .private_files import (
    check_private_dir,
    check_private_file,
    create_private_file,
    ensure_private_dir,
    fsync_dir,
    open_private_file,
    write_private_file,
)
from .io_errors import corrupt_error, detail_of, file_error, translating
from .migrations import MIGRATIONS, check_compatible, migrate

_PROCESS_MUTEX = threading.Lock()
_MARKER = b"emelex-store 1\n"
STORE_MARKER = ".memory-store"  # in Emelex Home: records that the standard store was created
_SIDE_FILES = ("-wal", "-shm", "-journal")


def sidecar_path(database: Path) -> Path:
    """The lock-and-marker sidecar of `database`."""
    return database.with_name(f".{database.name}.lock")


@contextmanager
def open_lock(database: Path) -> Iterator[int]:
    """Hold the process mutex and an exclusive flock on the sidecar; yield the sidecar's fd.

    A first open that fails removes the unmarked sidecar it made (`_undo_creation`) while it holds the flock, so
    the lock is taken on the file that is at the sidecar's path once the flock is held: a process that waited on
    a removed one opens the path again."""
    sidecar = sidecar_path(database)
    with _PROCESS_MUTEX:
        while True:
            fd = open_private_file(sidecar, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _same_file(fd, sidecar):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        try:
            yield fd
        finally:
            os.close(fd)  # closing drops the flock


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except FileNotFoundError:
        return False


def _marked(fd: int) -> bool:
    return os.fstat(fd).st_size > 0


def _mark(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, _MARKER, 0)
    os.fsync(fd)


def _record_marker(marker: Path, database: Path) -> None:
    write_private_file(marker, _MARKER + f"{database}\n".encode())
    fsync_dir(marker.parent)


def _check_side_files(database: Path) -> list[Path]:
    found = []
    for suffix in _SIDE_FILES:
        side = Path(f"{database}{suffix}")
        if check_private_file(side, what="database side file") is not None:
            found.append(side)
    return found


def _probe(database: Path, busy_timeout_ms: int, *, existed: bool) -> int:
    """Check a database through a read-only connection, before any pragma can write to a foreign file; return its
    schema version.

    A hot rollback journal beside it (left by a write cut short by a kill or a power loss) is rolled back first, as
    SQLite's next writer would (`_roll_back_hot_journal`): a read-only connection cannot. A file that is not an
    SQLite database raises `DatabaseCorruptError` where a store `existed` (it was damaged), else
    `NotAnEmelexDatabaseError`."""
    try:
        try:
            return _check(database, busy_timeout_ms)
        except apsw.ReadOnlyError as exc:
            if exc.extendedresult != apsw.SQLITE_READONLY_ROLLBACK:
                raise
        _roll_back_hot_journal(database, busy_timeout_ms)
        return _check(database, busy_timeout_ms)
    except apsw.NotADBError as exc:
        if existed:
            raise corrupt_error(database, "opening it", detail_of(exc, None)) from None
        raise NotAnEmelexDatabaseError(f"{database} is not an SQLite database; point Emelex at the right file") from None


def _check(database: Path, busy_timeout_ms: int) -> int:
    probe = apsw.Connection(str(database), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        probe.set_busy_timeout(busy_timeout_ms)
        return check_compatible(probe)
    finally:
        probe.close()


def _roll_back_hot_journal(database: Path, busy_timeout_ms: int) -> None:
    """Let SQLite roll back the hot journal of `database`: a read-write connection's first read does, and nothing
    else (no pragma) is written. The journal's owner and mode were checked with the other side files."""
    conn = apsw.Connection(str(database), flags=OPEN_FLAGS)
    try:
        conn.set_busy_timeout(busy_timeout_ms)
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
    finally:
        conn.close()


def _create(database: Path, busy_timeout_ms: int) -> None:
    """Create `database` atomically, under the open lock: build and migrate it (WAL mode included) under the
    temporary name `.<name>.creating`, checkpoint its whole WAL into the file, verify the file alone (no WAL
    left, every page readable, the schema complete), fsync it, rename it into place and fsync the folder. A first
    open cut short at any point leaves no database (only the temporary one, which the next creation removes) or a
    complete one; one that fails (a full disk: `DiskFullError`) removes the temporary one and its side files.

    The checkpoint is explicit and checked: closing the last connection copies the WAL into the file too, but a
    copy that cannot be written (no space left to grow the file) does not make the close fail, and the file it
    leaves misses what its WAL still holds."""
    tmp = database.with_name(f".{database.name}.creating")
    _remove_temporary(tmp)
    create_private_file(tmp)
    try:
        conn = connect(tmp, busy_timeout_ms=busy_timeout_ms)
        try:
            migrate(conn)
            _checkpoint_whole(conn, tmp)
        finally:
            conn.close()
        _verify_created(tmp, busy_timeout_ms)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, database)
    except BaseException:
        try:
            _remove_temporary(tmp)
        except OSError:
            pass  # the failure that stopped the creation is the one to report; the next creation removes it
        raise
    fsync_dir(database.parent)


def _checkpoint_whole(conn: apsw.Connection, path: Path) -> None:
    """Copy the whole WAL of `conn`'s new database into its file and empty the WAL (`wal_checkpoint(TRUNCATE)`);
    `StoreIOError` when SQLite reports it could not (a failure to write raises its own typed error)."""
    busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
    if busy or frames != copied:
        raise StoreIOError(
            f"the new database {path} could not be completed ({copied} of {frames} WAL frames checkpointed); "
            "check the disk, then run the command again"
        )


def _verify_created(path: Path, busy_timeout_ms: int) -> None:
    """The new database at `path`, on its own (its WAL emptied), is complete: no WAL bytes left, `quick_check`
    finds nothing, and its schema is the whole of this Emelex's (`StoreIOError` otherwise). The check reads
    through a connection of its own, which writes nothing and, the last to close, removes the -wal and -shm files
    it opened."""
    wal = Path(f"{path}-wal")
    if os.path.lexists(wal) and os.lstat(wal).st_size:
        raise StoreIOError(f"the new database {path} still has {os.lstat(wal).st_size} bytes in its WAL after its "
                           "checkpoint; check the disk, then run the command again")
    check = apsw.Connection(str(path), flags=OPEN_FLAGS)
    try:
        check.set_busy_timeout(busy_timeout_ms)
        problems = [row[0] for row in check.execute("PRAGMA quick_check")]
        version = check_compatible(check)
    finally:
        check.close()
    if problems != ["ok"] or version != len(MIGRATIONS):
        raise StoreIOError(
            f"the new database {path} did not read back complete ({'; '.join(problems)[:200]}, schema version "
            f"{version} of {len(MIGRATIONS)}); check the disk, then run the command again"
        )
    for suffix in _SIDE_FILES:  # left only by a close that could not remove them: empty, and the temporary's
        side = Path(f"{path}{suffix}")
        if os.path.lexists(side):
            os.unlink(side)


def _undo_creation(database: Path, fd: int, made: list[Path]) -> None:
    """A first open that failed after it began creating `database` (a full disk, most often): remove what it made
    (`made`: the database with its -wal/-shm files, the marker, the asset folder, all never used by anyone else:
    the open lock is held and the sidecar is not marked yet), then the unmarked sidecar itself, so that nothing
    says a store existed and the next open creates one normally. Best-effort: the failure that stopped the open is
    the one reported."""
    for path in reversed(made):
        for each in (path, *(Path(f"{path}{suffix}") for suffix in _SIDE_FILES)) if path == database else (path,):
            try:
                if os.path.isdir(each) and not os.path.islink(each):
                    os.rmdir(each)
                elif os.path.lexists(each):
                    os.unlink(each)
            except OSError:
                pass
    try:
        if not _marked(fd):
            os.unlink(sidecar_path(database))  # under its flock: `open_lock` re-opens the path after a wait
        fsync_dir(database.parent)
    except OSError:
        pass


def _remove_temporary(tmp: Path) -> None:
    for path in (tmp, *(Path(f"{tmp}{suffix}") for suffix in _SIDE_FILES)):
        if os.path.lexists(path):
            os.unlink(path)


def deleted_error(database: Path) -> DatabaseDeletedError:
    """The error for a store whose database is gone."""
    return DatabaseDeletedError(
        f"database {database} was deleted and nothing was recreated; restore it from a backup, "
        "or start over with `emelex memory reinit --yes`"
    )


def store_evidence(database: Path, *, marker: Path | None = None, evidence: tuple[Path, ...] = ()) -> Path | None:
    """The first trace found, without following symlinks, that a store was created for `database`: its marked
    sidecar, the `marker` file, or one of the `evidence` paths (its asset folder); None when there is none.

    The database file itself is not evidence: this answers "did a store
    exist here" for a database that may be gone."""
    sidecar = sidecar_path(database)
    try:
        if os.lstat(sidecar).st_size > 0:
            return sidecar
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise file_error(exc, sidecar, "looking for the store") from exc
    return next((p for p in (*([marker] if marker else []), *evidence) if os.path.lexists(p)), None)


def check_missing_database(
    database: Path, *, create: bool, where: Path | None = None, marker: Path | None = None,
    evidence: tuple[Path, ...] = (),
) -> None:
    """For a `database` that does not exist: raise `DatabaseDeletedError` when a store existed there (see
    `store_evidence`), `NoStoreError` (naming `where`, default the database) when none did and not `create`;
    otherwise return, and the caller may create it. A database that appears while the evidence is looked for
    was just created by a concurrent first open (it builds under another name and renames it into place): that is
    no deletion, and this returns so the caller opens it (under the lock, which checks again)."""
    if store_evidence(database, marker=marker, evidence=evidence) is not None and not os.path.lexists(database):
        raise deleted_error(database)
    if not create:
        raise NoStoreError(
            f"no store at {where or database} yet: it is created on first use (the first Session, or "
            "`emelex memory knowledge remember`); nothing was created"
        )


@translating("opening the store", lambda database, **_: database)
def open_database(
    database: Path,
    *,
    busy_timeout_ms: int,
    marker: Path | None = None,
    evidence: tuple[Path, ...] = (),
    create: bool = True,
    where: Path | None = None,
) -> apsw.Connection:
    """Open (creating on first use, if `create`) and migrate the database at `database`; return a hardened
    connection.

    The parent directory must be private (see `files.check_private_dir`);
    the file and its WAL side files must be ours with mode 0600. `marker` is
    an extra private file recorded when the store is created; it and the
    directories in `evidence` (the asset folder, created with the store)
    prove that a store existed. A store that existed here but lost its
    database raises `DatabaseDeletedError`; without `create`, a missing
    store raises `NoStoreError` (naming `where`, default `database`). A
    refused open creates nothing, not even the lock sidecar. A new database
    is created atomically (`_create`): it appears under its name complete,
    in WAL mode and migrated, or not at all. A hot rollback journal beside
    an existing one is rolled back before it is read (`_probe`). A failing
    disk or file system raises its typed error (`io_errors.translating`),
    naming the file; a damaged database raises `DatabaseCorruptError`.
    """
    check_private_dir(database.parent)
    check_private_file(database, what="database")  # refuse before the lock sidecar is created
    if marker is not None:
        check_private_file(marker, what="store marker")
    if not os.path.lexists(database):
        check_missing_database(database, create=create, where=where, marker=marker, evidence=evidence)
    with open_lock(database) as fd:
        marked = _marked(fd)
        existed = marked or store_evidence(database, marker=marker, evidence=evidence) is not None
        st = check_private_file(database, what="database")
        side_files = _check_side_files(database)
        made: list[Path] = []  # what this first open made, undone if it fails before it completes
        try:
            if st is None:
                if existed:
                    raise deleted_error(database)
                check_missing_database(database, create=create, where=where)
                if side_files:
                    raise InsecurePathError(
                        f"{side_files[0]} is left over from a database that is gone; move it away before creating "
                        "one"
                    )
                made.append(database)
                _create(database, busy_timeout_ms)
            version = _probe(database, busy_timeout_ms, existed=existed)
            if version == 0 and existed:
                raise DatabaseEmptiedError(
                    f"database {database} was emptied (no schema) although a store existed here; restore a backup"
                )
            conn = connect(database, busy_timeout_ms=busy_timeout_ms)
            try:
                migrate(conn)
                if marker is not None and not os.path.lexists(marker):
                    made.append(marker)
                    _record_marker(marker, database)
                if create:
                    for folder in evidence:  # evidence that outlives `rm <db> .<db>.lock`
                        if not os.path.lexists(folder):
                            made.append(folder)
                        ensure_private_dir(folder)
                if not marked:
                    _mark(fd)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            if made:
                _undo_creation(database, fd, made)
            raise
        return conn


def locate_database(
    database: Path, *, marker: Path | None = None, evidence: tuple[Path, ...] = (), where: Path | None = None
) -> None:
    """Check, creating and opening nothing, what `open_database` checks before it takes the lock: the private
    directory, the database file (and `marker`) ours with mode 0600, and, for a missing database,
    `DatabaseDeletedError` when a store existed there or `NoStoreError` (naming `where`) when none did."""
    check_private_dir(database.parent)
    check_private_file(database, what="database")
    if marker is not None:
        check_private_file(marker, what="store marker")
    if not os.path.lexists(database):
        check_missing_database(database, create=False, where=where, marker=marker, evidence=evidence)


@translating("opening the store for inspection", lambda database, **_: database)
def open_as_is(database: Path, *, busy_timeout_ms: int) -> tuple[apsw.Connection, int]:
    """Open the existing database at `database` as it is, for inspection (`doctor`): return a hardened connection
    and the schema version (`user_version`) it has.

    Unlike `open_database` it takes no lock and creates nothing (no
    sidecar, marker or asset folder), and it migrates nothing: an older
    schema stays as it is. Only SQLite's own -wal/-shm files may appear
    while the connection is open, and a hot rollback journal left by an
    interrupted write is rolled back, as SQLite's next writer would. Call
    `locate_database` first. Raises like `open_database` for a foreign or
    newer database.
    """
    version = _probe(database, busy_timeout_ms, existed=store_evidence(database) is not None)
    return connect(database, busy_timeout_ms=busy_timeout_ms), version


def _store_exists(database: Path) -> StoreExistsError:
    return StoreExistsError(
        f"database {database} exists; re-initialise only replaces a deleted database, move it away first"
    )


@translating("re-initialising the store", lambda database, **_: database)
def reinitialize_database(
    database: Path, *, confirm: bool, marker: Path | None = None, asset_dir: Path | None = None
) -> list[Path]:
    """Forget that a store existed at `database` so the next open creates a new one.

    Refuses with `StoreExistsError` while the database file is present
    (checked before confirmation is asked; nothing is ever overwritten), then
    requires `confirm=True`. Leftover WAL/SHM
    files of the lost database and its asset folder are moved aside, never
    deleted: a fresh database must not replay the old WAL, and its collector
    must not treat the old store's media as orphans. Returns the new paths.
    """
    if os.path.lexists(database):  # refused either way: say so before asking for confirmation
        raise _store_exists(database)
    if not confirm:
        raise ConfirmationRequiredError("re-initialising needs explicit confirmation: pass --yes")
    check_private_dir(database.parent)
    with open_lock(database) as fd:
        if os.path.lexists(database):
            raise _store_exists(database)
        moved = []
        stamp = time.strftime("%Y%m%dT%H%M%S")
        leftovers = _check_side_files(database)
        if asset_dir is not None and os.path.lexists(asset_dir):
            leftovers.append(asset_dir)
        for leftover in leftovers:
            target = leftover.with_name(f"{leftover.name}.orphaned-{stamp}")
            os.rename(leftover, target)
            moved.append(target)
        if marker is not None and os.path.lexists(marker):
            os.unlink(marker)
            fsync_dir(marker.parent)
        os.ftruncate(fd, 0)
        os.fsync(fd)
        fsync_dir(database.parent)
        return moved
