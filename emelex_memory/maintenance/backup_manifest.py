"""The backup manifest: what a complete backup holds, with digests, written last; and the check of a backup against it.

A backup directory holds `emelex.sqlite3` (a consistent copy of the database,
rollback-journal mode), `assets/<sha256>` (every catalogued asset),
`models/<name>/manifest.json` (the installed models' manifests) and, written
last and atomically, `MANIFEST.json`. A directory without that manifest is a
partial backup and is never read as a complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import apsw

from ..core.private_files import fsync_dir, write_all
from ..core.utf8 import SQLITE_NAMES, utf8_path
from ..errors import BackupVerificationError, NotABackupError

FORMAT = "emelex-backup/1"
MANIFEST = "MANIFEST.json"
DATABASE = "emelex.sqlite3"
ASSETS = "assets"
MODELS = "models"
MARKER = ".emelex-backup"  # written first: a directory holding it but no manifest is a partial backup
COUNTED = ("sessions", "events", "event_assets", "assets", "jobs", "knowledge", "knowledge_versions", "summaries",
           "workspaces", "session_leases")
CHUNK = 1 << 20


@dataclass
class BackupReport:
    """A complete, verified backup at `path`: its database digest and size, the row counts compared, the assets
    (`assets_copied` of them copied by this run, the rest already there and re-hashed) and model manifests."""

    path: Path
    database_sha256: str
    database_bytes: int
    counts: dict[str, int] = field(default_factory=dict)
    assets: int = 0
    asset_bytes: int = 0
    assets_copied: int = 0
    models: int = 0


def sha256_file(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a regular file, read without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size
    finally:
        os.close(fd)


def table_counts(conn: apsw.Connection) -> dict[str, int]:
    """Row counts of the tables a backup compares."""
    return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in COUNTED}


def write_manifest(dest: Path, report: BackupReport, assets: dict[str, int], models: dict[str, str]) -> None:
    """Write `MANIFEST.json` atomically (temporary file, fsync, rename, directory fsync): the backup's last step."""
    body = {
        "format": FORMAT, "database": {"file": DATABASE, "sha256": report.database_sha256,
                                       "bytes": report.database_bytes},
        "counts": report.counts, "assets": assets, "models": models,
    }
    tmp = dest / (MANIFEST + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        write_all(fd, json.dumps(body, sort_keys=True, indent=1).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, dest / MANIFEST)
    fsync_dir(dest)


def read_manifest(src: Path) -> dict:
    """The manifest of the backup at `src`; `NotABackupError` when there is none (a partial backup or none)."""
    path = src / MANIFEST
    if not os.path.lexists(path):
        what = "a partial backup (it has no manifest)" if os.path.lexists(src / MARKER) else "not a backup"
        raise NotABackupError(f"{src} is {what}: run `emelex memory backup` to make a complete one")
    try:
        body = json.loads(path.read_bytes())
        if body["format"] != FORMAT:
            raise ValueError(body["format"])
        body["database"]["sha256"], body["counts"], body["assets"], body["models"]  # noqa: B018
    except (ValueError, KeyError, TypeError) as exc:
        raise BackupVerificationError(f"{path} is not a readable {FORMAT} manifest ({exc}); make a new backup") from None
    return body


def _private(path: Path, directory: bool = False) -> None:
    st = os.lstat(path)
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if not kind(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BackupVerificationError(f"{path} is not a private {'directory' if directory else 'file'} of yours "
                                      "(mode 0700/0600): make a new backup")


def _mismatch(path: Path, what: str) -> BackupVerificationError:
    return BackupVerificationError(f"{path} {what}: the backup was tampered with or damaged; make a new backup")


def verify_backup(src: Path) -> BackupReport:
    """Re-check the complete backup at `src` against its manifest: private modes, the database's digest,
    integrity and row counts, every asset's size and SHA-256, every model manifest's digest. Returns its report;
    raises `NotABackupError` (no manifest), `BackupVerificationError` (the first difference) or `InvalidInputError`
    (a path that is not valid UTF-8). Reads only."""
    src = Path(utf8_path(os.path.abspath(src), "the backup", SQLITE_NAMES))
    if not src.is_dir():
        raise NotABackupError(f"{src} is not a directory holding a backup: name a backup directory")
    body = read_manifest(src)
    _private(src, directory=True)
    db = src / DATABASE
    if not os.path.lexists(db):
        raise _mismatch(db, "is missing")
    _private(db)
    digest, size = sha256_file(db)
    if digest != body["database"]["sha256"]:
        raise _mismatch(db, "does not match the manifest's SHA-256")
    conn = apsw.Connection(f"file:{db}?immutable=1", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
    try:
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
        if problems != ["ok"]:
            raise _mismatch(db, f"fails the integrity check ({problems[0]})")
        counts = table_counts(conn)
    finally:
        conn.close()
    if counts != body["counts"]:
        raise _mismatch(db, f"holds other row counts than the manifest records ({counts} vs {body['counts']})")
    total = 0
    for name, expected in sorted(body["assets"].items()):
        path = src / ASSETS / name
        if not os.path.lexists(path):
            raise _mismatch(path, "is missing")
        _private(path)
        if sha256_file(path) != (name, expected):
            raise _mismatch(path, "does not hash to its name and size")
        total += expected
    for rel, expected in sorted(body["models"].items()):
        path = src / MODELS / rel
        if not os.path.lexists(path) or sha256_file(path)[0] != expected:
            raise _mismatch(path, "is missing or does not match the manifest's SHA-256")
    return BackupReport(src, digest, size, counts, len(body["assets"]), total, 0, len(body["models"]))
