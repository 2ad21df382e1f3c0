"""Failures of the disk and the operating system as typed errors that name the path and what to do.

SQLite reports them as I/O-class apsw exceptions (`IO_ERRORS`); `sqlite_error` turns one into the matching
`FileSystemError` subclass. The connection wrappers in `store.py` apply it, so a failed read or write never
reaches a caller as a bare apsw error. A failure of the COMMIT itself is different: the transaction may already
be durable (in WAL mode its frames can be in the -wal file, which the next open after a crash recovers), so it
becomes a `CommitOutcomeUnknownError` (`commit_unknown`) that says how to find out.
"""

from __future__ import annotations

import os

import apsw

from .errors import (
    CommitOutcomeUnknownError,
    DiskFullError,
    FileSystemError,
    ReadOnlyLocationError,
    StoreIOError,
)

# What SQLite raises when the file system, not the SQL, failed: the disk (IOERR), space (FULL), a file it cannot
# write (READONLY) or open (CANTOPEN, e.g. the -wal file).
IO_ERRORS = (apsw.IOError, apsw.FullError, apsw.ReadOnlyError, apsw.CantOpenError)

DOCTOR = "check the disk (`dmesg`), then run `emelex memory doctor`"
ELSEWHERE = "set EMELEX_HOME to a writable directory"


def detail_of(exc: apsw.Error, conn: apsw.Connection | None) -> str:
    """SQLite's own words for a failure: its extended result code, message, and the OS error when it recorded one."""
    code = apsw.mapping_extended_result_codes.get(getattr(exc, "extendedresult", None) or -1)
    parts = [f"{code}: {exc}" if code else str(exc)]
    try:
        errno = conn.system_errno if conn is not None else 0
    except apsw.Error:  # the connection is closed
        errno = 0
    if errno:
        parts.append(os.strerror(errno))
    return "; ".join(parts)


def sqlite_error(exc: apsw.Error, path: os.PathLike[str] | str, doing: str, conn: apsw.Connection | None = None
                 ) -> FileSystemError:
    """The typed error for an `IO_ERRORS` exception SQLite raised while `doing` ("reading", "writing", ...) the
    database at `path`; `conn`, when given, supplies the operating system's error number."""
    detail = detail_of(exc, conn)
    if isinstance(exc, apsw.FullError):
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
            f"cannot open database {path} or its -wal/-shm file while {doing} it ({detail}); check that its "
            f"directory is writable by you, or {ELSEWHERE}"
        )
    return StoreIOError(f"I/O error {doing} database {path} ({detail}); {DOCTOR}")


def commit_unknown(detail: str, path: os.PathLike[str] | str, what: str, advice: str) -> CommitOutcomeUnknownError:
    """The error for a COMMIT of `what` ("a write", "a turn to Session ...") to the database at `path` that failed
    in its I/O (`detail`: SQLite's report, kept as the error's `detail`), ending with `advice` on how to find out."""
    error = CommitOutcomeUnknownError(
        f"the commit of {what} to database {path} failed ({detail}); it may or may not be durable: {advice}"
    )
    error.detail = detail
    return error
