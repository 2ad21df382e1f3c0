"""A power-loss simulator for tests: record what the code under test made durable, then drop everything else.

`PowerLoss` watches one directory tree (`root`) through two shims installed together: wrappers of the `os`
calls Emelex's file code goes through (`open`, `write`, `pwrite`, `ftruncate`, `fsync`, `rename`, `replace`,
`link`, `unlink`, `mkdir`, `rmdir`; by path or by name relative to a directory descriptor) and an `apsw.VFS`
registered as SQLite's default, which sees SQLite's own writes, syncs and deletes. It keeps the durable state a
disk would have after a power cut, following POSIX:

- a file's bytes are durable as of its last `fsync` (a file never fsynced is empty after the cut);
- a directory's entries (which name points to which file or directory) are durable as of its last `fsync`,
  whole (so an entry created, renamed or removed since is undone); SQLite fsyncs the directory of a journal or
  WAL file it created, and of a journal it deletes with `synchronous=EXTRA`, and the VFS records just that;
- everything under `root` when the simulator starts is durable.

Files and directories are followed by inode, so a rename or a hard link keeps its content. `cut_at(n)` arms a
cut at the `n`-th mutating call (0-based) under `root`: that call and every later one raise `Cut`, as if the
machine stopped there. `power_off()` then rewrites `root` to its durable state (uninstall first: use the
`simulated` context manager). Only mutating calls count, so the same operation on the same tree counts the same
number of calls on every run, and a seeded choice of cut points is deterministic. The durable state changes only
at an fsync (`syncs` lists them), so cutting just before each fsync, and after the last call, reaches every state
a cut anywhere can leave. The fsyncs themselves are
recorded, not made: the durable state is the simulator's, and a test cutting at hundreds of points stays fast.
"""

from __future__ import annotations

import gc
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from . import call_path
from .vfs_faults import file_kind


class Cut(BaseException):
    """The simulated power cut: raised by the mutating call it falls on and by every later one."""


_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC


class PowerLoss:
    """The durable state of the tree `root`, updated by the shims; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.realpath(root)
        self.ids: dict[tuple[int, int], int] = {}  # (device, inode) -> the object it holds now
        self.content: dict[int, bytes] = {}  # object -> its durable bytes (absent: never fsynced)
        self.entries: dict[int, dict[str, tuple[int, bool]]] = {}  # directory object -> durable name -> (object, dir)
        self.calls = 0  # mutating calls under root so far
        self.syncs: list[int] = []  # the calls among them that were fsyncs
        self.at: int | None = None
        self.cut = False
        self._next = 0
        self._record_tree(self.root)

    # -- bookkeeping ----------------------------------------------------------

    def _inside(self, path: str | None) -> bool:
        return path is not None and (path == self.root or path.startswith(self.root + os.sep))

    def _id(self, st: os.stat_result, *, fresh: bool = False) -> int:
        key = (st.st_dev, st.st_ino)
        if fresh or key not in self.ids:
            self._next += 1
            self.ids[key] = self._next
        return self.ids[key]

    def _record_tree(self, path: str) -> None:
        self.sync_dir(path)
        for name in os.listdir(path):
            child = os.path.join(path, name)
            st = os.lstat(child)
            if stat.S_ISDIR(st.st_mode):
                self._record_tree(child)
            elif stat.S_ISREG(st.st_mode):
                self.sync_file(child)

    def tick(self, path: str | None, *, sync: bool = False) -> None:
        """Count one mutating call on `path` (`sync`: an fsync, which may change the durable state); raise `Cut` at
        and after the armed call."""
        if not self._inside(path):
            return
        if self.cut:
            raise Cut(path)
        if self.at is not None and self.calls >= self.at:
            self.cut = True
            raise Cut(path)
        if sync:
            self.syncs.append(self.calls)
        self.calls += 1

    def cut_at(self, n: int | None) -> None:
        """Cut the power at the `n`-th mutating call under root (None: never)."""
        self.at = n

    def created(self, path: str) -> None:
        """`path` was just created: its inode holds a new object (an inode number can be reused)."""
        if self._inside(path) and not self.cut:
            self._id(os.lstat(path), fresh=True)

    def sync_file(self, path: str, opened: str | None = None) -> None:
        """The file at `path` (reached through `opened`, default `path`) was fsynced: its current bytes are
        durable."""
        if self._inside(path) and not self.cut:
            with open(opened or path, "rb") as f:
                self.content[self._id(os.fstat(f.fileno()))] = f.read()

    def sync_dir(self, path: str) -> None:
        """The directory at `path` was fsynced: its current entries are durable."""
        if not self._inside(path) or self.cut:
            return
        listing = {}
        for name in os.listdir(path):
            st = os.lstat(os.path.join(path, name))
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                listing[name] = (self._id(st), stat.S_ISDIR(st.st_mode))
        self.entries[self._id(os.lstat(path))] = listing

    def sync_fd(self, fd: int) -> None:
        """`fd` was fsynced: a file's bytes, or a directory's entries, are durable."""
        path = os.readlink(f"/proc/self/fd/{fd}")
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            self.sync_dir(path)
        elif stat.S_ISREG(os.fstat(fd).st_mode):
            self.sync_file(path.removesuffix(" (deleted)"), f"/proc/self/fd/{fd}")

    # -- the cut --------------------------------------------------------------

    def power_off(self) -> None:
        """Replace the tree under root by its durable state. Call with the shims uninstalled."""
        self.cut = True
        image = self._image(self.ids[_key(self.root)], depth=0)
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        self._write(self.root, image)

    def _image(self, directory: int, depth: int) -> dict[str, bytes | dict]:
        assert depth < 40, "a directory cycle in the durable state"
        out: dict[str, bytes | dict] = {}
        for name, (obj, is_dir) in self.entries.get(directory, {}).items():
            out[name] = self._image(obj, depth + 1) if is_dir else self.content.get(obj, b"")
        return out

    def _write(self, path: str, image: dict[str, bytes | dict]) -> None:
        for name, value in image.items():
            child = os.path.join(path, name)
            if isinstance(value, dict):
                os.mkdir(child, 0o700)
                self._write(child, value)
            else:
                fd = os.open(child, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, value)
                finally:
                    os.close(fd)


def _key(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def _fd_path(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class _DurableVFS(apsw.VFS):
    """SQLite's default VFS, telling a `PowerLoss` what SQLite writes and makes durable."""

    def __init__(self, loss: PowerLoss) -> None:
        self.loss = loss
        self.base = apsw.vfs_names()[0]
        super().__init__("power-loss", self.base, makedefault=True)

    def xOpen(self, name, flags):  # noqa: N802 - the VFS method name
        return _DurableFile(self, name, flags)

    def xDelete(self, name, syncdir):  # noqa: N802
        path = os.path.abspath(name)
        self.loss.tick(path, sync=bool(syncdir))
        super().xDelete(name, syncdir)
        if syncdir:
            self.loss.sync_dir(os.path.dirname(path))


