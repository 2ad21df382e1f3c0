"""Failures of the disk and the operating system as typed errors that name the path and what to do.

The operating system reports them as `OSError`; `file_error` is the one place that turns one into the
`EmelexError` for its errno (no space, I/O error, permission denied, read-only file system, a symlink where
none may be, a name too long, ...). Code that touches files either calls it where it knows the path and what
it was doing, or is decorated with `translating`, which does the same for every error escaping a function.

SQLite reports them as I/O-class apsw exceptions (`IO_ERRORS`); `sqlite_error` turns one into the matching
`FileSystemError` subclass (a damaged database: `DatabaseCorruptError`). The connection wrappers in `store.py`
apply it, so a failed read or write never reaches a caller as a bare apsw error. A failure of the COMMIT itself
is different: the transaction may already be durable (in WAL mode its frames can be in the -wal file, which the
next open after a crash recovers), so it becomes a `CommitOutcomeUnknownError` (`commit_unknown`) that says how
to find out.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import apsw

from ..errors import (
    CommitOutcomeUnknownError,
    DatabaseCorruptError,
    DiskFullError,
    EmelexError,
    FileAccessDeniedError,
    FileSystemError,
    InsecurePathError,
    PathTooLongError,
    ReadOnlyLocationError,
    StoreIOError,
)

F = TypeVar("F", bound=Callable[..., Any])

# What SQLite raises when the file system, not the SQL, failed: the disk (IOERR), space (FULL), a file it cannot
# write (READONLY) or open (CANTOPEN, e.g. the -wal file), or one whose content is damaged (CORRUPT, NOTADB).
CORRUPT_ERRORS = (apsw.CorruptError, apsw.NotADBError)
IO_ERRORS = (apsw.IOError, apsw.FullError, apsw.ReadOnlyError, apsw.CantOpenError, *CORRUPT_ERRORS)

DOCTOR = "check the disk (`dmesg`), then run `emelex memory doctor`"
RESTORE = "run `emelex memory doctor`, then restore the store from a backup (`emelex memory restore`)"
ELSEWHERE = "set EMELEX_HOME to a writable directory"


def file_error(exc: OSError, path: os.PathLike[str] | str, doing: str) -> EmelexError:
    """The typed error for `exc`, raised by the operating system on `path` while `doing` ("creating it", ...).

    Every message names the path and says what to do; the `OSError` stays available as the `__cause__` of the
    error raised.
    """
    code, reason = exc.errno, exc.strerror or str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(
            f"no space left on the device holding {path} (while {doing}): free space there, or set EMELEX_HOME to "
            "a directory on another disk"
        )
    if code == errno.EROFS:
        return ReadOnlyLocationError(f"{path} is on a read-only file system (while {doing}): {ELSEWHERE}")
    if code in (errno.EACCES, errno.EPERM):
        return FileAccessDeniedError(
            f"permission denied on {path} (while {doing}): make it and its directory yours and writable by you, "
            "or set EMELEX_HOME to a directory you own"
        )
    if code == errno.ELOOP:
        return InsecurePathError(
            f"{path} is a symlink, or its path loops through symlinks (while {doing}); Emelex never follows "
            "them: replace it with a real file or directory"
        )
    if code == errno.ENAMETOOLONG:
        return PathTooLongError(
            f"the path {path} is longer than the file system allows (while {doing}): use a shorter "
            "EMELEX_HOME, database path or name"
        )
    if code == errno.EIO:
        return StoreIOError(f"I/O error on {path} (while {doing}: {reason}); {DOCTOR}")
    name = errno.errorcode.get(code or 0, "an OS error")
    return FileSystemError(f"{reason} ({name}) on {path} (while {doing}); check the path, its type and its permissions")


def translating(doing: str, where: Callable[..., object]) -> Callable[[F], F]:
    """Decorate a function so that an `OSError` or an I/O-class SQLite error escaping it is raised as its typed
    error, `file_error(exc, exc.filename or where(*args, **kwargs), doing)` or `sqlite_error(...)`; `where` gets
    the function's arguments and returns the path to name when the error does not carry one."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def translated(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except OSError as exc:
                raise file_error(exc, exc.filename or where(*args, **kwargs), doing) from exc
            except IO_ERRORS as exc:
                raise sqlite_error(exc, where(*args, **kwargs), doing) from exc

        return translated  # type: ignore[return-value]

    return decorate


