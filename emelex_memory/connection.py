"""The one connection factory: open flags and every pragma in one place, each read back."""

from __future__ import annotations

from pathlib import Path

import apsw

from .errors import StoreError

OPEN_FLAGS = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW | apsw.SQLITE_OPEN_EXRESCODE

# Pragma name -> value to set and the value SQLite reports back when it took effect.
PRAGMAS: tuple[tuple[str, str, object], ...] = (
    ("foreign_keys", "ON", 1),
    ("journal_mode", "WAL", "wal"),
    ("synchronous", "EXTRA", 3),
    ("fullfsync", "ON", 1),
    ("checkpoint_fullfsync", "ON", 1),
    ("temp_store", "MEMORY", 2),
    ("trusted_schema", "OFF", 0),
)


def connect(path: Path, *, busy_timeout_ms: int) -> apsw.Connection:
    """Open an existing database file with Emelex's hardened settings.

    The file must already exist (creation is the caller's explicit, checked
    step); symlinks are refused by SQLite itself (`SQLITE_OPEN_NOFOLLOW`).
    Outermost `with conn:` blocks run as `BEGIN IMMEDIATE`. Raises
    `StoreError` when SQLite cannot open the file or a pragma does not stick.
    """
    try:
        conn = apsw.Connection(str(path), flags=OPEN_FLAGS)
    except apsw.CantOpenError as exc:
        raise StoreError(f"cannot open database {path}: {exc}; check that it exists and is a real file") from None
    try:
        conn.set_busy_timeout(busy_timeout_ms)
        conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
        conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
        conn.config(apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0)
        for name, value, expected in PRAGMAS:
            conn.execute(f"PRAGMA {name}={value}").fetchall()
            got = conn.execute(f"PRAGMA {name}").fetchall()[0][0]
            if got != expected:
                raise StoreError(f"database {path}: PRAGMA {name} is {got!r}, expected {expected!r}")
        conn.transaction_mode = "IMMEDIATE"
    except apsw.NotADBError:
        conn.close()
        raise StoreError(f"{path} is not an SQLite database: point Emelex at the right file") from None
    except BaseException:
        conn.close()
        raise
    return conn


def read_pragmas(conn: apsw.Connection) -> dict[str, object]:
    """Return the live value of every pragma Emelex sets, for `doctor`."""
    return {name: conn.execute(f"PRAGMA {name}").fetchall()[0][0] for name, _, _ in PRAGMAS}
