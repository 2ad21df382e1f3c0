"""Schema migrations: a named, ordered list, each applied with its bookkeeping row in one transaction.

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

from .agent.schema import M012_AGENT_JOURNAL
from .assets import M002_ASSETS
from .errors import ForeignKeyViolationError, NotAnEmelexDatabaseError, SchemaTooNewError, StoreError
from .jobs import M003_JOBS
from .knowledge_model import M004_KNOWLEDGE
from .model_refs import M005_MODEL_REFS
from .summaries import M003_SUMMARIES, M006_SUMMARY_EVENTS, M010_SUMMARY_REVERSIONS
from .workspaces import M009_WORKSPACES, M011_WORKSPACE_EPOCHS_AND_RETIREMENTS

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


M001_CORE = """
CREATE TABLE store_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
INSERT INTO store_meta (key, value) VALUES
    ('store_id', lower(hex(randomblob(16)))),              -- identifies this store; never changes
    ('created_at', CAST(unixepoch('subsec') AS TEXT));

CREATE TABLE sessions (
    id INTEGER PRIMARY KEY,              -- internal key; list cursor is (created_at, id)
    uuid TEXT NOT NULL UNIQUE,           -- the public Session ID
    title TEXT CHECK (title IS NULL OR length(title) <= 512),
    workspace_path TEXT NOT NULL,        -- canonical path; follows renames of the same directory
    workspace_dev INTEGER NOT NULL,      -- device + inode identify the directory, not its spelling
    workspace_ino INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    last_seq INTEGER NOT NULL DEFAULT 0 CHECK (last_seq >= 0),    -- raw sequence cursor (newest seq)
    last_turn INTEGER NOT NULL DEFAULT 0 CHECK (last_turn >= 0),  -- newest turn ID
    event_bytes INTEGER NOT NULL DEFAULT 0 CHECK (event_bytes >= 0)
) STRICT;
CREATE INDEX sessions_by_created ON sessions (created_at, id);

CREATE TABLE session_leases (
    session_id INTEGER PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    token_hash BLOB NOT NULL,            -- SHA-256 of the opaque token; the token is never stored
    holder TEXT NOT NULL,                -- "pid@host", for diagnostics only
    state TEXT NOT NULL CHECK (state IN ('active', 'released', 'failed')),
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL,            -- an 'active' lease past this is no longer live
    ended_at REAL,
    failure TEXT CHECK (failure IS NULL OR length(failure) <= 2000)
) STRICT;

CREATE TABLE events (
    id INTEGER PRIMARY KEY,              -- global event ID
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq INTEGER NOT NULL CHECK (seq >= 1),            -- consecutive per Session
    turn INTEGER NOT NULL CHECK (turn >= 1),          -- turn ID, consecutive per Session
    position INTEGER NOT NULL CHECK (position >= 0),  -- index of the event within its turn
    kind TEXT NOT NULL CHECK (length(kind) BETWEEN 1 AND 32),
    payload TEXT NOT NULL,               -- canonical JSON, see jsonbound.py
    size INTEGER NOT NULL CHECK (size >= 0),          -- UTF-8 bytes of payload, for byte-bounded pages
    created_at REAL NOT NULL,
    UNIQUE (session_id, seq)
) STRICT;
"""

M007_EVENT_BYTE_ENDS = """
-- Each event records the Session's transcript bytes through itself, so the Session head (newest seq and turn,
-- total bytes, last activity) is read from its newest event: an append writes its events and nothing else, and a
-- replay page's byte total is its last byte_end minus its first byte_end plus its first size.
ALTER TABLE events ADD COLUMN byte_end INTEGER NOT NULL DEFAULT 0 CHECK (byte_end >= 0);
UPDATE events SET byte_end = w.total
    FROM (SELECT id, sum(size) OVER (PARTITION BY session_id ORDER BY seq) AS total FROM events) AS w
    WHERE events.id = w.id;
