"""Each `maintain` step is its own atomic transaction, safe to re-run; a failing step says which completed."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import MaintenanceError, MemoryStore, NewEvent, Settings
from emelex_memory.maintenance.retention import DAY_S, STEPS
from emelex_workers.cli import app

from ..support import Clock, table_rows
from ..support.vfs_faults import Fault, installed


@pytest.fixture
def clock() -> Clock:
    """Starting at the real time (asset files age by their real timestamps)."""
    return Clock(time.time())


def _fail_fsyncs_of(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every fsync of the directory `folder` fail with EIO (until `os.fsync` is restored)."""
    real = os.fsync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(folder):
            raise OSError(errno.EIO, "injected fsync failure")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)


def _idle_session_with_asset(store: MemoryStore, workspace: Path, clock: Clock) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        ref = store.put_asset(b"only in the idle Session", "image/png")
        lease.append_turn([NewEvent("user", {"text": "old"}, assets=(ref,))])
        lease.release()
    store.put_asset(b"never linked", "image/png")
    clock.now += 40 * DAY_S


def test_a_completed_run_lists_every_step(cstore):
    assert cstore.maintain().steps_completed == list(STEPS)
    assert cstore.maintain(dry_run=True).steps_completed == [s for s in STEPS if s != "database"]


def test_a_failing_step_is_named_and_the_steps_before_it_stay_done(
    db_path, home, workspace, clock, monkeypatch
):
    store = MemoryStore.open_path(db_path, Settings(home=home, session_retention_days=30), clock=clock)
    _idle_session_with_asset(store, workspace, clock)
    _fail_fsyncs_of(store.asset_dir, monkeypatch)
    with pytest.raises(MaintenanceError, match=r"step 'sessions' failed.*run `emelex memory maintain` again") as err:
        store.maintain()
    report = err.value.report
    assert report.steps_completed == ["leases", "jobs"]
    assert report.sessions_deleted == 1 and table_rows(db_path)["sessions"] == []  # its deletion committed
    entries = {row[0] for row in table_rows(db_path)["assets"]}
    assert all(os.path.exists(store.asset_dir / d) for d in entries)
    monkeypatch.undo()
    again = store.maintain()  # safe to re-run: it finishes what the failed run left
    assert again.steps_completed == list(STEPS)
    assert table_rows(db_path)["assets"] == [] and set(os.listdir(store.asset_dir)) == {"tmp"}
    store.close()


def test_a_failed_commit_in_the_first_step_reports_no_step_completed(db_path, home, tmp_path, clock):
    with installed() as vfs:
        store = MemoryStore.open_path(db_path, Settings(home=home), clock=clock)
        try:
            w = tmp_path / "w"
            w.mkdir()
            held = store.acquire_lease(store.create_session(w).id, w, ttl_s=5)
            clock.now += 6  # the lease is stale: the first step has something to commit
            vfs.arm(Fault("xWrite", "wal"))
            with pytest.raises(MaintenanceError, match="step 'leases' failed") as err:
                store.maintain()
            assert err.value.report.steps_completed == []
            vfs.disarm()
            assert store.maintain().leases_failed == 1
            held._ended = True
        finally:
            store.close()


def test_cli_maintain_prints_the_completed_steps_when_one_fails(monkeypatch, home, workspace, clock):
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_SESSION_RETENTION_DAYS", "30")
    with MemoryStore.open(Settings(), clock=clock) as store:
        _idle_session_with_asset(store, workspace, clock)
    db = home / "memory" / "emelex.sqlite3"
    conn = apsw.Connection(str(db))  # the Session and assets are 40 days old for the CLI's real clock
    conn.execute("UPDATE sessions SET created_at = created_at - ?, updated_at = updated_at - ?", (40 * DAY_S,) * 2)
    conn.execute("UPDATE events SET created_at = created_at - ?", (40 * DAY_S,))
    conn.execute("UPDATE assets SET touched_at = touched_at - ?", (40 * DAY_S,))
    conn.close()
    real_fsync = os.fsync
    _fail_fsyncs_of(home / "memory" / "assets", monkeypatch)
    runner = CliRunner()
    result = runner.invoke(app, ["memory", "maintain"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[0]]
    assert "step 'sessions' failed" in lines[0] and "run `emelex memory maintain` again" in lines[0]
    assert "completed: leases, jobs" in lines
    again = runner.invoke(app, ["memory", "maintain", "--json"])  # the Session is gone: now the orphan's removal fails
    assert again.exit_code == 1 and "step 'assets' failed" in again.stderr
    assert json.loads(again.stdout)["steps_completed"] == list(STEPS[:STEPS.index("assets")])
    monkeypatch.setattr(os, "fsync", real_fsync)
    done = runner.invoke(app, ["memory", "maintain", "--json"])
    assert done.exit_code == 0 and json.loads(done.stdout)["steps_completed"] == list(STEPS)