class _DurableFile(apsw.VFSFile):
    def __init__(self, vfs: _DurableVFS, name, flags) -> None:
        self._loss = vfs.loss
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
        self._path = os.path.abspath(filename) if filename else None
        self._kind = file_kind(filename)
        new = self._path is not None and not os.path.lexists(self._path)
        if new:
            self._loss.tick(self._path)
        super().__init__(vfs.base, name, flags)
        self._dirsync = False
        if new and os.path.lexists(self._path):
            self._loss.created(self._path)
            self._dirsync = self._kind in ("journal", "wal")  # SQLite fsyncs their directory at their first sync

    def xLock(self, level):  # noqa: N802 - see tests/vfs_faults.py FaultyFile.xLock
        try:
            return super().xLock(level)
        except apsw.IOError:
            raise apsw.BusyError("the exclusive lock was refused") from None

    def xWrite(self, data, offset):  # noqa: N802
        if self._kind != "shm":
            self._loss.tick(self._path)
        return super().xWrite(data, offset)

    def xTruncate(self, newsize):  # noqa: N802
        self._loss.tick(self._path)
        return super().xTruncate(newsize)

    def xSync(self, flags):  # noqa: N802
        self._loss.tick(self._path, sync=True)
        if not self._loss._inside(self._path):
            return super().xSync(flags)
        if self._path is not None:
            self._loss.sync_file(self._path)
            if self._dirsync:
                self._dirsync = False
                self._loss.sync_dir(os.path.dirname(self._path))


@contextmanager
def simulated(root: Path, monkeypatch) -> Iterator[PowerLoss]:
    """Install both shims for `root` for the block and yield the `PowerLoss`; they are removed on leaving it. Once
    the power was cut, whatever the block raises is swallowed (a machine that lost power reports nothing): check
    `loss.cut`. Call `power_off()` after the block."""
    loss = PowerLoss(root)
    real = {name: getattr(os, name) for name in (
        "open", "write", "pwrite", "ftruncate", "fsync", "rename", "replace", "link", "unlink", "mkdir", "rmdir")}

    def open_(path, flags, mode=0o777, *, dir_fd=None):
        where = call_path(path, dir_fd)
        new = bool(flags & os.O_CREAT) and not os.path.lexists(where)
        if flags & _WRITES:
            loss.tick(where)
        fd = real["open"](path, flags, mode, dir_fd=dir_fd)
        if new:
            loss.created(where)
        return fd

    def write(fd, data):
        loss.tick(_fd_path(fd))
        return real["write"](fd, data)

    def pwrite(fd, data, offset):
        loss.tick(_fd_path(fd))
        return real["pwrite"](fd, data, offset)

    def ftruncate(fd, length):
        loss.tick(_fd_path(fd))
        return real["ftruncate"](fd, length)

    def fsync(fd):
        path = _fd_path(fd)
        if not loss._inside(path):
            return real["fsync"](fd)
        loss.tick(path, sync=True)
        loss.sync_fd(fd)  # recorded, not done: the durable state is the simulator's (and much faster)

    def moving(name):
        def move(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
            loss.tick(call_path(dst, dst_dir_fd))
            real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return move

    def link(src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
        loss.tick(call_path(dst, dst_dir_fd))
        real["link"](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks)

    def removing(name):
        def remove(path, *, dir_fd=None):
            loss.tick(call_path(path, dir_fd))
            real[name](path, dir_fd=dir_fd)
        return remove

    def mkdir(path, mode=0o777, *, dir_fd=None):
        where = call_path(path, dir_fd)
        loss.tick(where)
        real["mkdir"](path, mode, dir_fd=dir_fd)
        loss.created(where)

    shims = {"open": open_, "write": write, "pwrite": pwrite, "ftruncate": ftruncate, "fsync": fsync,
             "rename": moving("rename"), "replace": moving("replace"), "link": link, "unlink": removing("unlink"),
             "rmdir": removing("rmdir"), "mkdir": mkdir}
    vfs = _DurableVFS(loss)
    try:
        with monkeypatch.context() as patch:
            for name, shim in shims.items():
                patch.setattr(os, name, shim)
            try:
                yield loss
            except BaseException:
                if not loss.cut:
                    raise
    finally:
        gc.collect()  # connections the cut left unclosed, before their VFS goes
        vfs.unregister()
