"""`Directory`: a private directory opened once, without following symlinks, and the names inside it.

A path is resolved afresh at every use, so renaming one of its parent
directories, or swapping a parent for a symlink, redirects it. A descriptor
is not redirected: the `*at` system calls (`openat`, `linkat`, `unlinkat`,
`fstatat`, `mkdirat`, `fdopendir`) resolve a name inside the directory the
descriptor holds, and every name used here is a single component opened with
`O_NOFOLLOW`. Whatever happens to the parents, a read or write through a
`Directory` lands in the directory that was opened and checked.

Every operating-system failure is raised as its typed error
(`io_errors.file_error`), naming the full path. The exceptions are the
answers a caller acts on, and each method that lets one through says so:
`FileNotFoundError` (no such name) and `FileExistsError` (the name is taken).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import EmelexError
from .private_files import OPEN_DIR_FLAGS, PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, check_dir_stat
from .io_errors import file_error

if not {os.open, os.link, os.unlink, os.stat, os.mkdir} <= os.supports_dir_fd or os.scandir not in os.supports_fd:
    raise ImportError("Emelex needs directory-relative system calls (openat, linkat, ...): run it on Linux or macOS")


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
        owner or a group/world-writable directory, and the typed error of any
        other failure (a missing directory too).
        """
        try:
            return cls._open(path, str(path), None)
        except FileNotFoundError as exc:
            raise file_error(exc, path, "opening it") from exc

    def child(self, name: str, *, create: bool = False) -> Directory | None:
        """Open the private subdirectory `name` through this descriptor; None when it does not exist.

        With `create`, a missing subdirectory is made (mode 0700) and this
        directory fsynced before it is used, so the new entry is durable.
        """
        if create and self.stat(name) is None:
            try:
                os.mkdir(name, PRIVATE_DIR_MODE, dir_fd=self.fd)
            except FileExistsError:
                pass  # another process made it, and makes it durable
            except OSError as exc:
                raise self._error(exc, name, "creating it") from exc
            else:
                self.fsync()
                made = self._open(self.path / name, name, self.fd)
                try:
                    os.fchmod(made.fd, PRIVATE_DIR_MODE)  # whatever the umask
                except OSError as exc:
                    made.close()
                    raise self._error(exc, name, "creating it") from exc
                return made
        try:
            return self._open(self.path / name, name, self.fd)
        except FileNotFoundError:
            return None

    @staticmethod
    def _open(path: Path, name: str, dir_fd: int | None) -> Directory:
        """Open and check `name` (in `dir_fd`); lets `FileNotFoundError` through, any other failure is typed."""
        try:
            fd = os.open(name, OPEN_DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    st = None
                if st is not None:
                    check_dir_stat(path, st)  # raises: a symlink or not a directory
            raise file_error(exc, path, "opening it") from exc
        try:
            try:
                st = os.fstat(fd)
            except OSError as exc:
                raise file_error(exc, path, "inspecting it") from exc
            check_dir_stat(path, st)
        except BaseException:
            os.close(fd)
            raise
        return Directory(path, fd)

    def _error(self, exc: OSError, name: str | None, doing: str) -> EmelexError:
        return file_error(exc, self.path if name is None else self.path / name, doing)

    def stat(self, name: str) -> os.stat_result | None:
        """The `lstat` of `name` in this directory, or None when there is no such entry."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._error(exc, name, "inspecting it") from exc

    def open_file(self, name: str, flags: int, mode: int = PRIVATE_FILE_MODE) -> int:
        """`os.open` of `name` in this directory with `O_NOFOLLOW | O_CLOEXEC` added; return the descriptor.

        Lets `FileNotFoundError` and `FileExistsError` (with `O_EXCL`)
        through; a symlink at `name` raises `InsecurePathError`.
        """
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except (FileNotFoundError, FileExistsError):
            raise
        except OSError as exc:
            raise self._error(exc, name, "creating it" if flags & os.O_CREAT else "opening it") from exc

    def unlink(self, name: str) -> None:
        """Remove the entry `name` (never a directory) from this directory; lets `FileNotFoundError` through."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise self._error(exc, name, "removing it") from exc

    def link(self, name: str, target: Directory, target_name: str) -> None:
        """Hard-link `name` of this directory as `target_name` in `target`; lets `FileExistsError` through when
        that name is taken."""
        try:
            os.link(name, target_name, src_dir_fd=self.fd, dst_dir_fd=target.fd, follow_symlinks=False)
        except FileExistsError:
            raise
        except OSError as exc:
            raise target._error(exc, target_name, f"linking {self.path / name} to it") from exc

    def names(self) -> Iterator[str]:
        """Stream the names of the entries of this directory."""
        try:
            with os.scandir(self.fd) as entries:
                for entry in entries:
                    yield entry.name
        except OSError as exc:
            raise self._error(exc, None, "listing it") from exc

    def fsync(self) -> None:
        """fsync this directory, so entries created, linked or removed in it are durable."""
        try:
            os.fsync(self.fd)
        except OSError as exc:
            raise self._error(exc, None, "syncing it") from exc

    def close(self) -> None:
        """Close the descriptor; safe to call twice."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
