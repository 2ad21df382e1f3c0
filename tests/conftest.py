"""Shared fixtures: real database files under tmp_path, and helpers that prove nothing changed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import apsw
import pytest

from emelex_memory import MemoryStore, Settings

from .vfs_faults import FaultyVFS, installed


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A not-yet-existing Emelex Home inside tmp_path."""
    return tmp_path / "home"


@pytest.fixture
def settings(home: Path) -> Settings:
    """Settings pointing at `home`, ignoring the caller's environment."""
    return Settings(home=home)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """An explicit database path in a private directory."""
    d = tmp_path / "db"
    d.mkdir(mode=0o700)
    return d / "test.sqlite3"


@pytest.fixture
def faulty_vfs() -> FaultyVFS:
    """A fault-injecting VFS registered as SQLite's default for the test (see tests/vfs_faults.py); list it before
    any store fixture so the store's connection goes through it."""
    with installed() as vfs:
        yield vfs
    assert apsw.vfs_names()[0] == vfs.base  # the platform default is the default again


@pytest.fixture
def store(db_path: Path, settings: Settings):
    """An open store at `db_path`."""
    s = MemoryStore.open_path(db_path, settings)
    yield s
    s.close()


class Clock:
    """A settable clock injected into a store: it moves only when a test sets or advances `now`."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    """The clock `cstore` reads; a test module overrides this fixture for another start."""
    return Clock()


@pytest.fixture
def cstore(db_path: Path, settings: Settings, clock: Clock):
    """An open store at `db_path` whose time is `clock`."""
    s = MemoryStore.open_path(db_path, settings, clock=clock)
    yield s
    s.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace directory."""
    w = tmp_path / "workspace"
    w.mkdir()
    return w


def table_rows(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table: a logical snapshot of the database.

    Read through a fresh read-write connection (no CREATE flag) so that, being the last to close, it removes
    the WAL side files again instead of leaving new ones behind.
    """
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_NOFOLLOW)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


def file_state(directory: Path) -> dict[str, tuple[int, int, str]]:
    """Name -> (mode, size, sha256) of every entry in `directory`, without following symlinks."""
    out = {}
    for name in sorted(os.listdir(directory)):
        p = directory / name
        st = os.lstat(p)
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
        out[name] = (st.st_mode, st.st_size, digest)
    return out


def call_path(path: str | os.PathLike[str] | int, dir_fd: int | None = None) -> str | None:
    """The absolute path an `os` call with `path` (relative to `dir_fd`, if given) acts on, for tests that wrap `os`
    functions: Emelex reaches asset files by name through directory descriptors. None for a file descriptor."""
    if isinstance(path, int):
        return None
    if dir_fd is None:
        return os.path.abspath(path)
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