ALTER TABLE sessions DROP COLUMN last_seq;
ALTER TABLE sessions DROP COLUMN last_turn;
ALTER TABLE sessions DROP COLUMN event_bytes;
-- The events that record assets, so a replay page learns with one probe that none of its events has any.
CREATE INDEX events_with_assets ON events (session_id, seq) WHERE asset_refs IS NOT NULL;
-- Appends no longer touch sessions.updated_at; the view's updated_at is the later of it and the newest event.
CREATE VIEW session_heads AS
SELECT s.id AS id, s.uuid AS uuid, s.title AS title, s.workspace_path AS workspace_path,
       s.workspace_dev AS workspace_dev, s.workspace_ino AS workspace_ino, s.created_at AS created_at,
       max(s.updated_at, coalesce(e.created_at, s.updated_at)) AS updated_at,
       coalesce(e.seq, 0) AS last_seq, coalesce(e.turn, 0) AS last_turn, coalesce(e.byte_end, 0) AS event_bytes
FROM sessions s LEFT JOIN events e ON e.id = (SELECT id FROM events WHERE session_id = s.id ORDER BY seq DESC LIMIT 1);
"""

M008_EVENT_MEDIA_ENDS = """
-- Each event records the media bytes its Session's events refer to through itself (the running total of the sizes
-- in asset_refs), so an append checks the replay view's aggregate media cap from its newest event and the event its
-- newest Summary covers up to, without summing the transcript.
ALTER TABLE events ADD COLUMN media_end INTEGER NOT NULL DEFAULT 0 CHECK (media_end >= 0);
UPDATE events SET media_end = w.total
    FROM (SELECT e.id, sum(coalesce((SELECT sum(json_extract(r.value, '$[1]')) FROM json_each(e.asset_refs) r), 0))
          OVER (PARTITION BY e.session_id ORDER BY e.seq) AS total FROM events e) AS w
    WHERE events.id = w.id AND w.total > 0;
"""
# Indexes that keep the costs of a store flat at a lifetime's size. `maintain`'s stale-lease sweep reads only active
# leases past their expiry. Version pruning reads only the entries storing more versions than it keeps:
# `first_version` is the oldest version an entry still stores (pruning deletes the oldest first and advances it;
# no other writer deletes single versions). The claim finds the oldest due pending job in `jobs_due`'s own order.
M013_SCALE_INDEXES = """
CREATE INDEX session_leases_active ON session_leases (expires_at) WHERE state = 'active';
ALTER TABLE knowledge ADD COLUMN first_version INTEGER NOT NULL DEFAULT 1 CHECK (first_version >= 1);
UPDATE knowledge SET first_version = coalesce(
    (SELECT min(version) FROM knowledge_versions v WHERE v.knowledge_id = knowledge.id), 1);
CREATE INDEX knowledge_prunable ON knowledge (head_version - first_version) WHERE pinned = 0;
CREATE INDEX jobs_due ON jobs (due_at, id) WHERE state = 'pending';
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration("m001_core", M001_CORE),
    Migration("m002_assets", M002_ASSETS),
    Migration("m003_jobs", M003_JOBS + M003_SUMMARIES),
    Migration("m004_knowledge", M004_KNOWLEDGE),
    Migration("m005_model_refs", M005_MODEL_REFS),
    Migration("m006_summary_events", M006_SUMMARY_EVENTS),
    Migration("m007_event_byte_ends", M007_EVENT_BYTE_ENDS),
    Migration("m008_event_media_ends", M008_EVENT_MEDIA_ENDS),
    Migration("m009_workspaces", M009_WORKSPACES, rebuilds_tables=True),
    Migration("m010_summary_reversions", M010_SUMMARY_REVERSIONS),
    Migration("m011_workspace_epochs_and_retirements", M011_WORKSPACE_EPOCHS_AND_RETIREMENTS),
    Migration("m012_agent_journal", M012_AGENT_JOURNAL),
    Migration("m013_scale_indexes", M013_SCALE_INDEXES),
)


def _check_unique(migrations: tuple[Migration, ...]) -> None:
    names = [m.name for m in migrations]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate migration names in {names}")


_check_unique(MIGRATIONS)

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
