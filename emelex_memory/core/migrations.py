"""Schema migrations: the named, ordered steps in `schema/*.sql`, each applied with its bookkeeping row in one
transaction.

`PRAGMA user_version` always equals the number of applied migrations and
`PRAGMA application_id` marks the file as an Emelex database. A database that
records a migration this code does not know was written by a newer Emelex and
is refused without being touched. Callers serialize `migrate` across threads
and processes (see `store.py`: a process mutex plus a flock sidecar).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import apsw

from ..errors import ForeignKeyViolationError, NotAnEmelexDatabaseError, SchemaTooNewError, StoreError
from .schema import REBUILDS_TABLES, steps

APPLICATION_ID = 0x454D4C58  # "EMLX"


@dataclass(frozen=True)
class Migration:
    """One schema step: a unique `mNNN_what` name and the literal SQL it runs.

    `rebuilds_tables` marks a step that rebuilds tables other tables
    reference (SQLite's create-copy-drop-rename procedure): it runs with
    foreign keys off, so dropping the old table cascades nowhere, and commits
    only when `PRAGMA foreign_key_check` finds no violation.
    """

    name: str
    sql: str
    rebuilds_tables: bool = False


MIGRATIONS: tuple[Migration, ...] = tuple(
    Migration(name, sql, rebuilds_tables=name in REBUILDS_TABLES) for name, sql in steps()
)


_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    ordinal INTEGER PRIMARY KEY,         -- 1-based position in MIGRATIONS
    name TEXT NOT NULL UNIQUE,
    applied_at REAL NOT NULL
) STRICT
"""


def _pragma(conn: apsw.Connection, name: str) -> int:
    return conn.execute(f"PRAGMA {name}").fetchall()[0][0]


def applied(conn: apsw.Connection) -> list[str]:
    """Names of the migrations recorded in the database, in order."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchall()
    if not has_table:
        return []
    return [name for (name,) in conn.execute("SELECT name FROM schema_migrations ORDER BY ordinal")]


def check_compatible(conn: apsw.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Refuse foreign or newer databases; return the database's `user_version`. Writes nothing."""
    app_id = _pragma(conn, "application_id")
    version = _pragma(conn, "user_version")
    if app_id not in (0, APPLICATION_ID):
        raise NotAnEmelexDatabaseError(f"database has application_id {app_id:#x}; it is not an Emelex database")
    if app_id == 0:
        has_tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()[0][0]
        if has_tables:
            raise NotAnEmelexDatabaseError("database has tables but no Emelex application_id; it is not ours")
        return 0
    names = applied(conn)
    known = [m.name for m in migrations]
    if version > len(known) or names != known[: len(names)]:
        raise SchemaTooNewError(
            f"database schema version {version} ({', '.join(names[len(known):]) or 'unknown steps'}) is newer than "
            f"this Emelex knows ({len(known)}); upgrade Emelex, the database was not touched"
        )
    if version != len(names):
        raise NotAnEmelexDatabaseError(
            f"database user_version {version} disagrees with its {len(names)} recorded migrations; restore a backup"
        )
    return version


def pending(conn: apsw.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[Migration]:
    """Migrations not yet applied, in the order they will run."""
    return list(migrations[check_compatible(conn, migrations) :])


def migrate(conn: apsw.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[str]:
    """Apply every pending migration, each in its own transaction; return the names applied."""
    done = []
    for ordinal, migration in enumerate(migrations, start=1):
        if ordinal <= check_compatible(conn, migrations):
            continue
        if migration.rebuilds_tables:
            _apply_with_foreign_keys_off(conn, ordinal, migration)
        else:
            _apply(conn, ordinal, migration)
        done.append(migration.name)
    return done


def _apply(conn: apsw.Connection, ordinal: int, migration: Migration) -> None:
    with conn:
        conn.execute(_BOOKKEEPING)
        for _ in conn.execute(migration.sql):
            pass
        if migration.rebuilds_tables:
            violations = conn.execute("PRAGMA foreign_key_check").fetchall()
            if violations:
                table, rowid, parent, _ = violations[0]
                raise ForeignKeyViolationError(
                    f"migration {migration.name} would leave {len(violations)} broken references (first: {table} "
                    f"row {rowid} -> {parent}); nothing was changed, restore a consistent backup"
                )
        conn.execute(
            "INSERT INTO schema_migrations (ordinal, name, applied_at) VALUES (?, ?, ?)",
            (ordinal, migration.name, time.time()),
        )
        conn.execute(f"PRAGMA user_version = {ordinal}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _apply_with_foreign_keys_off(conn: apsw.Connection, ordinal: int, migration: Migration) -> None:
    """`PRAGMA foreign_keys` is a no-op inside a transaction, so it is switched outside, and restored after."""
    was_on = _pragma(conn, "foreign_keys")
    conn.execute("PRAGMA foreign_keys = OFF")
    if _pragma(conn, "foreign_keys"):  # a transaction is open, so dropping a table would cascade
        raise StoreError(f"migration {migration.name} must run outside a transaction; nothing was changed")
    try:
        _apply(conn, ordinal, migration)
    finally:
        if was_on:
            conn.execute("PRAGMA foreign_keys = ON")
