-- Imports of other agents' histories and of Emelex exports (emelex_memory/interchange/): where each imported run of a
-- source came from, so re-importing it is a no-op and a grown file imports only what is new.
CREATE TABLE imports (
    id INTEGER PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,  -- the Session the run became
    format TEXT NOT NULL CHECK (length(format) BETWEEN 1 AND 32),           -- e.g. 'claude-code', 'codex'
    source_key TEXT NOT NULL CHECK (length(CAST(source_key AS BLOB)) BETWEEN 1 AND 1024),  -- the source conversation
    path TEXT NOT NULL CHECK (length(CAST(path AS BLOB)) BETWEEN 1 AND 4096),  -- the file read, as given (absolute)
    first_line INTEGER NOT NULL CHECK (first_line >= 1),   -- 1-based lines (rows of a database source) read
    last_line INTEGER NOT NULL CHECK (last_line >= first_line),
    byte_end INTEGER NOT NULL CHECK (byte_end >= 0),       -- bytes of the file through last_line (a row ID for rows)
    prefix_digest TEXT NOT NULL CHECK (length(prefix_digest) = 64),  -- SHA-256 of the source through last_line
    first_seq INTEGER,                                     -- the events written; NULL when the lines held none
    last_seq INTEGER,
    skipped INTEGER NOT NULL DEFAULT 0 CHECK (skipped >= 0),  -- lines of kinds the importer does not read
    cut INTEGER NOT NULL DEFAULT 0 CHECK (cut >= 0),          -- events cut to the per-event size cap
    imported_at REAL NOT NULL,
    UNIQUE (format, source_key, first_line),
    CHECK ((first_seq IS NULL) = (last_seq IS NULL) AND (first_seq IS NULL OR last_seq >= first_seq))
) STRICT;
CREATE INDEX imports_by_session ON imports (session_id, id);

-- The MCP client (or other named program) that wrote a Knowledge version through `remember`/`forget`, e.g.
-- "claude-code 2.1.3"; NULL for the CLI, the chat and the worker.
ALTER TABLE knowledge_versions ADD COLUMN client TEXT CHECK (client IS NULL OR length(client) BETWEEN 1 AND 200);
DROP TRIGGER knowledge_versions_immutable;
CREATE TRIGGER knowledge_versions_immutable
BEFORE UPDATE OF id, knowledge_id, version, tombstone, content, size, confidence, origin, source_session_uuid,
    source_first_seq, source_last_seq, source_digest, created_at, client ON knowledge_versions
BEGIN SELECT RAISE(ABORT, 'Knowledge versions are immutable'); END;
