"""Bounded asset collection, coordinated with publication through the SQLite write lock.

Publication (`put_asset`) links the finished file under its digest name and
catalogs it inside one `BEGIN IMMEDIATE` transaction; collection deletes
unreferenced catalog entries and removes files that no entry names inside its
own. The two are serialized by the database's write lock, so a publisher
racing a collector either sees the file gone and links it anew, or catalogs it
before the collector looks; a file that ends up referenced is never lost.
Orphaned files (a crash between link and commit) and temporary files are kept
for a grace period; temporary files still being written hold an `flock` and
are skipped whatever their age.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from os import geteuid  # imported by name so tests can pretend to be another user
from pathlib import Path

import apsw

from .assets import TEMP_MIN_AGE_S
from .assets_files import TEMP_SUFFIX
from .directories import Directory

MAX_STRAYS = 20
_SCAN_KEY = "asset_scan_after"  # store_meta: the orphan scan resumes after this file name
TEMP_SCAN_KEY = "asset_temp_scan_after"  # store_meta: the temporary-file scan resumes after this file name
_HEX_NAME = re.compile(r"[0-9a-f]{64}\Z")


@dataclass
class AssetCollection:
    """What one bounded `collect_assets` call did. Call again while `more` is True."""

    removed_entries: int = 0  # catalog entries deleted
    removed_files: int = 0  # asset files removed, orphans included
    removed_orphans: int = 0  # of those, files no catalog entry named
    removed_temp: int = 0  # abandoned temporary files removed
    skipped_locked: int = 0  # old temporary files skipped because a writer still holds them
    deferred_files: int = 0  # files left for a later call because a caller's transaction was open
    freed_bytes: int = 0
    strays: list[str] = field(default_factory=list)  # entries that are not ours to remove (symlinks, odd names)
    more: bool = False  # a limit was reached

    def _stray(self, path: Path) -> None:
        if len(self.strays) < MAX_STRAYS and str(path) not in self.strays:
            self.strays.append(str(path))


def _age(st: os.stat_result, now: float) -> float:
    return now - max(st.st_mtime, st.st_ctime)  # ctime moves when a file is linked under its digest name


def collect_entries(
    conn: apsw.Connection,
    folder: Directory | None,
    cutoff: float,
    limit: int,
    digests: list[str] | None,
    report: AssetCollection,
    *,
    remove_files: bool,
) -> None:
    """Inside a write transaction: delete up to `limit` unreferenced entries untouched since `cutoff`.

    Files whose last entry went are removed from the open asset `folder`
    (None: it does not exist) in the same transaction when `remove_files`,
    otherwise counted as deferred (they become orphans that a later call
    removes).
    """
    if digests is None:
        rows = conn.execute(
            "SELECT digest, media_kind FROM assets WHERE links = 0 AND touched_at <= ? ORDER BY touched_at LIMIT ?",
            (cutoff, limit + 1),
        ).fetchall()
        report.more = report.more or len(rows) > limit
        rows = rows[:limit]
    else:
        rows = [
            r
            for d in digests
            for r in conn.execute(
                "SELECT digest, media_kind FROM assets WHERE digest = ? AND links = 0 AND touched_at <= ?", (d, cutoff)
            )
        ]
    emptied = []
    for digest, media_kind in rows:
        deleted = conn.execute(
            "DELETE FROM assets WHERE digest = ? AND media_kind = ? AND links = 0 AND NOT EXISTS "
            "(SELECT 1 FROM event_assets WHERE digest = ? AND media_kind = ?) RETURNING 1",
            (digest, media_kind, digest, media_kind),
        ).fetchall()
        report.removed_entries += len(deleted)
        if deleted and digest not in emptied:
            emptied.append(digest)
    removed = False
    for digest in emptied:
        if conn.execute("SELECT 1 FROM assets WHERE digest = ?", (digest,)).fetchone():
            continue  # still catalogued under another media kind
        if not remove_files:
            report.deferred_files += 1
        elif folder is not None and _remove_file(folder, digest, report):
            removed = True
    if removed:
        folder.fsync()


def _remove_file(
    folder: Directory, name: str, report: AssetCollection, *, min_age: float | None = None, now: float = 0.0
) -> bool:
    """Remove a regular file we own (older than `min_age`, if given); report anything else as a stray."""
    st = folder.stat(name)
    if st is None:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != geteuid():
        report._stray(folder.path / name)
        return False
    if min_age is not None and _age(st, now) < min_age:
        return False
    folder.unlink(name)
    report.removed_files += 1
    report.freed_bytes += st.st_size
    return True


def _next_batch(
    conn: apsw.Connection, key: str, names: Iterator[str], limit: int, report: AssetCollection
) -> tuple[list[str], str | None]:
    """The next `limit` of `names` after the scan position saved under `key`, in name order, and the new position.

    Holds at most `limit + 1` names whatever the folder's size. The new
    position is None when it is unchanged; it wraps to the start once a batch
    reaches the last name, so repeated calls visit every file (and
    `report.more` says whether this pass has more).
    """
    row = conn.execute("SELECT value FROM store_meta WHERE key = ?", (key,)).fetchone()
    after = row[0] if row else ""
    batch = heapq.nsmallest(limit + 1, (name for name in names if name > after))
    more = len(batch) > limit
    report.more = report.more or more
    batch = batch[:limit]
    position = batch[-1] if more else ""
    return batch, None if position == after else position


def save_scan_position(conn: apsw.Connection, key: str, position: str) -> None:
    """Inside a write transaction: record where the scan under `key` resumes."""
    conn.execute(
        "INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, position),
    )


def _digest_names(folder: Directory, report: AssetCollection) -> Iterator[str]:
    """Stream the digest-named entries of an asset folder, reporting unexpected names as strays."""
    with folder.scandir() as entries:
        for entry in entries:
            if _HEX_NAME.match(entry.name):
                yield entry.name
            elif entry.name != "tmp":
                report._stray(folder.path / entry.name)


def collect_orphans(
    conn: apsw.Connection,
    folder: Directory,
    now: float,
    grace_s: float,
    limit: int,
    digests: list[str] | None,
    report: AssetCollection,
) -> None:
    """Inside a write transaction: remove digest-named files no entry catalogs that are older than the grace."""
    names = digests
    if names is None:
        names, position = _next_batch(conn, _SCAN_KEY, _digest_names(folder, report), limit, report)
        if position is not None:
            save_scan_position(conn, _SCAN_KEY, position)
    removed = False
    for name in names:
        if conn.execute("SELECT 1 FROM assets WHERE digest = ?", (name,)).fetchone():
            continue
        if _remove_file(folder, name, report, min_age=grace_s, now=now):
            report.removed_orphans += 1
            removed = True
    if removed:
        folder.fsync()


def _temp_names(tmp: Directory, report: AssetCollection) -> Iterator[str]:
    """Stream the temporary-file names of a `tmp/` folder, reporting other names as strays."""
    with tmp.scandir() as entries:
        for entry in entries:
            if entry.name.endswith(TEMP_SUFFIX):
                yield entry.name
            else:
                report._stray(tmp.path / entry.name)


def collect_temps(conn: apsw.Connection, tmp: Directory, now: float, limit: int, report: AssetCollection) -> str | None:
    """Examine the next `limit` temporary files of the open `tmp/` folder after the saved scan position; return
    the new position to save.

    Removes those older than one hour that no writer holds locked. Young and
    locked files are passed over and the position moves on, so later calls
    reach the files behind them. Needs no write transaction (the flock
    decides); the caller saves the returned position (None: unchanged) with
    `save_scan_position(conn, TEMP_SCAN_KEY, position)`.
    """
    batch, position = _next_batch(conn, TEMP_SCAN_KEY, _temp_names(tmp, report), limit, report)
    for name in batch:
        st = tmp.stat(name)
        if st is None:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != geteuid():
            report._stray(tmp.path / name)
        elif _age(st, now) >= TEMP_MIN_AGE_S:
            _remove_unlocked(tmp, name, st, report)
    return position


def _remove_unlocked(tmp: Directory, name: str, st: os.stat_result, report: AssetCollection) -> None:
    try:
        fd = tmp.open_file(name, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return  # gone, or replaced by something we do not open
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report.skipped_locked += 1
            return
        held = os.fstat(fd)
        named = tmp.stat(name)
        if named is None:
            return
        if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino) == (named.st_dev, named.st_ino):
            tmp.unlink(name)
            report.removed_temp += 1
            report.freed_bytes += held.st_size
    finally:
        os.close(fd)
