"""Helpers shared by the tests: a settable clock, bounded waits, a seeded Session, and snapshots that prove nothing
changed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.queue.kinds import JobKindRegistry


class Clock:
    """A settable clock injected into a store: it moves only when a test sets or advances `now`."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


WAIT_S = 60.0  # how long a test waits for something another thread or process does, before it fails naming it
POLL_S = 0.01


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll `condition()` until it is true; fail with "`what` did not happen within N s" once `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        time.sleep(POLL_S)


async def eventually(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
    """`wait_until` for a coroutine: poll `condition()` between `asyncio.sleep`s, so the event loop goes on."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s:g} s"
        await asyncio.sleep(POLL_S)


def seed_session(store: MemoryStore, workspace: Path, turns: int) -> str:
    """Create a Session in `workspace` holding `turns` user/assistant turns ("q0"/"a0", ...), its lease released;
    return its ID."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for i in range(turns):
            lease.append_turn([NewEvent("user", {"text": f"q{i}"}), NewEvent("assistant", {"text": f"a{i}"})])
        lease.release()
    return session.id


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


def kinds_fixture(registry: JobKindRegistry):
    """A `kinds` fixture returning `registry`, for a test module whose stores need test-only job kinds: it registers
    them on a registry of its own (`KINDS = builtin_kinds()`, then `KINDS.register(...)`) and sets
    `kinds = kinds_fixture(KINDS)`, so the store fixtures use it and the process-wide registry stays untouched."""

    @pytest.fixture(name="kinds")
    def kinds() -> JobKindRegistry:
        return registry

    return kinds
