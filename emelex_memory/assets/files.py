"""Asset files: capped streaming writes into locked temporary files, and verified reads.

A write streams its source into a fresh mode-0600 file in the asset folder's
`tmp/` subfolder, created exclusively and without following symlinks, holding
an exclusive `flock` on it for as long as it exists (collection skips locked
files), hashing as it goes and stopping at the cap. Reads open the digest-named
file without following symlinks and check type, owner, mode, size and SHA-256
before handing out a byte. Every file is reached by name through the open
`Directory` of its folder (see `core/directories.py`), never by a path, so a folder
or parent swapped for a symlink cannot redirect a write or a read.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from os import geteuid  # imported by name so tests can pretend to be another user
from pathlib import Path
from typing import BinaryIO

from ..core.directories import Directory
from ..errors import AssetMissingError, AssetTamperedError, AssetTooLargeError, InsecurePathError, InvalidAssetError
from ..core.private_files import PRIVATE_FILE_MODE, describe_mode, write_all
from ..core.io_errors import file_error

CHUNK_BYTES = 1024 * 1024
TEMP_SUFFIX = ".part"
_BYTES_LIKE = (bytes, bytearray, memoryview)

AssetSource = bytes | bytearray | memoryview | BinaryIO | Iterable[bytes]


def temp_name() -> str:
    """A fresh, unguessable temporary file name."""
    return secrets.token_hex(16) + TEMP_SUFFIX


def _byte_views(chunk: bytes | bytearray | memoryview) -> Iterator[memoryview]:
    """Yield a bytes-like value as flat byte views; a strided 1-D memoryview is copied in slices of at most 1 MiB."""
    try:
        view = memoryview(chunk)
    except ValueError:
        raise InvalidAssetError("the asset data is a released memoryview; pass a live buffer") from None
    if view.c_contiguous:
        yield view.cast("B")
    elif view.ndim == 1:
        step = max(1, CHUNK_BYTES // view.itemsize)
        for start in range(0, len(view), step):
            yield memoryview(view[start : start + step].tobytes())
    else:
        raise InvalidAssetError(
            f"the asset data is a non-contiguous {view.ndim}-dimensional memoryview; pass view.tobytes() instead"
        )


def _chunks(data: AssetSource, cap: int) -> Iterator[memoryview]:
    """Yield the source as byte chunks; stop reading a stream once more than `cap` bytes were seen."""
    if isinstance(data, _BYTES_LIKE):
        yield from _byte_views(data)
        return
    if isinstance(data, str):
        raise InvalidAssetError("asset data must be bytes, a binary file object or an iterable of bytes, not str")
    read = getattr(data, "read", None)
    if read is not None:
        seen = 0
        while seen <= cap:
            try:
                chunk = read(CHUNK_BYTES)
            except OSError as exc:
                raise file_error(exc, getattr(data, "name", "the asset stream"), "reading the asset data") from exc
            if not isinstance(chunk, _BYTES_LIKE):
                raise InvalidAssetError(f"the asset stream returned {type(chunk).__name__}; open it in binary mode")
            if not chunk:
                return
            for view in _byte_views(chunk):
                seen += len(view)
                yield view
        return
    try:
        chunks = iter(data)
    except TypeError:
        raise InvalidAssetError(
            f"asset data is a {type(data).__name__}; pass bytes, a binary file object or an iterable of bytes"
        ) from None
    for chunk in chunks:
        if not isinstance(chunk, _BYTES_LIKE):
            raise InvalidAssetError(f"an asset data chunk is a {type(chunk).__name__}, expected bytes")
        yield from _byte_views(chunk)


class TempAsset:
    """A fully written, fsynced and flock-held temporary file `name` in the folder `tmp`; `discard()` removes it
    and drops the lock."""

    def __init__(self, tmp: Directory, name: str, fd: int, digest: str, size: int) -> None:
        self.tmp = tmp
        self.name = name
        self.fd = fd
        self.digest = digest
        self.size = size

    @property
    def path(self) -> Path:
        """Where the file is, for messages."""
        return self.tmp.path / self.name

    def discard(self) -> None:
        """Unlink the temporary file (if still there), then close it, which releases the flock."""
        try:
            self.tmp.unlink(self.name)
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)


def write_temp(tmp: Directory, data: AssetSource, cap: int) -> TempAsset:
    """Stream `data` into a new locked temporary file in the folder `tmp`, hashing it and enforcing `cap`.

    Raises `AssetTooLargeError` past the cap, `InvalidAssetError` for a bad
    source, and `AssetTamperedError` if the name is taken (e.g. a planted
    symlink); on any error the temporary file is gone.
    """
    name = temp_name()
    path = tmp.path / name
    try:
        fd = tmp.open_file(name, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        raise AssetTamperedError(f"temporary asset file {path} already exists (planted?); remove it") from None
    temp = TempAsset(tmp, name, fd, "", 0)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.fchmod(fd, PRIVATE_FILE_MODE)
        except OSError as exc:
            raise file_error(exc, path, "creating the temporary asset file") from exc
        hasher = hashlib.sha256()
        size = 0
        for chunk in _chunks(data, cap):
            size += len(chunk)
            if size > cap:
                raise AssetTooLargeError(
                    f"the asset is larger than the {cap // (1024 * 1024)} MiB cap; nothing was stored"
                )
            hasher.update(chunk)
            _write_all(fd, chunk, path)
        try:
            os.fsync(fd)
        except OSError as exc:
            raise file_error(exc, path, "syncing the temporary asset file") from exc
    except BaseException:
        temp.discard()
        raise
    temp.digest, temp.size = hasher.hexdigest(), size
    return temp


def _write_all(fd: int, chunk: memoryview, path: Path) -> None:
    try:
        write_all(fd, chunk)
    except OSError as exc:
        raise file_error(exc, path, "writing the temporary asset file") from exc


def signature(st: os.stat_result) -> tuple[int, ...]:
    """What identifies one version of a file: device, inode, size, mtime and ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_MOVE_AWAY = "move it away, then put the original bytes again"


