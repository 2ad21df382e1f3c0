"""Listing the known workspaces and rebinding one, explicitly and audited, to a directory the user names.

After a re-clone (`rm -rf proj && git clone ... proj`) the new directory is
not the old workspace, so the old Sessions and Knowledge are refused there.
`list_workspaces` shows every known workspace with where it was last seen and
what is there now; `rebind_workspace` points one at the new directory, so its
Sessions resume and its Knowledge is recalled there again. Every rebind is
recorded in `workspace_rebinds` with who made it, when, and both identities.
"""

from __future__ import annotations

import os
import pwd
import socket
from dataclasses import dataclass

from ..errors import (
    ConfirmationRequiredError,
    EmelexError,
    InvalidInputError,
    LeaseHeldError,
    WorkspaceConflictError,
    WorkspaceMissingError,
    WorkspaceNotFoundError,
)
from .holders import live_lease
from .identity import WorkspaceIdentity
from .workspaces import WORKSPACE_COLUMNS, find_workspace, identity_of, settle_workspace

from ..core.database import Database
from ..core.paging import Items, Page, take

MAX_WORKSPACE_ROW_BYTES = 8192  # bound of one row in a page estimate (a path is at most 4096 bytes)
MAX_REBIND_ROW_BYTES = 16384  # bound of one rebind record in a page estimate (two paths, who)
_MAX_ID = 2**63 - 1
_COUNTS_SQL = (
    "SELECT (SELECT count(*) FROM sessions WHERE workspace_id = ?1), "
    "(SELECT count(*) FROM knowledge WHERE workspace_id = ?1 AND tombstoned_at IS NULL), "
    "(SELECT count(*) FROM workspace_rebinds WHERE workspace_id = ?1)"
)
# Whether anything at all belongs to a workspace: a Session, a Knowledge entry (forgotten ones too) or a rebind record.
_USED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM sessions WHERE workspace_id = ?1) "
    "OR EXISTS (SELECT 1 FROM knowledge WHERE workspace_id = ?1) "
    "OR EXISTS (SELECT 1 FROM workspace_rebinds WHERE workspace_id = ?1)"
)


@dataclass(frozen=True)
class WorkspaceInfo:
    """One known workspace: its stored identity, what its path holds now, and what belongs to it.

    `status` is "present" (the path names this very directory), "replaced"
    (the path names another directory), "missing" (nothing there: deleted, or
    renamed and not used since), "unreadable" (the path cannot be inspected:
    a symlink loop, access denied, an I/O error) or
    "unknown" (no path was ever recorded: Knowledge migrated from a store
    whose Sessions were gone). `knowledge` counts live entries, `rebinds` the
    audited rebinds so far.
    """

    id: int
    path: str | None
    device: int
    inode: int
    generation: int | None
    birth_ns: int | None
    created_at: float
    status: str
    sessions: int
    knowledge: int
    rebinds: int


@dataclass(frozen=True)
class WorkspacePage(Page[WorkspaceInfo]):
    """Known workspaces in ID order. Pass `next_cursor` back to continue; it is None after the last page."""

    workspaces = Items[WorkspaceInfo]()


@dataclass(frozen=True)
class WorkspaceRebind:
    """The audit record of one rebind: the workspace, its identity before (`old_path` None if never seen) and
    after, who made it (`user@host pid N`) and when. `changed` is False when the directory already was the
    workspace, in which case nothing was recorded. `retired` is the ID of the empty workspace the directory was
    until then (see `rebind_workspace`), or None."""

    workspace_id: int
    old_path: str | None
    old_device: int
    old_inode: int
    old_generation: int | None
    old_birth_ns: int | None
    new: WorkspaceIdentity
    rebound_by: str
    rebound_at: float
    changed: bool
    retired: int | None = None


@dataclass(frozen=True)
class WorkspaceRebindPage(Page[WorkspaceRebind]):
    """A workspace's rebind records oldest first. Pass `next_cursor` back to continue; None after the last page."""

    rebinds = Items[WorkspaceRebind]()


_REBIND_COLUMNS = (
    "id, workspace_id, old_path, old_device, old_inode, old_generation, old_birth_ns, new_path, new_device, "
    "new_inode, new_generation, new_birth_ns, rebound_by, rebound_at, retired_workspace_id"
)


