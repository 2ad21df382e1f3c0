"""Sessions and workspace identity.

A Session belongs to a known workspace (a row of `workspaces`, see
`sessions/workspaces.py`): a directory identified by its device and inode plus, where
the platform offers them, its inode generation and birth time, so that a new
directory that reuses a deleted one's inode number is told apart. Renaming the
directory keeps the Session valid (the stored path follows the rename when a
lease is acquired); a path that now names another directory fails closed,
with advice to rebind the workspace explicitly if the new directory replaces
it.
"""

from __future__ import annotations

import errno
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from .dir_identity import birth_ns, generation
from ..errors import EmelexError, InsecurePathError, WorkspaceError, WorkspaceMissingError, WorkspaceReplacedError
from ..core.io_errors import file_error
from ..core.utf8 import utf8_path

_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_PATH_FLAGS = getattr(os, "O_PATH", 0)  # Linux: a descriptor that needs no read permission (no ioctl on it, though)


@dataclass(frozen=True)
class WorkspaceIdentity:
    """A directory's canonical path plus what identifies it across renames and tells it from a later directory
    that reuses its inode number: device, inode, and where known the inode `generation` and `birth_ns`.

    None means unknown: the file system does not offer the component, or a
    store migrated from before they were recorded has not seen the directory
    since (the first check that succeeds fills it in).
    """

    path: str
    device: int
    inode: int
    generation: int | None = None
    birth_ns: int | None = None

    @classmethod
    def inspect(cls, path: str | os.PathLike[str]) -> WorkspaceIdentity:
        """Resolve `path` and read its identity; raise `WorkspaceMissingError` unless it is a directory."""
        ident, fd = cls.open(path)
        os.close(fd)
        return ident

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> tuple[WorkspaceIdentity, int]:
        """Like `inspect`, and also return an open descriptor of the directory (the caller closes it).

        The identity is read from the descriptor, so it is the identity of the
        directory opened, whatever happens to the path meanwhile.
        """
        canonical = _resolve(path)
        fd = _open_directory(path, canonical)
        try:
            st = os.fstat(fd)
            return cls(canonical, st.st_dev, st.st_ino, generation(fd), birth_ns(fd, st)), fd
        except OSError as exc:
            os.close(fd)
            raise file_error(exc, path, "inspecting the workspace") from exc
        except BaseException:
            os.close(fd)
            raise

    def same_directory(self, other: WorkspaceIdentity) -> bool:
        """True when both name the same directory, whatever their spelling: device and inode are equal, and so
        is every further component (generation, birth time) known on both sides."""
        return (
            self.device == other.device
            and self.inode == other.inode
            and (self.generation is None or other.generation is None or self.generation == other.generation)
            and (self.birth_ns is None or other.birth_ns is None or self.birth_ns == other.birth_ns)
        )


def _resolve(path: str | os.PathLike[str]) -> str:
    """The canonical absolute path of `path` as text; a relative one needs the current directory, which may be gone,
    and one that is not valid UTF-8 cannot be stored (`InvalidInputError`)."""
    try:
        resolved = os.path.realpath(path)
    except FileNotFoundError:  # os.getcwd(): the current directory was removed
        raise WorkspaceMissingError(
            f"the current directory was deleted, so the workspace path {os.fsdecode(path)!r} names nothing; "
            "cd into the workspace directory (or pass its absolute path) and retry"
        ) from None
    except OSError as exc:
        raise file_error(exc, path, "resolving the workspace path") from exc
    return utf8_path(resolved)


