"""Collection never leaves a catalog entry without its file: SIGKILL at each step, a failed commit, a failed fsync.

Each crash test runs the collecting call (`collect_assets`, `delete_session`
or `maintain`) in a real child process that kills itself with SIGKILL at one
point: right after the commit that deleted catalog entries, just before an
asset file is unlinked, just after, or just before the asset folder is
fsynced. The parent then checks that every catalog entry still has its file
and that a later collection removes whatever the crash left behind.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import time
from pathlib import Path

import apsw
import pytest

from emelex_memory import EmelexError, MemoryStore, NewEvent, Settings, StoreIOError
from emelex_memory.maintenance.retention import DAY_S

from ..support import call_path, table_rows
from ..support.vfs_faults import Fault, FaultyVFS, installed

METHOD = {"sync": "xSync", "write": "xWrite"}

CTX = multiprocessing.get_context("spawn")
HOUR = 3600.0
POINTS = ("after_commit", "before_unlink", "after_unlink", "before_fsync")
AHEAD = {"collect_assets": 2 * HOUR, "delete_session": 2 * HOUR, "maintain": 40 * DAY_S}  # the collector's clock


def _settings(home: str) -> Settings:
    return Settings(home=home, session_retention_days=30)


def _entries(db: Path) -> set[str]:
    return {row[0] for row in table_rows(db)["assets"]}


def _files(folder: Path) -> set[str]:
    return set(os.listdir(folder)) - {"tmp"}


def _seed(db: Path, home: Path, workspace: Path) -> tuple[str, dict[str, set[str]]]:
    """A Session "idle" that alone links asset "only-in-session", a Session "recent" linking "kept", and "loose",
    which nothing links. Returns the idle Session's ID and, by action, the digests that collection keeps (maintain,
    forty days later, deletes both Sessions)."""
    with MemoryStore.open_path(db, _settings(str(home))) as store:
        only = store.put_asset(b"only-in-session", "image/png")
        kept = store.put_asset(b"kept", "image/png")
        store.put_asset(b"loose", "text/plain")
        idle, recent = store.create_session(workspace), store.create_session(workspace)
        for session, ref in ((idle, only), (recent, kept)):
            with store.acquire_lease(session.id, workspace) as lease:
                lease.replay()
                lease.append_turn([NewEvent("user", {"see": ref.digest}, assets=(ref,))])
                lease.release()
        keep = {"collect_assets": {only.digest, kept.digest}, "delete_session": {kept.digest}, "maintain": set()}
        return idle.id, keep


def _arm(point: str, store: MemoryStore, db: str) -> None:
    """Make this process SIGKILL itself at `point` of the collection that follows."""
    folder = store.asset_dir
    die = lambda *_: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    if point == "after_commit":
        reader = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READONLY)
        count = lambda: reader.execute("SELECT count(*) FROM assets").fetchone()[0]  # noqa: E731
        before = count()

        def hook(conn, name, pages):  # called once a commit is in the WAL
            if count() < before:
                die()
            return apsw.SQLITE_OK

        store.db.conn.set_wal_hook(hook)
    elif point in ("before_unlink", "after_unlink"):
        real = os.unlink

        def unlink(path, *args, dir_fd=None, **kwargs):
            in_folder = Path(call_path(path, dir_fd)).parent == folder
            if in_folder and point == "before_unlink":
                die()
            real(path, *args, dir_fd=dir_fd, **kwargs)
            if in_folder:
                die()

        os.unlink = unlink
    else:
        real_fsync = os.fsync

        def fsync(fd):
            if _is(fd, folder):
                die()
            real_fsync(fd)

        os.fsync = fsync


def _is(fd: int, folder: Path) -> bool:
    """Whether the file descriptor `fd` is open on the directory `folder`."""
    return os.readlink(f"/proc/self/fd/{fd}") == str(folder)


def _collect_and_die(action: str, point: str, db: str, home: str, session_id: str) -> None:
    store = MemoryStore.open_path(db, _settings(home), clock=lambda: time.time() + AHEAD[action])
    _arm(point, store, db)
    if action == "collect_assets":
        store.collect_assets()
    elif action == "delete_session":
        store.delete_session(session_id)
    else:
        store.maintain()
    os._exit(3)  # the point was never reached


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("action", ("collect_assets", "delete_session", "maintain"))
def test_a_collector_killed_at_any_point_leaves_every_entry_its_file(
    db_path: Path, home: Path, workspace: Path, action: str, point: str
) -> None:
    idle, keep = _seed(db_path, home, workspace)
    folder = db_path.with_name(db_path.name + ".assets")
    child = CTX.Process(target=_collect_and_die, args=(action, point, str(db_path), str(home), idle))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, "the child was not killed at the point"

    entries = _entries(db_path)
    assert entries <= _files(folder), "a catalog entry lost its file"
    assert keep[action] <= entries
    with MemoryStore.open_path(db_path, _settings(str(home)), clock=lambda: time.time() + AHEAD[action]) as later:
        assert later.verify_assets().problems == []
        if action == "delete_session" and idle in {s.id for s in later.list_sessions().sessions}:
            later.delete_session(idle)  # killed before its commit: deleting again finishes the job
        while later.collect_assets().more:
            pass
        assert _files(folder) == _entries(db_path), "a crash orphan was not collected"
        assert _entries(db_path) == keep[action]


# --- failed commits and a failed directory fsync, in process -------------------------------------


@pytest.fixture
def faults():
    with installed() as vfs:
        yield vfs


def _old_unreferenced(db: Path, home: Path) -> tuple[MemoryStore, set[str]]:
    """A store whose clock is two hours ahead, holding three unreferenced assets older than the grace period."""
    with MemoryStore.open_path(db, Settings(home=home)) as store:
        digests = {store.put_asset(f"old {i}".encode(), "text/plain").digest for i in range(3)}
    return MemoryStore.open_path(db, Settings(home=home), clock=lambda: time.time() + 2 * HOUR), digests


@pytest.mark.parametrize("op", ("sync", "write"))
def test_a_failed_catalog_commit_removes_no_file(db_path: Path, home: Path, faults: FaultyVFS, op: str) -> None:
    store, digests = _old_unreferenced(db_path, home)
    try:
        faults.arm(Fault(METHOD[op], "wal"))
        with pytest.raises((apsw.Error, EmelexError)):
            store.collect_assets()
        assert faults.fired, "the fault was not injected"
        assert _files(store.asset_dir) == digests  # nothing unlinked before the deletion committed
    finally:
        store.close()
    # Whatever the outcome of the failed commit, every entry left has its file, and collection finishes.
    with MemoryStore.open_path(db_path, Settings(home=home), clock=lambda: time.time() + 2 * HOUR) as store:
        assert _entries(db_path) <= _files(store.asset_dir)
        assert store.verify_assets().problems == []
        store.collect_assets()
        assert _entries(db_path) == set() and _files(store.asset_dir) == set()


def test_a_failed_directory_fsync_leaves_no_entry_without_its_file(
    db_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, digests = _old_unreferenced(db_path, home)

    real_fsync = os.fsync

    def failing(fd):
        if _is(fd, store.asset_dir):
            raise OSError(errno.EIO, "injected fsync failure")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with store:
        with pytest.raises(StoreIOError, match=f"{store.asset_dir} .*injected"):  # typed, naming the folder
            store.collect_assets()
        assert _entries(db_path) <= _files(store.asset_dir)
        assert store.verify_assets().problems == []
        monkeypatch.undo()
        store.collect_assets()
        assert _entries(db_path) == set() and _files(store.asset_dir) == set()