def _rebind_from_row(row: tuple) -> WorkspaceRebind:
    new = WorkspaceIdentity(*row[7:12])
    return WorkspaceRebind(row[1], *row[2:7], new, row[12], row[13], True, row[14])


def _status(row: tuple) -> str:
    if row[1] is None:
        return "unknown"
    try:
        found = WorkspaceIdentity.inspect(row[1])
    except WorkspaceMissingError:
        return "missing"
    except EmelexError:  # a symlink loop, denied access, an I/O error: the path cannot tell
        return "unreadable"
    return "present" if found.same_directory(identity_of(row)) else "replaced"


def _who() -> str:
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"[:300]


def _check_id(workspace_id: object) -> int:
    if isinstance(workspace_id, bool) or not isinstance(workspace_id, int) or not 1 <= workspace_id <= _MAX_ID:
        raise InvalidInputError(
            f"a workspace ID is a positive integer, got {workspace_id!r}; see `emelex memory workspaces list`"
        )
    return workspace_id


def _decode_cursor(cursor: object) -> int:
    if not isinstance(cursor, str) or not cursor.isascii() or not cursor.isdigit() or int(cursor) > _MAX_ID:
        raise InvalidInputError(f"bad workspace cursor {cursor!r}; pass a next_cursor from a previous page")
    return int(cursor)


