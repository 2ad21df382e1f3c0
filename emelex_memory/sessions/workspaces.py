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
