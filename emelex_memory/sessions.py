"""Sessions and workspace identity.

A Session binds a canonical workspace directory *and* its device/inode
identity. Renaming the directory keeps the Session valid (the stored path
follows the rename when a lease is acquired); a path that now names another
directory fails closed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .errors import WorkspaceMissingError, WorkspaceReplacedError
from .io_errors import file_error


@dataclass(frozen=True)
class WorkspaceIdentity:
    """A directory's canonical path plus the device/inode pair that identifies it across renames."""

    path: str
    device: int
    inode: int

    @classmethod
    def inspect(cls, path: str | os.PathLike[str]) -> WorkspaceIdentity:
        """Resolve `path` and read its identity; raise `WorkspaceMissingError` unless it is a directory."""
        canonical = os.path.realpath(path)
        try:
            st = os.stat(canonical)
        except (FileNotFoundError, NotADirectoryError):
            raise WorkspaceMissingError(f"workspace {path} does not exist; pass an existing directory") from None
        except OSError as exc:
            raise file_error(exc, path, "inspecting the workspace") from exc
        if not stat.S_ISDIR(st.st_mode):
            raise WorkspaceMissingError(f"workspace {path} is not a directory; pass a directory")
        return cls(canonical, st.st_dev, st.st_ino)

    def same_directory(self, other: WorkspaceIdentity) -> bool:
        """True when both name the same directory, whatever their spelling."""
        return (self.device, self.inode) == (other.device, other.inode)


@dataclass(frozen=True)
class Session:
    """A read-only snapshot of one Session row.

    `id` is the public Session ID (a UUID string). `last_seq` is the raw
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

    def validate_workspace(self, path: str | os.PathLike[str]) -> Path:
        """Check, without a lease and without writing, that `path` is this Session's workspace.

        Returns the canonical path. A renamed workspace directory is valid;
        raises `WorkspaceMissingError` when `path` is not an existing directory
        and `WorkspaceReplacedError` when it is a different directory than the
        one the Session was created in. This is the same preflight that lease
        acquisition runs, so a CLI can fail before loading a model.
        """
        found = WorkspaceIdentity.inspect(path)
        if not found.same_directory(self.workspace):
            raise WorkspaceReplacedError(
                f"{found.path} is not the workspace of Session {self.id} (created in {self.workspace.path}, "
                "a different directory); use the original directory"
            )
        return Path(found.path)


# Columns of the `session_heads` view (m007), which adds the head read from each Session's newest event.
SESSION_COLUMNS = (
    "uuid, title, workspace_path, workspace_dev, workspace_ino, created_at, updated_at, last_seq, last_turn, "
    "event_bytes"
)


def session_from_row(row: tuple) -> Session:
    """Build a `Session` from a row selected with `SESSION_COLUMNS`."""
    uuid, title, path, dev, ino, created, updated, last_seq, last_turn, event_bytes = row
    return Session(uuid, title, WorkspaceIdentity(path, dev, ino), created, updated, last_seq, last_turn, event_bytes)
