
CREATE TABLE knowledge (
    id INTEGER PRIMARY KEY,              -- internal key; active pages use the stable (key, id) cursor
    workspace_dev INTEGER NOT NULL,      -- scope: the workspace directory's device + inode, not its path
    workspace_ino INTEGER NOT NULL,
    key TEXT NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    head_version INTEGER NOT NULL CHECK (head_version >= 1),  -- number of the newest version
    tombstoned_at REAL,                  -- when the newest version became a tombstone; NULL while live
    pinned INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1)),  -- pinned: automatic processes leave it alone
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,            -- time of the newest version; the age retention looks at
    UNIQUE (workspace_dev, workspace_ino, key),
    CHECK (NOT (pinned = 1 AND tombstoned_at IS NOT NULL))   -- a pinned entry is never a tombstone
) STRICT;
CREATE INDEX knowledge_by_updated ON knowledge (updated_at);
CREATE INDEX knowledge_by_tombstoned ON knowledge (tombstoned_at) WHERE tombstoned_at IS NOT NULL;

CREATE TABLE knowledge_versions (
    id INTEGER PRIMARY KEY,
    knowledge_id INTEGER NOT NULL REFERENCES knowledge (id) ON DELETE CASCADE,
    version INTEGER NOT NULL CHECK (version >= 1),  -- 1, 2, 3, ... per entry: the history cursor
    tombstone INTEGER NOT NULL CHECK (tombstone IN (0, 1)),
    content TEXT CHECK (content IS NULL OR length(CAST(content AS BLOB)) BETWEEN 1 AND 65536),
    size INTEGER NOT NULL CHECK (size >= 0),          -- UTF-8 bytes of key + content, for byte-bounded pages
    confidence REAL NOT NULL CHECK (confidence BETWEEN 0.0 AND 1.0),
    origin TEXT NOT NULL CHECK (origin IN ('user', 'distillation', 'retention')),  -- who made this version
    source_session_id INTEGER REFERENCES sessions (id) ON DELETE SET NULL,  -- cleared when the Session is deleted
    source_session_uuid TEXT,            -- provenance kept for audit even after the Session is deleted
    source_first_seq INTEGER,
    source_last_seq INTEGER,
    source_digest TEXT,                  -- see knowledge/source_digest.py
    created_at REAL NOT NULL,
    UNIQUE (knowledge_id, version),
    CHECK ((tombstone = 1) = (content IS NULL)),
    CHECK ((source_session_uuid IS NULL) = (source_digest IS NULL)
        AND (source_session_uuid IS NULL) = (source_first_seq IS NULL)
        AND (source_session_uuid IS NULL) = (source_last_seq IS NULL)),
    CHECK (source_session_id IS NULL OR source_session_uuid IS NOT NULL),
    CHECK (source_first_seq IS NULL OR (source_first_seq >= 1 AND source_last_seq >= source_first_seq)),
    CHECK (source_digest IS NULL OR length(source_digest) = 64)
) STRICT;
CREATE INDEX knowledge_versions_by_source ON knowledge_versions (source_session_id)
    WHERE source_session_id IS NOT NULL;

-- Versions are immutable; the only permitted change is clearing the source foreign key,
-- which is what ON DELETE SET NULL does when the source Session is deleted.
CREATE TRIGGER knowledge_versions_immutable
BEFORE UPDATE OF id, knowledge_id, version, tombstone, content, size, confidence, origin, source_session_uuid,
    source_first_seq, source_last_seq, source_digest, created_at ON knowledge_versions
BEGIN SELECT RAISE(ABORT, 'Knowledge versions are immutable'); END;
CREATE TRIGGER knowledge_versions_source_only_cleared
BEFORE UPDATE OF source_session_id ON knowledge_versions WHEN NEW.source_session_id IS NOT NULL
BEGIN SELECT RAISE(ABORT, 'Knowledge provenance is immutable'); END;
