"""Bounded asset collection, coordinated with publication through the SQLite write lock.

Publication (`put_asset`) links the finished file under its digest name and
catalogs it inside one `BEGIN IMMEDIATE` transaction. Collection runs the
other way round, in two transactions, so that no crash or failure can leave a
catalog entry without its file:

1. `collect_entries` deletes unreferenced catalog entries and returns the
   digests no entry names any more; that transaction commits. Nothing is
   unlinked yet: if the commit fails or the process dies, the entries either
   stay (with their files) or are gone (leaving orphan files).
2. Only after that commit, `remove_unnamed_files` runs in a second write
   transaction: for each digest it re-checks that no entry names it and only
   then unlinks the file, and fsyncs the folder before committing.

Why a publisher racing a collector never ends with an entry and no file: a
file is unlinked only while the collector holds the database write lock and
after it saw no entry naming the digest. A publisher catalogs only while it
holds the same lock, and only after linking (or finding) the file. So either
the publisher committed first, and the collector sees the entry and keeps the
file, or it takes the lock after the unlink, finds no file and links its own.

A crash at any point leaves at worst orphan files (no entry names them): after
step 1's commit and before an unlink, or after an unlink whose directory fsync
never happened (the name may come back after a power loss). Orphans, like the
file a crashed `put_asset` linked before its commit, are kept for a grace
period and then removed by `collect_orphans`, which re-checks the catalog under
the write lock the same way. Temporary files still being written hold an
`flock` and are skipped whatever their age.
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

from .refs import DEFAULT_GRACE_S, TEMP_MIN_AGE_S
from .files import TEMP_SUFFIX
from ..core.directories import Directory
from ..errors import FileSystemError, InsecurePathError

MAX_STRAYS = 20
# An asset that only an open agent journal names (a completed call's output, stored before its batch is published) is
# as live as a linked one: collection adds this condition (correlated with the `assets` row it considers).
NOT_IN_OPEN_JOURNAL = (
    "NOT EXISTS (SELECT 1 FROM agent_calls c, json_each(c.assets) a "
    "WHERE a.value ->> 0 = assets.digest AND a.value ->> 2 = assets.media_kind)"
)
# An asset a Session's saved model state names (`maintenance/model_states.py`) is kept while that row exists.
NOT_A_MODEL_STATE = (
    "NOT EXISTS (SELECT 1 FROM model_states m WHERE m.digest = assets.digest AND m.media_kind = assets.media_kind)"
)
_SCAN_KEY = "asset_scan_after"  # store_meta: the orphan scan resumes after this file name
TEMP_SCAN_KEY = "asset_temp_scan_after"  # store_meta: the temporary-file scan resumes after this file name
_HEX_NAME = re.compile(r"[0-9a-f]{64}\Z")
_DUE_KEY = "asset_folder_scan_due_at"  # store_meta: when `maintain` next starts a pass over the asset folder
FOLDER_SCAN_INTERVAL_S = DEFAULT_GRACE_S  # orphans wait out a grace period anyway: one pass per period suffices


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
    cutoff: float,
    limit: int,
    digests: list[str] | None,
    report: AssetCollection,
) -> list[str]:
    """Inside a write transaction: delete up to `limit` unreferenced entries untouched since `cutoff`.

    An entry that an open agent journal names (a completed tool call's
    output not yet published), or a saved model state, counts as referenced.

    Returns the digests that no entry names any more. Their files are left
    alone: once this transaction has committed, the caller removes them with
    `remove_unnamed_files` (if it never commits, they stay with their
    entries; if it commits and the caller dies first, they are orphans that a
    later collection removes).
    """
    if digests is None:
        rows = conn.execute(
            f"SELECT digest, media_kind FROM assets WHERE links = 0 AND touched_at <= ? AND {NOT_IN_OPEN_JOURNAL} "
            f"AND {NOT_A_MODEL_STATE} "
            "ORDER BY touched_at LIMIT ?",
            (cutoff, limit + 1),
        ).fetchall()
        report.more = report.more or len(rows) > limit
        rows = rows[:limit]
    else:
        rows = [
            r
            for d in digests
            for r in conn.execute(
                f"SELECT digest, media_kind FROM assets WHERE digest = ? AND links = 0 AND touched_at <= ? "
                f"AND {NOT_IN_OPEN_JOURNAL} AND {NOT_A_MODEL_STATE}", (d, cutoff)
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
    return [d for d in emptied if not conn.execute("SELECT 1 FROM assets WHERE digest = ?", (d,)).fetchone()]


def remove_unnamed_files(
    conn: apsw.Connection,
    folder: Directory,
    names: list[str],
    report: AssetCollection,
    *,
    min_age: float | None = None,
    now: float = 0.0,
) -> int:
    """Inside a write transaction: remove the files among `names` that no catalog entry names; return how many.

    Each name is re-checked against the catalog first, under the write lock a
    publisher needs to catalog it, so a digest catalogued again meanwhile
    keeps its file. With `min_age`, files younger than that (by `now`) stay.
    The folder is fsynced after any removal.
    """
    removed = 0
    for name in names:
        if conn.execute("SELECT 1 FROM assets WHERE digest = ?", (name,)).fetchone():
            continue
        if _remove_file(folder, name, report, min_age=min_age, now=now):
            removed += 1
    if removed:
        folder.fsync()
    return removed


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
    try:
        folder.unlink(name)
    except FileNotFoundError:
        return False  # removed by someone else since the stat
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
    for name in folder.names():
        if _HEX_NAME.match(name):
            yield name
        elif name != "tmp":
            report._stray(folder.path / name)


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
    report.removed_orphans += remove_unnamed_files(conn, folder, names, report, min_age=grace_s, now=now)


def _temp_names(tmp: Directory, report: AssetCollection) -> Iterator[str]:
    """Stream the temporary-file names of a `tmp/` folder, reporting other names as strays."""
    for name in tmp.names():
        if name.endswith(TEMP_SUFFIX):
            yield name
        else:
            report._stray(tmp.path / name)


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
    except (FileNotFoundError, FileSystemError, InsecurePathError):
        return  # gone, or replaced by something we do not open (a symlink, a socket)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = os.fstat(fd)
        except BlockingIOError:
            report.skipped_locked += 1
            return
        except OSError:
            return  # cannot be locked or inspected: passed over, like one that cannot be opened
        named = tmp.stat(name)
        if named is None:
            return
        if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino) == (named.st_dev, named.st_ino):
            try:
                tmp.unlink(name)
            except FileNotFoundError:
                return  # removed by another collector meanwhile
            report.removed_temp += 1
            report.freed_bytes += held.st_size
    finally:
        os.close(fd)


def folder_scan_due(conn: apsw.Connection, now: float) -> bool:
    """Whether `maintain` should scan the asset folder (orphans, temporary files) now.

    Due when no pass was ever scheduled, when the scheduled time has come, or
    when the clock went back by more than an interval. A pass that stopped at
    its cap stays due until it completes (see `schedule_folder_scan`).
    """
    row = conn.execute("SELECT value FROM store_meta WHERE key = ?", (_DUE_KEY,)).fetchone()
    if row is None:
        return True
    due = float(row[0])
    return now >= due or due - now > FOLDER_SCAN_INTERVAL_S


def schedule_folder_scan(conn: apsw.Connection, now: float) -> None:
    """Inside a write transaction, after a scanning collection: once both folder scans have completed their pass
    (their positions wrapped to the start), schedule the next pass `FOLDER_SCAN_INTERVAL_S` after `now`."""
    positions = conn.execute(
        "SELECT value FROM store_meta WHERE key IN (?, ?) AND value != ''", (_SCAN_KEY, TEMP_SCAN_KEY)
    ).fetchall()
    if not positions:
        conn.execute(
            "INSERT INTO store_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (_DUE_KEY, repr(now + FOLDER_SCAN_INTERVAL_S)),
        )
