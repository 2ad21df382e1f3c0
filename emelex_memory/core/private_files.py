"""File-system hardening: private directories and files, checked without following symlinks.

Every operating-system failure here is raised as its typed error (`io_errors.file_error`), naming the path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ..errors import FileSystemError, InsecurePathError
from .io_errors import file_error

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700

# How we open what we own: never through a symlink, never inherited by a child process; a read is non-blocking,
# so a FIFO or device planted where a file should be is refused instead of blocking the open.
OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def describe_mode(st: os.stat_result) -> str:
    """Return a mode like `0600` for messages and reports."""
    return f"{stat.S_IMODE(st.st_mode):04o}"


def absolute(path: str | os.PathLike[str], *, what: str) -> Path:
    """`path` made absolute (not resolved); a relative `path` whose current directory was deleted raises
    `FileSystemError` saying so."""
    try:
        return Path(os.path.abspath(path))
    except FileNotFoundError:  # os.getcwd()
        raise FileSystemError(
            f"the current directory was deleted, so the relative {what} path {os.fsdecode(path)!r} names nothing; "
            "cd into an existing directory or pass an absolute path"
        ) from None


def check_no_symlinks(path: Path, *, what: str, fix: str) -> None:
    """Refuse an absolute `path` when any existing component of it, itself included, is a symlink.

    SQLite's `SQLITE_OPEN_NOFOLLOW` refuses a symlink anywhere in a
    database's path, and Emelex never follows one: check before anything
    is created. Raises `InsecurePathError` naming the symlink and ending
    with `fix`, a format string whose `{real}` becomes the path with every
    symlink resolved (e.g. "set EMELEX_HOME to {real}" gives "set
    EMELEX_HOME to /private/tmp/home" where /tmp is a symlink). Components
    that do not exist yet end the check.
    """
    current = Path(path.anchor)
    for part in path.parts[1:]:
        current = current / part
        try:
            st = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise file_error(exc, current, f"checking {what} {path} for symlinks") from exc
        if stat.S_ISLNK(st.st_mode):
            where = "is a symlink" if current == path else f"is under the symlink {current}"
            try:
                target = os.readlink(current)
            except OSError as exc:
                raise file_error(exc, current, f"checking {what} {path} for symlinks") from exc
            raise InsecurePathError(
                f"{what} {path} {where} (to {target}); Emelex never follows symlinks: "
                + fix.format(real=os.path.realpath(path))
            )


def check_no_symlink_loop(path: Path, *, what: str) -> None:
    """Raise `InsecurePathError` naming the first component of the absolute `path` that is a symlink which never
    resolves (it loops, directly or through others), so that a failure further down the path is not blamed on the
    file opened there. Other symlinks are left to `check_no_symlinks`; components that do not exist end the check."""
    current = Path(path.anchor)
    for part in path.parts[1:]:
        current = current / part
        try:
            if not stat.S_ISLNK(os.lstat(current).st_mode):
                continue
            os.stat(current)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise file_error(exc, current, f"checking {what} {path} for symlinks") from exc
            try:
                target = os.readlink(current)
            except OSError:
                target = "?"
            where = "is a symlink" if current == path else f"lies under {current}, a symlink"
            raise InsecurePathError(
                f"{what} {path} {where} that loops ({current} -> {target} never reaches a directory); Emelex never "
                "follows symlinks: remove the loop, or set EMELEX_HOME to a real directory"
            ) from None


def check_home(home: Path) -> None:
    """Refuse an Emelex Home that is, or lies under, a symlink (see `check_no_symlinks`)."""
    check_no_symlinks(home, what="Emelex Home", fix="set EMELEX_HOME to {real}")


def check_private_dir(path: Path) -> os.stat_result:
    """Verify `path` is a real directory owned by the current user and not group/world-writable.

    Returns its `lstat`; raises `InsecurePathError` otherwise.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InsecurePathError(f"directory {path} does not exist; create it (mode 0700) or use another path") from None
    except OSError as exc:
        raise file_error(exc, path, "inspecting it") from exc
    return check_dir_stat(path, st)


def check_dir_stat(path: Path, st: os.stat_result) -> os.stat_result:
    """`check_private_dir` of a directory already stat'ed (an `lstat`, or the `fstat` of an open descriptor)."""
    if stat.S_ISLNK(st.st_mode):
        raise InsecurePathError(f"{path} is a symlink; Emelex only uses real directories: replace it with a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise InsecurePathError(f"{path} is not a directory: move it away (or use another path) so that it can be one")
    if st.st_uid != os.geteuid():
        raise InsecurePathError(f"directory {path} is owned by uid {st.st_uid}, not you (uid {os.geteuid()}): chown it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InsecurePathError(
            f"directory {path} is group- or world-writable (mode {describe_mode(st)}): run `chmod go-w {path}`"
        )
    return st


def ensure_private_dir(path: Path) -> os.stat_result:
    """Create `path` (mode 0700, parents as needed) if missing, then verify it with `check_private_dir`.

    Each directory it creates is made durable: its parent is fsynced after the `mkdir`.
    """
    if not os.path.lexists(path):
        parent = path.parent
        if not os.path.lexists(parent):
            ensure_private_dir(parent)
        try:
            os.mkdir(path, PRIVATE_DIR_MODE)
            os.chmod(path, PRIVATE_DIR_MODE, follow_symlinks=False)
        except FileExistsError:
            pass  # another process made it, and makes it durable
        except OSError as exc:
            raise file_error(exc, path, "creating it") from exc
        else:
            fsync_dir(parent)
    return check_private_dir(path)


def is_private_file(st: os.stat_result) -> bool:
    """Whether a stat (an `lstat`, or the `fstat` of an open descriptor) is a regular file owned by the current
    user with mode exactly 0600."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == PRIVATE_FILE_MODE


def open_for_reading(path: Path) -> int:
    """`os.open` of `path` read-only with `READ_FLAGS`; return the descriptor.

    Raises the `OSError` as it is (`ELOOP` for a symlink at `path`), so that each caller names the failure in
    its own words.
    """
    return os.open(path, READ_FLAGS)


def write_private_file(path: Path, data: bytes) -> None:
    """Create `path` exclusively (mode 0600, never through a symlink) holding `data`, fsynced.

    Its directory is not fsynced (the caller renames the file, or calls `fsync_dir`); the `OSError` of a failed
    create or write is raised as it is, after the descriptor is closed.
    """
    fd = os.open(path, _CREATE_FLAGS, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data` to `fd`, however short each `os.write` is; its `OSError` is raised as it is."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def check_private_file(path: Path, *, what: str = "file") -> os.stat_result | None:
    """Verify an existing `path` is a regular file owned by us with mode exactly 0600.

    Returns its `lstat`, or None when it does not exist; raises `InsecurePathError` otherwise.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise file_error(exc, path, "inspecting it") from exc
    if stat.S_ISLNK(st.st_mode):
        raise InsecurePathError(f"{what} {path} is a symlink; Emelex never follows them: replace it with the real file")
    if not stat.S_ISREG(st.st_mode):
        raise InsecurePathError(
            f"{what} {path} is not a regular file (a directory, FIFO or device?): move it away, then restore the "
            "real file or let Emelex create it"
        )
    if st.st_uid != os.geteuid():
        raise InsecurePathError(f"{what} {path} is owned by uid {st.st_uid}, not you (uid {os.geteuid()}): chown it")
    if stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE:
        raise InsecurePathError(f"{what} {path} has mode {describe_mode(st)}, expected 0600: run `chmod 600 {path}`")
    return st


def create_private_file(path: Path) -> None:
    """Create an empty mode-0600 file exclusively, never following a symlink; fsync its directory."""
    try:
        write_private_file(path, b"")
    except OSError as exc:
        raise file_error(exc, path, "creating it") from exc
    fsync_dir(path.parent)


def open_private_file(path: Path, flags: int) -> int:
    """Open (creating 0600 if absent) a private file without following symlinks; verify it; return the fd.

    Opened non-blocking, so a FIFO or device at `path` is refused instead of blocking the open. A file it
    creates is made durable: its directory is fsynced after the creation.
    """
    flags |= os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    created = True
    try:
        try:
            fd = os.open(path, flags | os.O_EXCL, PRIVATE_FILE_MODE)
        except FileExistsError:  # a symlink too: the open below refuses it
            created = False
            fd = os.open(path, flags, PRIVATE_FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InsecurePathError(f"{path} is a symlink; Emelex never follows them: remove it") from None
        raise file_error(exc, path, "opening it") from exc
    try:
        if created:
            fsync_dir(path.parent)
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise file_error(exc, path, "inspecting it") from exc
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
            raise InsecurePathError(f"{path} is not a regular file owned by you: remove it")
        if stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE:
            raise InsecurePathError(f"{path} has mode {describe_mode(st)}, expected 0600: run `chmod 600 {path}`")
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: Path) -> None:
    """fsync a directory so a newly created or renamed entry in it is durable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise file_error(exc, path, "syncing it") from exc
