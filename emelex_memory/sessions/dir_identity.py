"""What the platform offers to tell one incarnation of a directory from the next.

Device and inode numbers alone cannot: on ext4, `rm -r ws && mkdir ws`
usually hands the new directory the freed inode number. Two more components
can, where the file system provides them:

- the inode *generation*, bumped each time an inode number is reused; Linux
  reports it through the `FS_IOC_GETVERSION` ioctl on an open descriptor
  (ext2/3/4, XFS and btrfs among others; tmpfs, NFS and most FUSE file
  systems do not);
- the *birth time*: `st_birthtime` on macOS and the BSDs, `statx`'s
  `stx_btime` on Linux (called through the C library, as Python 3.11 has no
  `os.statx`). Its resolution is the kernel's coarse clock tick, so it alone
  can miss a replacement made within the same few milliseconds.

Each reader returns None when the platform or the file system does not offer
its component; callers then compare the components known on both sides.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
import sys

_LONG = struct.calcsize("l")
# _IOR('v', 1, long), 0x80087601 on 64-bit Linux; the file systems write the generation as a 32-bit int.
FS_IOC_GETVERSION = (2 << 30) | (_LONG << 16) | (ord("v") << 8) | 1
_AT_EMPTY_PATH = 0x1000
_STATX_BTIME = 0x800
_UNSUPPORTED = {errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF, errno.EPERM, errno.EACCES}


class _StatxTimestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_reserved", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    """`struct statx` from linux/stat.h (fixed-width fields: the same layout on every architecture)."""

    _fields_ = [
        ("stx_mask", ctypes.c_uint32), ("stx_blksize", ctypes.c_uint32), ("stx_attributes", ctypes.c_uint64),
        ("stx_nlink", ctypes.c_uint32), ("stx_uid", ctypes.c_uint32), ("stx_gid", ctypes.c_uint32),
        ("stx_mode", ctypes.c_uint16), ("_spare0", ctypes.c_uint16), ("stx_ino", ctypes.c_uint64),
        ("stx_size", ctypes.c_uint64), ("stx_blocks", ctypes.c_uint64), ("stx_attributes_mask", ctypes.c_uint64),
        ("stx_atime", _StatxTimestamp), ("stx_btime", _StatxTimestamp), ("stx_ctime", _StatxTimestamp),
        ("stx_mtime", _StatxTimestamp), ("stx_rdev_major", ctypes.c_uint32), ("stx_rdev_minor", ctypes.c_uint32),
        ("stx_dev_major", ctypes.c_uint32), ("stx_dev_minor", ctypes.c_uint32), ("_spare2", ctypes.c_uint64 * 14),
    ]


def _libc_statx():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx  # glibc >= 2.28, musl >= 1.2.5
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_Statx)]
    fn.restype = ctypes.c_int
    return fn


_statx = _libc_statx()


def generation(fd: int) -> int | None:
    """The inode generation of the open file `fd`, or None where the platform or file system has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        raw = fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(_LONG))
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return None
        raise
    return struct.unpack("=I", raw[:4])[0]


def birth_ns(fd: int, st: os.stat_result) -> int | None:
    """The birth time in nanoseconds of the open file `fd` (whose `fstat` is `st`), or None when unknown.

    A birth time of exactly zero is what ext4 reports for inodes too small to
    record one, so it counts as unknown.
    """
    born = getattr(st, "st_birthtime", None)
    if born is not None:  # macOS and the BSDs
        return int(born * 1_000_000_000) or None
    if _statx is None:
        return None
    buf = _Statx()
    if _statx(fd, b"", _AT_EMPTY_PATH, _STATX_BTIME, ctypes.byref(buf)) != 0:
        return None
    if not buf.stx_mask & _STATX_BTIME:
        return None
    return buf.stx_btime.tv_sec * 1_000_000_000 + buf.stx_btime.tv_nsec or None
