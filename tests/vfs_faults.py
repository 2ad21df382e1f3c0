"""An `apsw.VFS` shim that makes chosen SQLite file operations fail on demand, for I/O fault tests.

`FaultVFS` inherits every operation from the default VFS and is made the
default itself, so connections opened while it is installed (the store's
included) go through it. `arm(op, suffix)` makes the next `op` ("write",
"sync", "read" or "truncate") on a file whose name ends with `suffix` (e.g.
"-wal") raise `apsw.IOError`; `after=n` lets n such calls through first.
Each armed fault fires once. Use it as a context manager:

    with FaultVFS() as vfs:
        store = MemoryStore.open_path(...)
        vfs.arm("sync", "-wal")
        ...
        store.close()

Close every connection opened through it before the block ends: leaving the
block unregisters the VFS.
"""

from __future__ import annotations

import apsw

OPS = ("write", "sync", "read", "truncate")


class FaultVFS(apsw.VFS):
    """The default VFS, with faults injected where `arm` says."""

    def __init__(self, name: str = "emelex-faults") -> None:
        self.base_name = apsw.vfs_names()[0]  # the default VFS before this one is registered
        self._armed: list[list] = []  # [op, suffix, calls still let through]
        self.fired: list[tuple[str, str]] = []  # (op, file name) of every fault raised
        super().__init__(name, self.base_name, makedefault=True)

    def arm(self, op: str, suffix: str = "", *, after: int = 0) -> None:
        """Make the (after+1)-th next `op` on a file whose name ends with `suffix` raise `apsw.IOError`, once."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {op!r}")
        self._armed.append([op, suffix, after])

    def disarm(self) -> None:
        """Forget every fault not yet fired."""
        self._armed.clear()

    def check(self, op: str, filename: str) -> None:
        """Called by each file before `op`: raise the first armed fault that matches."""
        for fault in self._armed:
            if fault[0] == op and filename.endswith(fault[1]):
                if fault[2] > 0:
                    fault[2] -= 1
                    return
                self._armed.remove(fault)
                self.fired.append((op, filename))
                raise apsw.IOError(f"injected {op} fault on {filename}")

    def xOpen(self, name, flags):  # noqa: N802 - apsw's method name
        return FaultFile(self, name, flags)

    def __enter__(self) -> FaultVFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()


class FaultFile(apsw.VFSFile):
    """A file of the default VFS that asks its `FaultVFS` before each write, sync, read and truncate."""

    def __init__(self, vfs: FaultVFS, name, flags) -> None:
        self._vfs = vfs
        self._name = name if isinstance(name, str) else (name.filename() if name is not None else "")
        super().__init__(vfs.base_name, name, flags)

    def xWrite(self, data, offset):  # noqa: N802
        self._vfs.check("write", self._name)
        return super().xWrite(data, offset)

    def xSync(self, flags):  # noqa: N802
        self._vfs.check("sync", self._name)
        return super().xSync(flags)

    def xRead(self, amount, offset):  # noqa: N802
        self._vfs.check("read", self._name)
        return super().xRead(amount, offset)

    def xTruncate(self, newsize):  # noqa: N802
        self._vfs.check("truncate", self._name)
        return super().xTruncate(newsize)

    def xLock(self, level):  # noqa: N802
        # A read-only connection's close asks for an exclusive lock it cannot have (SQLITE_IOERR_LOCK), which
        # SQLite ignores; apsw would report the exception anyway, so it is passed on as "busy", ignored the same way.
        try:
            return super().xLock(level)
        except apsw.IOError as exc:
            if exc.extendedresult != apsw.SQLITE_IOERR_LOCK:
                raise
            raise apsw.BusyError("lock not available") from None