def _tampered(digest: str, path: Path, what: str, remedy: str = _MOVE_AWAY) -> AssetTamperedError:
    return AssetTamperedError(f"asset {digest} at {path} {what}; {remedy}")


def _check_stat(st: os.stat_result, digest: str, size: int, path: Path) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _tampered(digest, path, "is a symlink")
    if not stat.S_ISREG(st.st_mode):
        raise _tampered(digest, path, "is not a regular file")
    if st.st_uid != geteuid():
        raise _tampered(
            digest, path, f"is owned by uid {st.st_uid}, not you (uid {geteuid()})",
            f"run `chown {geteuid()} {path}` (reads still verify its content), or {_MOVE_AWAY}",
        )
    if stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE:
        raise _tampered(digest, path, f"has mode {describe_mode(st)}, expected 0600", f"run `chmod 600 {path}`")
    if st.st_size != size:
        raise _tampered(digest, path, f"holds {st.st_size} bytes, expected {size}")


def stat_asset(folder: Directory, digest: str, size: int) -> os.stat_result:
    """Cheap check of the asset file `digest` in `folder` without reading it: type, owner, mode and size.

    Raises typed errors."""
    path = folder.path / digest
    st = folder.stat(digest)
    if st is None:
        raise AssetMissingError(
            f"asset {digest} is catalogued but its file {path} is missing; put the same bytes again or restore a backup"
        )
    _check_stat(st, digest, size, path)
    return st