class WorkspaceAdmin:
    """`MemoryStore` methods to list known workspaces and rebind one."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    def list_workspaces(
        self, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> WorkspacePage:
        """Page through the known workspaces in ID order, bounded in items and bytes, with each one's status
        (inspected now, see `WorkspaceInfo`) and its Session, live Knowledge and rebind counts. Writes nothing."""
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_WORKSPACE_ROW_BYTES)
        after = 0 if cursor is None else _decode_cursor(cursor)
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {WORKSPACE_COLUMNS}, created_at FROM workspaces WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit + 1),
            ).fetchall()
            taken, next_cursor = take(
                rows, limit, max_bytes,
                lambda row: 300 + len((row[1] or "").encode("utf-8", "surrogateescape")), lambda row: str(row[0]),
            )
            counted = [(row, conn.execute(_COUNTS_SQL, (row[0],)).fetchone()) for row in taken]
        return WorkspacePage([WorkspaceInfo(*row, _status(row), *counts) for row, counts in counted], next_cursor)

    def get_workspace(self, workspace_id: int) -> WorkspaceInfo:
        """One known workspace as `list_workspaces` shows it (its status inspected now); raise
        `WorkspaceNotFoundError` for an unknown ID. Writes nothing."""
        workspace_id = _check_id(workspace_id)
        with self._db.read() as conn:
            row = conn.execute(
                f"SELECT {WORKSPACE_COLUMNS}, created_at FROM workspaces WHERE id = ?", (workspace_id,)
            ).fetchone()
            if row is None:
                raise WorkspaceNotFoundError(
                    f"no workspace {workspace_id}; list them with `emelex memory workspaces list`"
                )
            counts = conn.execute(_COUNTS_SQL, (workspace_id,)).fetchone()
        return WorkspaceInfo(*row, _status(row), *counts)

    def workspace_rebinds(
        self, workspace_id: int, *, cursor: str | None = None, limit: int | None = None,
        max_bytes: int | None = None,
    ) -> WorkspaceRebindPage:
        """Page through the audit records of workspace `workspace_id`'s rebinds, oldest first, bounded in items
        and bytes (who, when, the identity before and after, a workspace it retired). Raises
        `WorkspaceNotFoundError` for an unknown ID. Writes nothing."""
        workspace_id = _check_id(workspace_id)
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_REBIND_ROW_BYTES)
        after = 0 if cursor is None else _decode_cursor(cursor)
        with self._db.read() as conn:
            if conn.execute("SELECT 1 FROM workspaces WHERE id = ?", (workspace_id,)).fetchone() is None:
                raise WorkspaceNotFoundError(
                    f"no workspace {workspace_id}; list them with `emelex memory workspaces list`"
                )
            rows = conn.execute(
                f"SELECT {_REBIND_COLUMNS} FROM workspace_rebinds WHERE workspace_id = ? AND id > ? ORDER BY id "
                "LIMIT ?",
                (workspace_id, after, limit + 1),
            ).fetchall()
        taken, next_cursor = take(
            rows, limit, max_bytes,
            lambda row: 600 + len((row[2] or "").encode("utf-8", "surrogateescape")) + len(row[7].encode("utf-8")),
            lambda row: str(row[0]),
        )
        return WorkspaceRebindPage([_rebind_from_row(row) for row in taken], next_cursor)

    def rebind_workspace(
        self, workspace_id: int, directory: str | os.PathLike[str], *, confirm: bool = False
    ) -> WorkspaceRebind:
        """Point known workspace `workspace_id` at `directory`, so its Sessions and Knowledge belong there.

        Needs `confirm=True` to change the workspace's directory. Raises `WorkspaceNotFoundError` for an unknown ID,
        `WorkspaceMissingError` unless `directory` is a directory,
        `WorkspaceConflictError` when it already is another known workspace
        that anything belongs to (a Session, a Knowledge entry, forgotten ones
        too, or a rebind record), `LeaseHeldError` while a live lease holds
        one of the workspace's Sessions, and `ConfirmationRequiredError`
        without confirmation; each changes nothing. An other workspace that
        nothing belongs to (left empty, say, after its only Session was
        deleted) is retired: its row is deleted and its ID recorded with the
        rebind. Records the old and new identity, who and when in
        `workspace_rebinds`. Rebinding to the directory the workspace already
        is changes nothing but following a rename, records nothing and needs
        no confirmation.
        """
        workspace_id = _check_id(workspace_id)
        found = WorkspaceIdentity.inspect(directory)
        now = self._db.clock()
        with self._db.write() as conn:
            row = conn.execute(f"SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE id = ?", (workspace_id,)).fetchone()
            if row is None:
                raise WorkspaceNotFoundError(
                    f"no workspace {workspace_id}; list them with `emelex memory workspaces list`"
                )
            other = find_workspace(conn, found)
            retired = None
            if other is not None and other[0] != workspace_id:
                if conn.execute(_USED_SQL, (other[0],)).fetchone()[0]:
                    sessions, knowledge, _ = conn.execute(_COUNTS_SQL, (other[0],)).fetchone()
                    raise WorkspaceConflictError(
                        f"{found.path} already is workspace {other[0]} ({sessions} Sessions, {knowledge} live "
                        "Knowledge entries); nothing was changed: pick another directory, or rebind that workspace "
                        "elsewhere first"
                    )
                retired, other = other[0], None  # empty: the rebind retires it
            held = conn.execute(
                "SELECT s.uuid, l.holder, l.expires_at FROM sessions s JOIN session_leases l ON l.session_id = s.id "
                f"WHERE s.workspace_id = ? AND {live_lease('l')} LIMIT 1",
                (workspace_id, now),
            ).fetchone()
            if held:
                raise LeaseHeldError(
                    f"Session {held[0]} of workspace {workspace_id} is leased by {held[1]} for another "
                    f"{held[2] - now:.0f}s; nothing was changed: wait for it to finish or expire, then rebind"
                )
            who = _who()
            if other is not None:  # already this workspace: at most a rename to follow, no confirmation needed
                new = settle_workspace(conn, row, found)
                return WorkspaceRebind(workspace_id, *row[1:], new, who, now, False)
            if not confirm:
                raise ConfirmationRequiredError(
                    f"rebinding workspace {workspace_id} to {found.path} needs explicit confirmation: pass --yes"
                )
            if retired is not None:
                conn.execute("DELETE FROM workspaces WHERE id = ?", (retired,))
            conn.execute(
                "UPDATE workspaces SET path = ?, device = ?, inode = ?, generation = ?, birth_ns = ? WHERE id = ?",
                (found.path, found.device, found.inode, found.generation, found.birth_ns, workspace_id),
            )
            conn.execute(
                "INSERT INTO workspace_rebinds (workspace_id, old_path, old_device, old_inode, old_generation, "
                "old_birth_ns, new_path, new_device, new_inode, new_generation, new_birth_ns, rebound_by, rebound_at, "
                "retired_workspace_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (workspace_id, *row[1:], found.path, found.device, found.inode, found.generation, found.birth_ns,
                 who, now, retired),
            )
        return WorkspaceRebind(workspace_id, *row[1:], found, who, now, True, retired)
