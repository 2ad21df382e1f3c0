"""Verified backups of a live store, and restore into an empty Home (the manifest: `maintenance/backup_manifest.py`).

`backup_store` copies the database with SQLite's online backup API in one
step inside one read transaction of its own connection (a consistent
snapshot; in WAL mode other processes keep writing meanwhile), then every
asset its catalog lists (only the ones not in the backup already: an
incremental run copies new assets and re-hashes the rest) and the installed
models' manifests, all with private modes, verifies the copy (integrity
check, row counts against the source snapshot, every asset hashed) and writes
the manifest last. Before anything else it removes an older manifest, so an
interrupted run leaves a partial backup, never one that passes for complete.
The source is only read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import apsw

from typing import Protocol

from ..assets.refs import asset_dir_for
from ..core.connection import connect
from ..core.io_errors import translating
from ..core.opening import STORE_MARKER, open_database
from ..core.utf8 import SQLITE_NAMES, utf8_path
from ..core.private_files import (
    PRIVATE_DIR_MODE, check_private_dir, describe_mode, ensure_private_dir, fsync_dir, write_all, write_private_file,
)
from ..errors import AssetTamperedError, BackupDestinationError, BackupVerificationError, RestoreTargetError
from ..core.settings import Settings
from ..snapshots.installed import MANIFEST_NAME, models_dir
from .backup_manifest import (
    ASSETS, CHUNK, DATABASE, MANIFEST, MARKER, MODELS, BackupReport, read_manifest, sha256_file, table_counts,
    verify_backup, write_manifest,
)

__all__ = ["backup_store", "restore_backup", "verify_backup"]


class BackupSource(Protocol):
    """What `backup_store` reads of an open store (a `MemoryStore` is one)."""

    @property
    def path(self) -> Path: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def asset_dir(self) -> Path: ...


def _inside(path: Path, root: Path) -> bool:
    path, root = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return path == root or root in path.parents


def _check_destination(dest: Path, store: BackupSource) -> None:
    for root in (store.settings.home_dir, store.path.parent):
        if _inside(dest, root) or _inside(root, dest):
            raise BackupDestinationError(f"{dest} overlaps the store's {root}: back up to a directory outside it")
    if not os.path.lexists(dest):
        return
    if not dest.is_dir() or dest.is_symlink():
        raise BackupDestinationError(f"{dest} is not a directory: name a new or empty directory, or an old backup")
    st = os.lstat(dest)
    if st.st_uid != os.geteuid():
        raise BackupDestinationError(f"{dest} is owned by uid {st.st_uid}, not you: name a path that does not exist yet")
    if not any(dest.iterdir()):
        return
    if not os.path.lexists(dest / MARKER):
        raise BackupDestinationError(f"{dest} is not empty and holds no backup: name a path that does not exist yet")
    if st.st_mode & 0o077:
        raise BackupDestinationError(f"the backup {dest} is not private (mode {describe_mode(st)}): run "
                                     f"`chmod 700 {dest}`, or name a path that does not exist yet")


def _private_file(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)


def _copy_database(store: BackupSource, dest: Path) -> dict[str, int]:
    """Copy the database into `dest/emelex.sqlite3` from one snapshot; return that snapshot's row counts."""
    tmp = dest / (DATABASE + ".partial")
    for side in (tmp, Path(f"{tmp}-journal"), Path(f"{tmp}-wal")):
        if os.path.lexists(side):
            os.unlink(side)
    os.close(_private_file(tmp))
    source = connect(store.path, busy_timeout_ms=store.settings.busy_timeout_ms)
    target = apsw.Connection(str(tmp))
    try:
        source.execute("BEGIN DEFERRED")  # one read transaction: the counts and the copied pages are one snapshot
        try:
            counts = table_counts(source)
            with target.backup("main", source, "main") as step:
                step.step(-1)
        finally:
            source.execute("ROLLBACK")
        target.execute("PRAGMA journal_mode=DELETE").fetchall()  # one self-contained file
    finally:
        target.close()
        source.close()
    fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest / DATABASE)
    fsync_dir(dest)
    return counts


