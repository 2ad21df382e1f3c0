"""A fault-injecting SQLite VFS for tests: fail one chosen file call of one kind of file at one call index.

`FaultyVFS` inherits every routine from the platform's default VFS (looked up by name before it registers
itself as the default, so it never inherits from itself) and wraps each file in a `FaultyFile` that counts the
calls a test has armed it for. Once armed with a `Fault`, the `at`-th matching call (0-based, counted from the
arming) raises the fault's apsw exception instead of doing the I/O, which SQLite sees exactly as an operating
system failure (`apsw.IOError` -> `SQLITE_IOERR`, `apsw.FullError` -> `SQLITE_FULL`). Registered with
`makedefault=True`, so every connection the code under test opens (the store's, the zero-wait ones, a doctor's)
goes through it. Use the `faulty_vfs` fixture (tests/conftest.py), which unregisters it again, or `installed()`
in a child process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import apsw

FILE_METHODS = ("xRead", "xWrite", "xSync", "xTruncate", "xFileSize")


def file_kind(name: str | None) -> str:
    """The kind of an SQLite file by its name: "wal", "shm", "journal", "temp" (no name) or "db" (main database)."""
    if name is None:
        return "temp"
    for suffix in ("wal", "shm", "journal"):
        if name.endswith(f"-{suffix}"):
            return suffix
    return "db"


@dataclass(frozen=True)
class Fault:
    """Fail the `at`-th call (0-based, from arming) of `method` on files of `kind` with `error`, `times` times
    in a row (0: every matching call from then on)."""

    method: str
    kind: str = "db"
    at: int = 0
    error: type[apsw.Error] = apsw.IOError
    times: int = 1

    def __post_init__(self) -> None:
        if self.method not in FILE_METHODS:
            raise ValueError(f"method must be one of {FILE_METHODS}, got {self.method!r}")


class FaultyVFS(apsw.VFS):
    """The default VFS with injectable faults; see the module docstring."""

    def __init__(self, name: str = "faulty") -> None:
        self.base = apsw.vfs_names()[0]  # the real default, before this one takes its place
        self._lock = threading.Lock()
        self._fault: Fault | None = None
        self.calls = 0  # matching calls seen since arming
        self.fired = 0  # faults raised since arming
        super().__init__(name, self.base, makedefault=True)

    def arm(self, fault: Fault) -> None:
        """Start counting calls that match `fault` from zero."""
        with self._lock:
            self._fault, self.calls, self.fired = fault, 0, 0

    def disarm(self) -> None:
        """Stop injecting faults (the counters keep their values)."""
        with self._lock:
            self._fault = None

    def check(self, method: str, kind: str) -> None:
        """Called by every file before `method`: raise the armed fault when this is a call it targets."""
        fault = self._fault
        if fault is None or fault.method != method or fault.kind != kind:
            return
        with self._lock:
            index = self.calls
            self.calls += 1
            if index >= fault.at and (fault.times == 0 or index < fault.at + fault.times):
                self.fired += 1
                raise fault.error(f"injected {method} fault on a {kind} file (call {index})")

    def xOpen(self, name, flags):  # noqa: N802 - the VFS method name
        """Open the file through the base VFS, wrapped so its calls can fail."""
        return FaultyFile(self, name, flags)


class FaultyFile(apsw.VFSFile):
    """A base-VFS file whose counted calls consult its `FaultyVFS` first."""

    def __init__(self, vfs: FaultyVFS, name, flags) -> None:
        self._vfs = vfs
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name
        self._kind = file_kind(filename)
        super().__init__(vfs.base, name, flags)

    def xLock(self, level):  # noqa: N802
        # A read-only connection that closes last tries an exclusive lock, which its read-only descriptor cannot
        # take (SQLITE_IOERR_LOCK). SQLite ignores that failure, but apsw would still raise the Python exception of
        # a wrapped file afterwards; it stays silent about SQLITE_BUSY, which SQLite treats the same way here.
        try:
            return super().xLock(level)
        except apsw.IOError:
            raise apsw.BusyError("the exclusive lock was refused") from None

    def xRead(self, amount, offset):  # noqa: N802
        self._vfs.check("xRead", self._kind)
        return super().xRead(amount, offset)

    def xWrite(self, data, offset):  # noqa: N802
        self._vfs.check("xWrite", self._kind)
        return super().xWrite(data, offset)

    def xSync(self, flags):  # noqa: N802
        self._vfs.check("xSync", self._kind)
        return super().xSync(flags)

    def xTruncate(self, newsize):  # noqa: N802
        self._vfs.check("xTruncate", self._kind)
        return super().xTruncate(newsize)

    def xFileSize(self):  # noqa: N802
        self._vfs.check("xFileSize", self._kind)
        return super().xFileSize()


@contextmanager
def installed() -> Iterator[FaultyVFS]:
    """Register a `FaultyVFS` as the default for the block; unregister it afterwards (close connections first)."""
    vfs = FaultyVFS()
    try:
        yield vfs
    finally:
        vfs.disarm()
        vfs.unregister()
