"""The workspace registry: one row per known workspace directory, which Sessions and Knowledge belong to.

A row records the directory's canonical path (following renames) and its
identity: device, inode and, where the file system offers them, the inode
generation and birth time. A directory *is* a known workspace when device and
inode match and every further component known on both sides matches (see
`WorkspaceIdentity.same_directory`). A component the row does not know yet
(NULL: the row was migrated from a store that did not record it) is filled in
by the first write that checks the directory — trust on first use, no weaker
than the device/inode check the store made before. Rows are never deleted;
`rebind` (see `sessions/workspace_admin.py`) points one at another directory, audited.
"""

from __future__ import annotations

import os
from typing import Union

import apsw

from ..errors import WorkspaceMissingError, WorkspaceReplacedError
from .identity import WorkspaceIdentity, rebind_advice

WorkspaceLike = Union[WorkspaceIdentity, str, "os.PathLike[str]"]

M009_WORKSPACES = """
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
"""

M011_WORKSPACE_EPOCHS_AND_RETIREMENTS = """
-- A Session's workspace_epoch counts the changes of its workspace's row (a rename followed, a component recorded, a
-- rebind), so that an append, which reads the Session row anyway, tells that the workspace its lease verified is
-- unchanged from two integers, without reading the workspace row.
ALTER TABLE sessions ADD COLUMN workspace_epoch INTEGER NOT NULL DEFAULT 0;
-- A directory at the path of a known workspace it is not (a re-clone) is told apart from a new one by this lookup.
CREATE INDEX workspaces_by_path ON workspaces (path);
-- A rebind onto a directory that already is an empty workspace (no Sessions, no Knowledge, no rebinds of its own)
-- retires that row: its ID is recorded here, as the row itself is deleted.
ALTER TABLE workspace_rebinds ADD COLUMN retired_workspace_id INTEGER;
CREATE TRIGGER workspace_changed AFTER UPDATE OF path, device, inode, generation, birth_ns ON workspaces
WHEN OLD.path IS NOT NEW.path OR OLD.device IS NOT NEW.device OR OLD.inode IS NOT NEW.inode
     OR OLD.generation IS NOT NEW.generation OR OLD.birth_ns IS NOT NEW.birth_ns
BEGIN
    UPDATE sessions SET workspace_epoch = workspace_epoch + 1 WHERE workspace_id = NEW.id;
END;
"""

WORKSPACE_COLUMNS = "id, path, device, inode, generation, birth_ns"

# The known workspace a directory is: device and inode equal, every further component known on both sides equal.
# Should several match, the one that knows most components, then the newest, wins.
_FIND_SQL = (
    f"SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE device = ?1 AND inode = ?2 "
    "AND (generation IS NULL OR ?3 IS NULL OR generation = ?3) AND (birth_ns IS NULL OR ?4 IS NULL OR birth_ns = ?4) "
    "ORDER BY (generation IS NOT NULL) + (birth_ns IS NOT NULL) DESC, id DESC LIMIT 1"
)


def identity_of(row: tuple) -> WorkspaceIdentity:
    """The stored identity of a row selected with `WORKSPACE_COLUMNS` (its path may be None: never seen)."""
    return WorkspaceIdentity(row[1], row[2], row[3], row[4], row[5])


def find_workspace(conn: apsw.Connection, found: WorkspaceIdentity) -> tuple | None:
    """The row (`WORKSPACE_COLUMNS`) of the known workspace that the directory `found` is, or None."""
    return conn.execute(_FIND_SQL, (found.device, found.inode, found.generation, found.birth_ns)).fetchone()


def settle_workspace(conn: apsw.Connection, row: tuple, found: WorkspaceIdentity) -> WorkspaceIdentity:
    """Inside a write transaction, for a row the directory `found` matched: record the components the row did not
    know yet (trust on first use) and follow a rename of the path; return the identity now stored."""
    settled = WorkspaceIdentity(
        found.path,
        row[2],
        row[3],
        row[4] if row[4] is not None else found.generation,
        row[5] if row[5] is not None else found.birth_ns,
    )
    if (row[1], row[4], row[5]) != (settled.path, settled.generation, settled.birth_ns):
        conn.execute(
            "UPDATE workspaces SET path = ?, generation = ?, birth_ns = ? WHERE id = ?",
            (settled.path, settled.generation, settled.birth_ns, row[0]),
        )
    return settled


