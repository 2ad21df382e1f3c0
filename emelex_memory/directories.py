"""`Directory`: a private directory opened once, without following symlinks, and the names inside it.

A path is resolved afresh at every use, so renaming one of its parent
directories, or swapping a parent for a symlink, redirects it. A descriptor
is not redirected: the `*at` system calls (`openat`, `linkat`, `unlinkat`,
`fstatat`, `mkdirat`, `fdopendir`) resolve a name inside the directory the
descriptor holds, and every name used here is a single component opened with
`O_NOFOLLOW`. Whatever happens to the parents, a read or write through a
`Directory` lands in the directory that was opened and checked.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, check_dir_stat

if not {os.open, os.link, os.unlink, os.stat, os.mkdir} <= os.supports_dir_fd or os.scandir not in os.supports_fd:
    raise ImportError("Emelex needs directory-relative system calls (openat, linkat, ...): run it on Linux or macOS")

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Directory:
    """An open, verified private directory (ours, not group/world-writable); `path` is only for messages.

    Close it, or use it as a context manager. Not shared between threads
    while another thread may close it.
    """

    __slots__ = ("path", "fd")

    def __init__(self, path: Path, fd: int) -> None:
        """Wrap the open directory descriptor `fd`; use `open` or `child` instead."""
        self.path = path
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> Directory:
        """Open the existing directory `path` (its last component must not be a symlink) and verify it is private.

        Raises `InsecurePathError` for a symlink, a non-directory, another
        owner or a group/world-writable directory, and `FileNotFoundError`
        when it does not exist.
        """
        return cls._open(path, str(path), None)

    def child(self, name: str, *, create: bool = False) -> Directory | None:
        """Open the private subdirectory `name` through this descriptor; None when it does not exist.

        With `create`, a missing subdirectory is made (mode 0700) and this
        directory fsynced first, so the new entry is durable.
        """
        if create and self.stat(name) is None:
            try:
                os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=self.fd)
            except FileExistsError:
                pass
            else:
                self.fsync()
                made = self._open(self.path / name, name, self.fd)
                os.fchmod(made.fd, PRIVATE_DIR_MODE)  # whatever the umask
                return made
        try:
            return self._open(self.path / name, name, self.fd)
        except FileNotFoundError:
            return None

    @staticmethod
    def _open(path: Path, name: str, dir_fd: int | None) -> Directory:
        try:
            fd = os.open(name, _OPEN_DIR, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            check_dir_stat(path, st)  # raises: a symlink or not a directory
            raise
        try:
            check_dir_stat(path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        return Directory(path, fd)

    def stat(self, name: str) -> os.stat_result | None:
        """The `lstat` of `name` in this directory, or None when there is no such entry."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def open_file(self, name: str, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
        """`os.open` of `name` in this directory with `O_NOFOLLOW | O_CLOEXEC` added; return the descriptor."""
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Remove the entry `name` (never a directory) from this directory."""
        os.unlink(name, dir_fd=self.fd)

    def link(self, name: str, target: Directory, target_name: str) -> None:
        """Hard-link `name` of this directory as `target_name` in `target`; `FileExistsError` if that is taken."""
        os.link(name, target_name, src_dir_fd=self.fd, dst_dir_fd=target.fd, follow_symlinks=False)

    def scandir(self) -> os.ScandirIterator:
        """Iterate over the entries of this directory (their `path` is just the name)."""
        return os.scandir(self.fd)

    def fsync(self) -> None:
        """fsync this directory, so entries created, linked or removed in it are durable."""
        os.fsync(self.fd)

    def close(self) -> None:
        """Close the descriptor; safe to call twice."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