def _open_directory(path: str | os.PathLike[str], canonical: str) -> int:
    try:
        try:
            return os.open(canonical, _OPEN_FLAGS)
        except PermissionError:
            if not _PATH_FLAGS:
                raise
            return os.open(canonical, _PATH_FLAGS | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise file_error(exc, path, "opening the workspace") from exc
    if os.path.islink(canonical):  # a symlink loop, or a symlink swapped in after the path was resolved
        raise InsecurePathError(f"workspace {path} is a symlink that resolves to no directory; pass the directory")
    if os.path.lexists(canonical):
        raise WorkspaceMissingError(f"workspace {path} is not a directory; pass a directory")
    raise WorkspaceMissingError(f"workspace {path} does not exist; pass an existing directory")


def rebind_advice(workspace_id: int, directory: str) -> str:
    """The sentence that tells a user how to adopt `directory` as workspace `workspace_id`."""
    return (
        f"if the new directory replaces it (say, a fresh clone), adopt it with "
        f"`emelex memory workspaces rebind {workspace_id} {shlex.quote(directory)} --yes`"
    )


@dataclass(frozen=True)
class Session:
    """A read-only snapshot of one Session row.

    `id` is the public Session ID (a UUID string) and `workspace_id` the ID of
    its workspace (see `MemoryStore.list_workspaces`). `last_seq` is the raw
    sequence cursor at the time of the snapshot: the seq of the newest event;
    `last_turn` and `event_bytes` (canonical JSON bytes of all its events) come
    from that event too, and `updated_at` is the later of the Session row's
    last change and that event's commit time.
    """

    id: str
    title: str | None
    workspace: WorkspaceIdentity
    created_at: float
    updated_at: float
    last_seq: int
    last_turn: int
    event_bytes: int
    workspace_id: int

    def validate_workspace(self, path: str | os.PathLike[str]) -> Path:
        """Check, without a lease and without writing, that `path` is this Session's workspace.

        Returns the canonical path. A renamed workspace directory is valid;
        raises `WorkspaceMissingError` when `path` is not an existing directory
        or the workspace's recorded path names nothing, and
        `WorkspaceReplacedError` when it is a different directory than the
        Session's workspace (the same rule as `WorkspaceIdentity.same_directory`);
        the message says which (see `not_the_workspace`).
        This is the same preflight that lease acquisition runs, so a CLI can
        fail before loading a model.
        """
        found = WorkspaceIdentity.inspect(path)
        if not found.same_directory(self.workspace):
            raise not_the_workspace(found.path, self.id, self.workspace_id, self.workspace)
        return Path(found.path)


def not_the_workspace(found: str, session_id: str, workspace_id: int, recorded: WorkspaceIdentity, *,
                      cwd: bool = True) -> WorkspaceError:
    """The error for a directory `found` that is not the Session's workspace `recorded`, by what the recorded path
    names now: nothing (`WorkspaceMissingError`: restore it, or rebind the directory that now holds it), the
    workspace itself (the caller is elsewhere: run from there), or another directory (`WorkspaceReplacedError` with
    the rebind of the recorded path). Without `cwd` (a command that does not use the current directory, like
    `sessions recover`) the advice is to pass the directory with `--workspace DIR` instead of running from it."""
    head = f"{found} is not the workspace of Session {session_id}"
    if recorded.path is None:  # a migrated workspace never seen since
        how = "run it from" if cwd else "pass with --workspace DIR"
        return WorkspaceReplacedError(f"{head}; {how} workspace {workspace_id}'s directory")
    try:
        there = WorkspaceIdentity.inspect(recorded.path)
    except (WorkspaceMissingError, InsecurePathError):
        return WorkspaceMissingError(
            f"{head}: its workspace {workspace_id}, last seen at {recorded.path}, is missing (deleted or moved away); "
            f"restore it there, {'run it from' if cwd else 'pass with --workspace DIR'} the directory it was moved to, "
            f"or, if another directory replaces it, adopt that one with `emelex memory workspaces rebind "
            f"{workspace_id} DIRECTORY --yes`"
        )
    except EmelexError as exc:
        return WorkspaceReplacedError(f"{head} (workspace {workspace_id}, last seen at {recorded.path}: {exc})")
    if there.same_directory(recorded):
        quoted = shlex.quote(recorded.path)
        how = f"run it from {quoted} or pass --workspace {quoted}" if cwd else f"pass --workspace {quoted}"
        return WorkspaceReplacedError(f"{head} (its workspace {workspace_id} is {recorded.path}); {how}")
    return WorkspaceReplacedError(
        f"{head}: its workspace {workspace_id} was last seen at {recorded.path}, which is now a different directory; "
        f"use the original directory{'' if cwd else ' (pass it with --workspace DIR)'}, or "
        f"{rebind_advice(workspace_id, recorded.path)}"
    )


# Columns of the `session_heads` view (m009_workspaces), which joins each Session's workspace and adds the head read from
# its newest event.
SESSION_COLUMNS = (
    "uuid, title, workspace_path, workspace_dev, workspace_ino, workspace_generation, workspace_birth_ns, "
    "created_at, updated_at, last_seq, last_turn, event_bytes, workspace_id"
)


def session_from_row(row: tuple) -> Session:
    """Build a `Session` from a row selected with `SESSION_COLUMNS`."""
    uuid, title, path, dev, ino, gen, born, created, updated, last_seq, last_turn, event_bytes, wid = row
    ident = WorkspaceIdentity(path, dev, ino, gen, born)
    return Session(uuid, title, ident, created, updated, last_seq, last_turn, event_bytes, wid)