def check_not_replaced(conn: apsw.Connection, found: WorkspaceIdentity) -> None:
    """For a directory `found` that is no known workspace: raise `WorkspaceReplacedError` when a known workspace was
    last seen at its path. That directory was replaced (say, re-cloned) or moved away; either way its Knowledge and
    Sessions must not silently go missing here, nor a second workspace appear at the path, which would block the
    rebind that adopts this directory."""
    row = conn.execute("SELECT id FROM workspaces WHERE path = ? ORDER BY id DESC LIMIT 1", (found.path,)).fetchone()
    if row is not None:
        raise WorkspaceReplacedError(
            f"{found.path} is a different directory than workspace {row[0]}, last seen at this path (re-cloned, or "
            f"moved away?), so its Knowledge and Sessions are not used here and nothing was written; "
            f"{rebind_advice(row[0], found.path)}; if this is a new, unrelated workspace, say so with "
            "`emelex memory knowledge remember --new-workspace` (new_workspace=True in the library)"
        )


def register_workspace(
    conn: apsw.Connection, found: WorkspaceIdentity, now: float, *, new_workspace: bool = False
) -> tuple[int, WorkspaceIdentity]:
    """Inside a write transaction: the ID and stored identity of the known workspace the directory `found` is,
    recording it as a new workspace when it is none yet. A directory at the path of another known workspace is
    recorded only with `new_workspace`; otherwise `check_not_replaced` refuses it."""
    row = find_workspace(conn, found)
    if row is not None:
        return row[0], settle_workspace(conn, row, found)
    if not new_workspace:
        check_not_replaced(conn, found)
    workspace_id = conn.execute(
        "INSERT INTO workspaces (path, device, inode, generation, birth_ns, created_at) VALUES (?, ?, ?, ?, ?, ?) "
        "RETURNING id",
        (found.path, found.device, found.inode, found.generation, found.birth_ns, now),
    ).fetchone()[0]
    return workspace_id, found


def current_workspace(workspace: WorkspaceLike) -> WorkspaceIdentity:
    """The caller's current workspace identity: inspect a path, or re-verify an identity against its path.

    Returns the identity read from the directory now. Raises
    `WorkspaceMissingError` when the directory is gone (or was renamed away
    from the identity's path) and `WorkspaceReplacedError` when the identity's
    path now names a different directory.
    """
    if not isinstance(workspace, WorkspaceIdentity):
        return WorkspaceIdentity.inspect(workspace)
    try:
        found = WorkspaceIdentity.inspect(workspace.path)
    except WorkspaceMissingError:
        raise WorkspaceMissingError(
            f"workspace {workspace.path} is gone or was renamed; pass its current path, nothing was written"
        ) from None
    if not found.same_directory(workspace):
        raise WorkspaceReplacedError(
            f"{workspace.path} is now a different directory than the workspace identity given; nothing was written"
        )
    return found


def workspace_scope(
    conn: apsw.Connection,
    workspace: WorkspaceLike,
    *,
    write: bool = False,
    create_at: float | None = None,
    new_workspace: bool = False,
) -> int | None:
    """The ID of the known workspace the caller's current directory is (see `current_workspace`), or None when it
    is none and no known workspace was last seen at its path.

    With `write` (inside a write transaction) the row records components it
    did not know and follows a rename; with `create_at` a directory that is no
    known workspace yet is recorded as one at that time (see
    `register_workspace` for `new_workspace`). A replaced identity's error, and
    that of a directory at the path of another workspace
    (`check_not_replaced`), name the workspace to rebind.
    """
    try:
        found = current_workspace(workspace)
    except WorkspaceReplacedError as exc:  # only an identity can be replaced: a path is what it names now
        row = find_workspace(conn, workspace)  # type: ignore[arg-type]
        hint = rebind_advice(row[0], workspace.path) if row else "see `emelex memory workspaces list`"
        raise WorkspaceReplacedError(f"{exc}; {hint}") from None
    if create_at is not None:
        return register_workspace(conn, found, create_at, new_workspace=new_workspace)[0]
    row = find_workspace(conn, found)
    if row is None:
        check_not_replaced(conn, found)
        return None
    if write:
        settle_workspace(conn, row, found)
    return row[0]