def detail_of(exc: apsw.Error, conn: apsw.Connection | None) -> str:
    """SQLite's own words for a failure: its extended result code, message, and the OS error when it recorded one."""
    code = apsw.mapping_extended_result_codes.get(getattr(exc, "extendedresult", None) or -1)
    parts = [f"{code}: {exc}" if code else str(exc)]
    try:
        os_errno = conn.system_errno if conn is not None else 0
    except apsw.Error:  # the connection is closed
        os_errno = 0
    if os_errno:
        parts.append(os.strerror(os_errno))
    return "; ".join(parts)


def sqlite_error(exc: apsw.Error, path: os.PathLike[str] | str, doing: str, conn: apsw.Connection | None = None
                 ) -> FileSystemError:
    """The typed error for an `IO_ERRORS` exception SQLite raised on the database at `path` while `doing`
    ("reading", "writing", ...); `conn`, when given, supplies the operating system's error number."""
    detail = detail_of(exc, conn)
    if isinstance(exc, CORRUPT_ERRORS):
        return corrupt_error(path, doing, detail)
    if isinstance(exc, apsw.FullError) or getattr(exc, "extendedresult", None) == apsw.SQLITE_IOERR_SHMSIZE:
        # SHMSIZE: SQLite could not grow the database's -shm file, which a full disk is what makes fail
        return DiskFullError(
            f"the disk holding database {path} is full ({detail}); free space there, or set EMELEX_HOME to a "
            "directory on another disk"
        )
    if isinstance(exc, apsw.ReadOnlyError):
        return ReadOnlyLocationError(
            f"database {path} cannot be written ({detail}): it is on a read-only file system or not writable by "
            f"you; make it writable, or {ELSEWHERE}"
        )
    if isinstance(exc, apsw.CantOpenError):
        return FileSystemError(
            f"cannot open database {path} or its -wal/-shm file while {doing} ({detail}); check that its "
            f"directory is writable by you, or {ELSEWHERE}"
        )
    return StoreIOError(f"I/O error on database {path} while {doing} ({detail}); {DOCTOR}")


def corrupt_error(path: os.PathLike[str] | str, doing: str, detail: str) -> DatabaseCorruptError:
    """The error for the database at `path` found damaged or not a database (`detail`) while `doing`."""
    return DatabaseCorruptError(f"database {path} is damaged ({detail}, while {doing}); {RESTORE}")


def with_committed(exc: EmelexError, committed: str) -> EmelexError:
    """The typed error `exc`, raised after an earlier transaction of the same call committed, saying again with
    `committed` appended what stays done (its attributes, such as a `report`, are kept)."""
    error = type(exc)(f"{exc}; {committed}")
    error.__dict__.update(exc.__dict__)
    return error


def failure_remedy(exc: apsw.Error) -> str:
    """What to do about the cause of an `IO_ERRORS` failure before retrying: free space, make the file writable,
    check the disk."""
    if isinstance(exc, apsw.FullError):
        return "free space on the disk holding it (or set EMELEX_HOME to a directory on another disk)"
    if isinstance(exc, apsw.ReadOnlyError):
        return f"make it writable (or {ELSEWHERE})"
    if isinstance(exc, CORRUPT_ERRORS):
        return RESTORE
    return DOCTOR


def commit_unknown(
    detail: str, path: os.PathLike[str] | str, what: str, advice: str, remedy: str = ""
) -> CommitOutcomeUnknownError:
    """The error for a COMMIT of `what` ("a write", "a turn to Session ...") to the database at `path` that failed
    in its I/O (`detail`: SQLite's report), ending with what to do about the cause (`remedy`, from
    `failure_remedy`), then `advice` on how to find out; both are kept on the error (`detail`, `remedy`)."""
    first = f"first {remedy}, then " if remedy else ""
    error = CommitOutcomeUnknownError(
        f"the commit of {what} to database {path} failed ({detail}); it may or may not be durable: {first}{advice}"
    )
    error.detail, error.remedy = detail, remedy
    return error


def restated(
    exc: CommitOutcomeUnknownError, path: os.PathLike[str] | str, what: str, advice: str
) -> CommitOutcomeUnknownError:
    """`exc` said again for `what`, with the caller's `advice` on how to find out (its detail and remedy kept)."""
    return commit_unknown(exc.detail, path, what, advice, exc.remedy)