def _write_durably(path: Path, data: bytes) -> None:
    """Write `data` to the private file `path` (replacing it), fsync it and then its folder."""
    if os.path.lexists(path):
        os.unlink(path)
    write_private_file(path, data)
    fsync_dir(path.parent)


def _copy_durably(source: Path, target: Path) -> None:
    """Copy the regular file `source` to a new private file `target`, neither followed through a symlink, and fsync
    the copy (its folder is the caller's to fsync once every file in it is copied)."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            while chunk := os.read(src, CHUNK):
                write_all(out, chunk)
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(src)


def _copy_asset(source: Path, target: Path, digest: str, size: int) -> None:
    """Copy one asset, hashing it as it is read: a source file that does not hash to its name is not copied."""
    tmp = target.with_name(target.name + ".partial")
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    out = _private_file(tmp)
    try:
        h, n = hashlib.sha256(), 0
        while chunk := os.read(src, CHUNK):
            h.update(chunk)
            n += len(chunk)
            write_all(out, chunk)
        if (h.hexdigest(), n) != (digest, size):
            raise AssetTamperedError(f"the store's asset {source} does not hash to its name and size: run "
                                     "`emelex memory doctor`, then back up again")
        os.fsync(out)
    except BaseException:
        os.close(out)
        os.unlink(tmp)
        raise
    finally:
        os.close(src)
    os.close(out)
    os.replace(tmp, target)


def _model_manifests(home: Path) -> dict[str, Path]:
    root = models_dir(home)
    if not root.is_dir():
        return {}
    return {f"{d.name}/{MANIFEST_NAME}": d / MANIFEST_NAME for d in sorted(root.iterdir())
            if d.is_dir() and not d.is_symlink() and (d / MANIFEST_NAME).is_file()}


@translating("backing up the store", lambda store, dest: dest)
def backup_store(store: BackupSource, dest: str | os.PathLike[str]) -> BackupReport:
    """Write a complete, verified backup of `store` to the directory `dest` and return its report.

    `dest` is created (mode 0700), or must be an empty directory of yours (it is made 0700) or an earlier, private
    backup (then only new assets are copied); it may not overlap Emelex Home or the database's directory
    (`BackupDestinationError`). Other processes may keep writing meanwhile: the copy is one consistent snapshot. A failure, or a kill, leaves `dest` without a
    manifest (a partial backup, refused by `verify_backup` and restore) and the store untouched."""
    dest = Path(utf8_path(os.path.abspath(dest), "the backup directory", SQLITE_NAMES))
    _check_destination(dest, store)
    if os.path.lexists(dest):
        os.chmod(dest, PRIVATE_DIR_MODE)  # an empty directory of yours (or a private backup): it holds private data
    ensure_private_dir(dest)
    if os.path.lexists(dest / MANIFEST):
        os.unlink(dest / MANIFEST)  # from here until the new one is written, this is a partial backup
        fsync_dir(dest)
    os.close(_private_file(dest / MARKER))
    counts = _copy_database(store, dest)
    ensure_private_dir(dest / ASSETS)
    conn = apsw.Connection(f"file:{dest / DATABASE}?immutable=1", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        copied_counts = table_counts(conn)
        catalog = dict(conn.execute("SELECT digest, max(size) FROM assets GROUP BY digest").fetchall())
    finally:
        conn.close()
    if problems != ["ok"] or copied_counts != counts:
        raise BackupVerificationError(f"the copy in {dest} does not verify ({problems[0]}; counts {copied_counts} vs "
                                      f"{counts}): run `emelex memory doctor`, then back up again")
    copied = total = 0
    for digest, size in sorted(catalog.items()):
        target = dest / ASSETS / digest
        if not os.path.lexists(target) or sha256_file(target) != (digest, size):
            _copy_asset(store.asset_dir / digest, target, digest, size)
            copied += 1
        total += size
    fsync_dir(dest / ASSETS)
    models = {}
    for rel, path in _model_manifests(store.settings.home_dir).items():
        ensure_private_dir((dest / MODELS / rel).parent)
        _write_durably(dest / MODELS / rel, path.read_bytes())
        models[rel] = sha256_file(dest / MODELS / rel)[0]
    digest, size = sha256_file(dest / DATABASE)
    report = BackupReport(dest, digest, size, counts, len(catalog), total, copied, len(models))
    write_manifest(dest, report, catalog, models)
    verify_backup(dest)
    return report


STAGING = ".restoring"  # in Home: where a restore builds the store before renaming it to memory/
RESTORED_MODELS = "restored-model-manifests"  # in Home: where a restore puts the backup's model manifests


def _check_empty_home(settings: Settings) -> None:
    home = settings.home_dir
    if not os.path.lexists(home):
        return
    if not home.is_dir() or home.is_symlink():
        raise RestoreTargetError(f"{home} is not a directory: restore into a new or empty Emelex Home")
    extra = sorted(p.name for p in home.iterdir() if p.name not in ("config.toml", STAGING))
    if extra:
        raise RestoreTargetError(f"Emelex Home {home} is not empty ({', '.join(extra[:3])}): restore never "
                                 "replaces a store; set EMELEX_HOME to a new or empty directory")


@translating("restoring the store", lambda src, settings: src)
def restore_backup(src: str | os.PathLike[str], settings: Settings) -> BackupReport:
    """Verify the backup at `src`, then restore it into the empty Home of `settings` and return its report.

    The Home must not exist or be empty (a `config.toml` is allowed, and the staging folder `.restoring` of a
    restore cut short, which is removed) and must not overlap `src`: `RestoreTargetError` otherwise, as a restore
    never replaces a store. Model manifests are restored to `<Home>/restored-model-manifests/` for
    reference (the model files are not in a backup: install the models again). On failure the Home is left as
    it was, or without a `memory/` store."""
    src = Path(os.path.abspath(src))
    report = verify_backup(src)
    if _inside(settings.home_dir, src) or _inside(src, settings.home_dir):
        raise RestoreTargetError(f"Emelex Home {settings.home_dir} overlaps the backup {src}: restore into a Home "
                                 "outside it (set EMELEX_HOME to a new or empty directory elsewhere)")
    _check_empty_home(settings)
    home = settings.home_dir
    created_home = not os.path.lexists(home)
    ensure_private_dir(home)
    staging = home / STAGING
    if os.path.lexists(staging):  # left by a restore cut short (a kill, a power loss) before it renamed it
        check_private_dir(staging)
        shutil.rmtree(staging)
    try:
        ensure_private_dir(staging / ASSETS)
        for name in sorted(os.listdir(src / ASSETS)):
            if not name.endswith(".partial"):
                _copy_durably(src / ASSETS / name, staging / ASSETS / name)
        fsync_dir(staging / ASSETS)
        _copy_durably(src / DATABASE, staging / DATABASE)
        verify_staged = sha256_file(staging / DATABASE)[0]
        if verify_staged != report.database_sha256:
            raise BackupVerificationError(f"the database copied from {src} changed while restoring: try again")
        for rel in sorted(read_manifest(src)["models"]):  # the verified ones
            ensure_private_dir((staging / MODELS / rel).parent)
            _copy_durably(src / MODELS / rel, staging / MODELS / rel)
            fsync_dir((staging / MODELS / rel).parent)
        fsync_dir(staging)  # every file and folder the store relies on is durable before it takes the store's name
        os.rename(staging, settings.memory_dir)
        fsync_dir(home)
        if os.path.isdir(settings.memory_dir / MODELS):
            os.rename(settings.memory_dir / MODELS, home / RESTORED_MODELS)
            fsync_dir(settings.memory_dir)
            fsync_dir(home)
        open_database(  # as `MemoryStore.open` does: records the store marker; migrates an older backup
            settings.database_path, busy_timeout_ms=settings.busy_timeout_ms, marker=home / STORE_MARKER,
            evidence=(asset_dir_for(settings.database_path),), where=home,
        ).close()
    except BaseException:
        for path in (staging, settings.memory_dir, home / RESTORED_MODELS, home / STORE_MARKER):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        if created_home:
            shutil.rmtree(home, ignore_errors=True)
        raise
    return report
