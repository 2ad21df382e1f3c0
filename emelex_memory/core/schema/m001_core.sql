
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
    payload TEXT NOT NULL,               -- canonical JSON, see core/jsonbound.py
    size INTEGER NOT NULL CHECK (size >= 0),          -- UTF-8 bytes of payload, for byte-bounded pages
    created_at REAL NOT NULL,
    UNIQUE (session_id, seq)
) STRICT;
