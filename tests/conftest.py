"""Shared fixtures: real database files under tmp_path (the helpers that prove nothing changed are in support/)."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import MemoryStore, Settings
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.queue.kinds import JobKindRegistry

from .support import Clock
from .support.vfs_faults import FaultyVFS, installed


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
    """A fault-injecting VFS registered as SQLite's default for the test (see tests/support/vfs_faults.py); list it
    before any store fixture so the store's connection goes through it."""
    with installed() as vfs:
        yield vfs
    assert apsw.vfs_names()[0] == vfs.base  # the platform default is the default again


@pytest.fixture
def kinds() -> JobKindRegistry:
    """The job-kind registry the `store` and `cstore` fixtures use: the built-in kinds only. A test module that
    needs a kind of its own overrides this fixture (see `support.kinds_with`) instead of registering on the
    process-wide `DEFAULT_KINDS`."""
    return builtin_kinds()


@pytest.fixture
def store(db_path: Path, settings: Settings, kinds: JobKindRegistry):
    """An open store at `db_path`, its jobs' kinds in `kinds`."""
    s = MemoryStore.open_path(db_path, settings, kinds=kinds)
    yield s
    s.close()


@pytest.fixture
def clock() -> Clock:
    """The clock `cstore` reads; a test module overrides this fixture for another start."""
    return Clock()


@pytest.fixture
def cstore(db_path: Path, settings: Settings, clock: Clock, kinds: JobKindRegistry):
    """An open store at `db_path` whose time is `clock`, its jobs' kinds in `kinds`."""
    s = MemoryStore.open_path(db_path, settings, clock=clock, kinds=kinds)
    yield s
    s.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace directory."""
    w = tmp_path / "workspace"
    w.mkdir()
    return w