def open_checked(folder: Directory, digest: str, size: int) -> io.FileIO:
    """Open the asset file `digest` in `folder` without following symlinks or blocking, and check type, owner,
    mode and size (not yet the hash)."""
    path = folder.path / digest
    try:
        fd = folder.open_file(digest, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        stat_asset(folder, digest, size)  # raises AssetMissingError
        raise file_error(exc, path, "opening the asset file") from exc  # it reappeared meanwhile
    except InsecurePathError:  # the name is a symlink (`O_NOFOLLOW`)
        raise _tampered(digest, path, "is a symlink") from None
    try:
        file = io.FileIO(fd, "rb", closefd=True)
    except OSError as exc:
        os.close(fd)
        raise file_error(exc, path, "opening the asset file") from exc
    try:
        _check_stat(_fstat(fd, path), digest, size, path)
    except BaseException:
        file.close()
        raise
    return file


def _fstat(fd: int, path: Path) -> os.stat_result:
    try:
        return os.fstat(fd)
    except OSError as exc:
        raise file_error(exc, path, "inspecting the asset file") from exc


def _read_exactly(file: io.FileIO, size: int, digest: str, path: Path) -> Iterator[bytes]:
    """Yield the file's `size` bytes in chunks; raise if it turns out shorter or longer."""
    left = size
    while left:
        chunk = _read(file, min(left, CHUNK_BYTES), path)
        if not chunk:
            raise _tampered(digest, path, f"ended {left} bytes early")
        left -= len(chunk)
        yield chunk
    if _read(file, 1, path):
        raise _tampered(digest, path, f"holds more than {size} bytes")


def _read(file: io.FileIO, amount: int, path: Path) -> bytes:
    try:
        return file.read(amount)
    except OSError as exc:
        raise file_error(exc, path, "reading the asset file") from exc


def check_content(file: io.FileIO, digest: str, size: int, path: Path) -> None:
    """Hash the open file from the start; raise `AssetTamperedError` unless it is exactly the expected bytes."""
    try:
        file.seek(0)
    except OSError as exc:
        raise file_error(exc, path, "reading the asset file") from exc
    hasher = hashlib.sha256()
    for chunk in _read_exactly(file, size, digest, path):
        hasher.update(chunk)
    if hasher.hexdigest() != digest:
        raise _tampered(digest, path, "does not hash to its name (corrupted or replaced content)")


def verify_file(folder: Directory, digest: str, size: int) -> os.stat_result:
    """Fully verify the asset file `digest` in `folder` (type, owner, mode, size, SHA-256); return its stat.

    Raises typed errors."""
    with open_checked(folder, digest, size) as file:
        check_content(file, digest, size, folder.path / digest)
        return _fstat(file.fileno(), folder.path / digest)


def read_verified(folder: Directory, digest: str, size: int) -> bytes:
    """Read the whole asset file `digest` in `folder`, returning its bytes only if every check and the SHA-256
    pass."""
    path = folder.path / digest
    with open_checked(folder, digest, size) as file:
        data = b"".join(_read_exactly(file, size, digest, path))
    if hashlib.sha256(data).hexdigest() != digest:
        raise _tampered(digest, path, "does not hash to its name (corrupted or replaced content)")
    return data


class VerifiedAssetReader(io.RawIOBase):
    """A read-only binary stream over an asset verified when opened, and re-hashed as it is read.

    If the file changes after it was opened, the read that reaches the end
    raises `AssetTamperedError` instead of returning normally. Use it as a
    context manager or call `close()`.
    """

    def __init__(self, file: io.FileIO, digest: str, size: int, path: Path) -> None:
        """Wrap an already verified file positioned at its start; use `MemoryStore.open_asset` instead."""
        super().__init__()
        self._file = file
        self._digest = digest
        self._left = size
        self._size = size
        self._path = path
        self._hasher = hashlib.sha256()

    def readable(self) -> bool:
        """Always True."""
        return True

    def readinto(self, buffer) -> int:
        """Read up to `len(buffer)` bytes into `buffer`; return how many (0 at the verified end)."""
        view = memoryview(buffer).cast("B")
        if not self._left:
            if self._hasher is not None:
                finished, self._hasher = self._hasher, None
                if _read(self._file, 1, self._path) or finished.hexdigest() != self._digest:
                    raise _tampered(self._digest, self._path, "changed while it was being read")
            return 0
        try:
            n = self._file.readinto(view[: min(len(view), self._left)]) or 0
        except OSError as exc:
            raise file_error(exc, self._path, "reading the asset file") from exc
        if n == 0:
            raise _tampered(self._digest, self._path, f"ended {self._left} bytes early while being read")
        self._hasher.update(view[:n])
        self._left -= n
        return n

    def readall(self) -> bytes:
        """Read to the end, verifying the content."""
        parts = []
        while chunk := self.read(CHUNK_BYTES):
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Close the underlying file."""
        if not self.closed:
            self._file.close()
        super().close()
