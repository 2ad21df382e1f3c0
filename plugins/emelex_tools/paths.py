"""Opening paths inside a workspace without ever leaving it.

A tool path is relative to the workspace, with "/" separators. Absolute
paths, ".." components, NUL bytes and empty names are refused before any
file system call. The path is then walked one component at a time from a
file descriptor of the workspace directory, each component opened with
`O_NOFOLLOW` relative to its parent's descriptor: a symlink anywhere on the
path (in the middle or at the end, including one swapped in after a check)
makes the open fail, so no tool follows a symlink, into the workspace or out
of it. The workspace directory itself is opened as given (a Session binds
it by identity before any tool runs).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAX_PATH_CHARS = 256
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class WorkspacePathError(Exception):
    """A tool path is refused or cannot be opened; the message names the path and why (shown to the model).
    `missing`: the path (or a directory on it) does not exist."""

    missing = False


def parts_of(path: str) -> list[str]:
    """The components of a workspace-relative `path` ("." and empty ones dropped); `WorkspacePathError` for an
    absolute path, a ".." component, a NUL byte or an overlong path."""
    if not isinstance(path, str) or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise WorkspacePathError(f"path {path!r} is not a usable workspace path")
    if path.startswith("/") or path.startswith("~"):
        raise WorkspacePathError(f"path {path!r} is absolute; give a path relative to the workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise WorkspacePathError(f"path {path!r} leaves the workspace ('..' is not allowed)")
    return parts


def _fail(path: str, exc: OSError) -> WorkspacePathError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) or (exc.errno == errno.EMLINK):
        why = "is a symlink or goes through one (tools never follow symlinks)" if exc.errno != errno.ENOTDIR \
            else "goes through something that is not a directory (or a symlink; tools never follow symlinks)"
        return WorkspacePathError(f"path {path!r} {why}")
    if exc.errno == errno.ENOENT:
        missing = WorkspacePathError(f"path {path!r} does not exist in the workspace")
        missing.missing = True
        return missing
    if exc.errno == errno.EACCES:
        return WorkspacePathError(f"path {path!r} is not readable: permission denied")
    return WorkspacePathError(f"path {path!r} cannot be opened: {exc.strerror}")


@contextmanager
def workspace_dir(workspace: Path, path: str) -> Iterator[int]:
    """A file descriptor of directory `path` inside `workspace`, opened component by component without following
    any symlink; closed on exit. `WorkspacePathError` when it escapes, is missing or is not a directory."""
    parts = parts_of(path)
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkspacePathError(f"the workspace {str(workspace)!r} cannot be opened: {exc.strerror}") from None
    try:
        for n, part in enumerate(parts):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _fail("/".join(parts[: n + 1]), exc) from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def split(path: str) -> tuple[str, str]:
    """(parent, name) of a workspace path that names a file; `WorkspacePathError` for the workspace itself."""
    parts = parts_of(path)
    if not parts:
        raise WorkspacePathError(f"path {path!r} names the workspace itself, not a file")
    return "/".join(parts[:-1]), parts[-1]


@contextmanager
def open_regular(workspace: Path, path: str) -> Iterator[int]:
    """A read-only descriptor of regular file `path` inside `workspace` (never through a symlink; a FIFO or device
    is refused without blocking); closed on exit."""
    parent, name = split(path)
    with workspace_dir(workspace, parent) as dir_fd:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            raise _fail(path, exc) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WorkspacePathError(f"path {path!r} is not a regular file")
            yield fd
        finally:
            os.close(fd)
