
CREATE TABLE workspaces (
    id INTEGER PRIMARY KEY,              -- the workspace ID users name, e.g. in `emelex memory workspaces rebind`
    path TEXT,                           -- canonical path where it was last seen; follows renames; NULL: never seen
                                         -- (Knowledge migrated without any Session that recorded a path)
    device INTEGER NOT NULL,             -- device + inode identify the directory, not its spelling ...
    inode INTEGER NOT NULL,
    generation INTEGER,                  -- ... and these tell it from a later directory that reuses the inode
    birth_ns INTEGER,                    -- number; NULL: unknown (not offered, or migrated and not checked yet)
    created_at REAL NOT NULL
) STRICT;
CREATE INDEX workspaces_by_inode ON workspaces (device, inode);

-- The audit record of every explicit rebind: who pointed the workspace at another directory, when, from what.
CREATE TABLE workspace_rebinds (
    id INTEGER PRIMARY KEY,
    workspace_id INTEGER NOT NULL REFERENCES workspaces (id),
    old_path TEXT,
    old_device INTEGER NOT NULL,
    old_inode INTEGER NOT NULL,
    old_generation INTEGER,
    old_birth_ns INTEGER,
    new_path TEXT NOT NULL,
    new_device INTEGER NOT NULL,
    new_inode INTEGER NOT NULL,
    new_generation INTEGER,
    new_birth_ns INTEGER,
    rebound_by TEXT NOT NULL CHECK (length(rebound_by) BETWEEN 1 AND 300),  -- "user@host pid N"
    rebound_at REAL NOT NULL
) STRICT;
CREATE INDEX workspace_rebinds_by_workspace ON workspace_rebinds (workspace_id, id);

-- Every distinct (device, inode) of a Session or a Knowledge entry becomes a workspace, at the path of its most
-- recently active Session.
INSERT INTO workspaces (path, device, inode, created_at)
SELECT (SELECT h.workspace_path FROM session_heads h WHERE h.workspace_dev = i.dev AND h.workspace_ino = i.ino
        ORDER BY h.updated_at DESC, h.id DESC LIMIT 1), i.dev, i.ino, min(i.created_at)
FROM (SELECT workspace_dev AS dev, workspace_ino AS ino, created_at FROM sessions
      UNION ALL SELECT workspace_dev, workspace_ino, created_at FROM knowledge) AS i
GROUP BY i.dev, i.ino ORDER BY min(i.created_at), i.dev, i.ino;

-- Sessions and Knowledge reference their workspace instead of carrying its identity. Both tables are rebuilt
-- (SQLite's documented procedure; the runner turns foreign keys off around this migration, so dropping the old
-- tables cascades nowhere, and checks every foreign key before committing).
DROP VIEW session_heads;
CREATE TABLE sessions_new (
    id INTEGER PRIMARY KEY,              -- internal key; list cursor is (created_at, id)
    uuid TEXT NOT NULL UNIQUE,           -- the public Session ID
    title TEXT CHECK (title IS NULL OR length(title) <= 512),
    workspace_id INTEGER NOT NULL REFERENCES workspaces (id),  -- the workspace directory the Session works in
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) STRICT;
INSERT INTO sessions_new (id, uuid, title, workspace_id, created_at, updated_at)
SELECT s.id, s.uuid, s.title, w.id, s.created_at, s.updated_at
FROM sessions s JOIN workspaces w ON w.device = s.workspace_dev AND w.inode = s.workspace_ino;
DROP TABLE sessions;
ALTER TABLE sessions_new RENAME TO sessions;
CREATE INDEX sessions_by_created ON sessions (created_at, id);
CREATE INDEX sessions_by_workspace ON sessions (workspace_id);

CREATE TABLE knowledge_new (
    id INTEGER PRIMARY KEY,              -- internal key; active pages use the stable (key, id) cursor
    workspace_id INTEGER NOT NULL REFERENCES workspaces (id),  -- scope: the workspace directory, not its path
    key TEXT NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    head_version INTEGER NOT NULL CHECK (head_version >= 1),  -- number of the newest version
    tombstoned_at REAL,                  -- when the newest version became a tombstone; NULL while live
    pinned INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1)),  -- pinned: automatic processes leave it alone
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,            -- time of the newest version; the age retention looks at
    UNIQUE (workspace_id, key),
    CHECK (NOT (pinned = 1 AND tombstoned_at IS NOT NULL))   -- a pinned entry is never a tombstone
) STRICT;
INSERT INTO knowledge_new (id, workspace_id, key, head_version, tombstoned_at, pinned, created_at, updated_at)
SELECT k.id, w.id, k.key, k.head_version, k.tombstoned_at, k.pinned, k.created_at, k.updated_at
FROM knowledge k JOIN workspaces w ON w.device = k.workspace_dev AND w.inode = k.workspace_ino;
DROP TABLE knowledge;
ALTER TABLE knowledge_new RENAME TO knowledge;
CREATE INDEX knowledge_by_updated ON knowledge (updated_at);
CREATE INDEX knowledge_by_tombstoned ON knowledge (tombstoned_at) WHERE tombstoned_at IS NOT NULL;

CREATE VIEW session_heads AS
SELECT s.id AS id, s.uuid AS uuid, s.title AS title, s.workspace_id AS workspace_id, w.path AS workspace_path,
       w.device AS workspace_dev, w.inode AS workspace_ino, w.generation AS workspace_generation,
       w.birth_ns AS workspace_birth_ns, s.created_at AS created_at,
       max(s.updated_at, coalesce(e.created_at, s.updated_at)) AS updated_at,
       coalesce(e.seq, 0) AS last_seq, coalesce(e.turn, 0) AS last_turn, coalesce(e.byte_end, 0) AS event_bytes
FROM sessions s JOIN workspaces w ON w.id = s.workspace_id
LEFT JOIN events e ON e.id = (SELECT id FROM events WHERE session_id = s.id ORDER BY seq DESC LIMIT 1);
