"""The one connection factory: open flags and every pragma in one place, each read back."""

from __future__ import annotations

import time
from pathlib import Path

import apsw

from ..errors import StoreError
from .io_errors import CORRUPT_ERRORS, corrupt_error, detail_of

OPEN_FLAGS = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW | apsw.SQLITE_OPEN_EXRESCODE

# Pragma name -> value to set and the value SQLite reports back when it took effect.
# The sync settings come before journal_mode: the switch of a new database to WAL then deletes its rollback
# journal durably (synchronous=EXTRA fsyncs the folder after the delete).
PRAGMAS: tuple[tuple[str, str, object], ...] = (
    ("foreign_keys", "ON", 1),
    ("synchronous", "EXTRA", 3),
    ("fullfsync", "ON", 1),
    ("checkpoint_fullfsync", "ON", 1),
    ("journal_mode", "WAL", "wal"),
    ("temp_store", "MEMORY", 2),
    ("trusted_schema", "OFF", 0),
)

# Connection settings (sqlite3_db_config) -> the value to set: double-quoted string literals off in DML and DDL,
# schema-defined functions untrusted, and the query planner stability guarantee on. Without QPSG, every statement on
# a table with a partial index (events, jobs, assets) is re-prepared on each execution, because SQLite re-checks
# whether the newly bound values make the partial index usable; our queries name partial-index conditions as literals.
DBCONFIG: tuple[tuple[str, int, int], ...] = (
    ("dqs_dml", apsw.SQLITE_DBCONFIG_DQS_DML, 0),
    ("dqs_ddl", apsw.SQLITE_DBCONFIG_DQS_DDL, 0),
    ("trusted_schema", apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0),
    ("qpsg", apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1),
)


# Sleeps between attempts to get a lock another connection holds, growing to a cap; see `BusyWait`.
BUSY_WAITS_S = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002)


class BusyWait:
    """A busy handler: retry a locked database after short, growing sleeps, for at most `timeout_ms` per lock attempt.

    SQLite's own busy timeout sleeps 1 ms, then 2, 5, 10 ms and more between attempts, while a short write
    transaction (a queue claim or completion) holds the lock for about 0.1 ms; waiting in sub-millisecond steps
    (`BUSY_WAITS_S`, then 2 ms steps) gets the lock soon after it is free, and still gives up once `timeout_ms` has
    passed since the attempt first found the database busy, as the busy timeout does.
    """

    __slots__ = ("_limit_s", "_deadline")

    def __init__(self, timeout_ms: int) -> None:
        """Wait at most `timeout_ms` milliseconds in all for one lock attempt."""
        self._limit_s = timeout_ms / 1000
        self._deadline = 0.0

    def __call__(self, prior_calls: int) -> bool:
        """SQLite's callback: sleep and return True to retry, or False to give up with `SQLITE_BUSY`."""
        now = time.monotonic()
        if prior_calls == 0:
            self._deadline = now + self._limit_s
        left = self._deadline - now
        if left <= 0:
            return False
        time.sleep(min(BUSY_WAITS_S[min(prior_calls, len(BUSY_WAITS_S) - 1)], left))
        return True


def connect(path: Path, *, busy_timeout_ms: int) -> apsw.Connection:
    """Open an existing database file with Emelex's hardened settings.

    The file must already exist (creation is the caller's explicit, checked
    step); symlinks are refused by SQLite itself (`SQLITE_OPEN_NOFOLLOW`).
    Outermost `with conn:` blocks run as `BEGIN IMMEDIATE`. A locked
    database is waited out for at most `busy_timeout_ms` (`BusyWait`; 0 fails
    at once with `apsw.BusyError`). Raises `StoreError` when SQLite cannot
    open the file or a pragma does not stick.
    """
    try:
        conn = apsw.Connection(str(path), flags=OPEN_FLAGS)
    except apsw.CantOpenError as exc:
        raise StoreError(f"cannot open database {path}: {exc}; check that it exists and is a real file") from None
    try:
        if busy_timeout_ms > 0:
            conn.set_busy_handler(BusyWait(busy_timeout_ms))
        else:
            conn.set_busy_timeout(0)
        for name, op, value in DBCONFIG:
            if conn.config(op, value) != value:
                raise StoreError(f"database {path}: SQLite refused connection setting {name}={value}")
        for name, value, expected in PRAGMAS:
            conn.execute(f"PRAGMA {name}={value}").fetchall()
            got = conn.execute(f"PRAGMA {name}").fetchall()[0][0]
            if got != expected:
                raise StoreError(f"database {path}: PRAGMA {name} is {got!r}, expected {expected!r}")
        conn.transaction_mode = "IMMEDIATE"
    except CORRUPT_ERRORS as exc:
        conn.close()
        raise corrupt_error(path, "opening it", detail_of(exc, None)) from None
    except BaseException:
        conn.close()
        raise
    return conn


def read_pragmas(conn: apsw.Connection) -> dict[str, object]:
    """Return the live value of every pragma Emelex sets, for `doctor`."""
    return {name: conn.execute(f"PRAGMA {name}").fetchall()[0][0] for name, _, _ in PRAGMAS}


def read_dbconfig(conn: apsw.Connection) -> dict[str, int]:
    """Return the live value of every connection setting in `DBCONFIG`, for `doctor`."""
    return {name: conn.config(op, -1) for name, op, _ in DBCONFIG}
