"""`maintain`: capped lease transitions, retention through tombstones and grace, pruning, asset collection, dry run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import KnowledgeNotFoundError, MemoryStore, NewEvent, Settings
from emelex_memory.assets.refs import DEFAULT_GRACE_S
from emelex_memory.core.directories import Directory
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.maintenance.retention import DAY_S
from emelex_workers.cli import app

from ..support import Clock, file_state, kinds_fixture, table_rows

KINDS = builtin_kinds()
KINDS.register("noop")  # a test-only kind: these tests need claims on jobs, not compaction

kinds = kinds_fixture(KINDS)


@pytest.fixture
def clock() -> Clock:
    """Starting at the real time (asset files age by their real timestamps)."""
    return Clock(time.time())


def open_store(db_path: Path, home: Path, clock: Clock, **overrides) -> MemoryStore:
    return MemoryStore.open_path(db_path, Settings(home=home, **overrides), clock=clock, kinds=KINDS)


def seed(store: MemoryStore, workspace: Path, text: str, *assets) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", {"text": text}, assets=tuple(assets))])
        lease.release()
    return session.id


def versions(store: MemoryStore, workspace: Path, key: str) -> list[int]:
    return [v.version for v in store.knowledge_history(workspace, key).versions]


def test_maintain_under_a_live_lease_keeps_it_and_pinned_knowledge_prunes_versions_collects_assets(
    db_path, home, workspace, clock
):
    store = open_store(
        db_path, home, clock, session_retention_days=30, knowledge_grace_days=7, knowledge_keep_versions=2
    )
    live_asset = store.put_asset(b"in the live Session", "image/png")
    old_asset = store.put_asset(b"only in the idle Session", "image/png")
    orphan = store.put_asset(b"never linked", "image/png")
    live = seed(store, workspace, "still working", live_asset)
    seed(store, workspace, "long ago", old_asset)
    for i in range(5):
        store.remember(workspace, "pinned", f"p{i}")
        store.remember(workspace, "loose", f"l{i}")
    store.pin(workspace, "pinned")
    clock.now += 40 * DAY_S
    recent = seed(store, workspace, "yesterday")
    lease = store.acquire_lease(live, workspace, ttl_s=600)
    live_lease = [r for r in table_rows(db_path)["session_leases"] if r[3] == "active"]

    report = store.maintain()

    assert report.sessions_deleted == 1 and report.versions_pruned == 3 and report.leases_failed == 0
    assert report.asset_entries_removed == 2 and report.asset_files_removed == 2
    assert report.optimized and report.wal_truncated and not report.vacuumed and not report.dry_run
    assert [s.id for s in store.list_sessions().sessions] == [recent, live]
    assert len(live_lease) == 1
    assert [r for r in table_rows(db_path)["session_leases"] if r[3] == "active"] == live_lease
    for _ in lease.replay_all():
        pass
    lease.append_turn([NewEvent("user", {"text": "the lease still works"})])
    assert versions(store, workspace, "pinned") == [1, 2, 3, 4, 5]
    assert versions(store, workspace, "loose") == [4, 5]
    assert store.get_knowledge(workspace, "loose").content == "l4"
    assert store.read_asset(live_asset) == b"in the live Session"
    for gone in (old_asset, orphan):
        assert not os.path.exists(store.asset_dir / gone.digest)
    lease.release()
    store.close()


def test_stale_lease_transitions_are_capped(db_path, home, tmp_path, clock):
    store = open_store(db_path, home, clock, maintain_batch=2)
    held = []  # keep the lease objects alive: dropping one releases it
    for i in range(3):
        w = tmp_path / f"w{i}"
        w.mkdir()
        sid = store.create_session(w).id
        held.append(store.acquire_lease(sid, w, ttl_s=5))
    clock.now += 6
    first = store.maintain()
    assert (first.leases_failed, first.more) == (2, True)
    assert (store.maintain().leases_failed, store.maintain().leases_failed) == (1, 0)
    leases = table_rows(db_path)["session_leases"]
    assert [(r[3], r[7]) for r in leases] == [("failed", "expired")] * 3
    store.close()


def test_expired_worker_claims_are_rescued_and_live_ones_kept(db_path, home, workspace, clock):
    store = open_store(db_path, home, clock)
    sid = seed(store, workspace, "x")
    store.enqueue_job("noop", sid, {"n": 1})
    store.enqueue_job("noop", sid, {"n": 2})
    short = store.claim_job("noop", ttl_s=10)
    long = store.claim_job("noop", ttl_s=1000)
    clock.now += 11
    report = store.maintain()
    assert report.jobs_rescued == 1
    assert store.get_job(short.id).attempts == 1 and store.get_job(short.id).state == "pending"
    assert store.get_job(long.id).state == "claimed"
    long.release()
    short.ended = True
    store.close()


def test_knowledge_retention_passes_through_a_tombstone_and_a_grace_period(db_path, home, workspace, clock):
    store = open_store(db_path, home, clock, knowledge_retention_days=10, knowledge_grace_days=5)
    store.remember(workspace, "stale", "old fact", confidence=0.4)
    store.remember(workspace, "keep", "pinned fact")
    store.pin(workspace, "keep")
    clock.now += 11 * DAY_S
    store.remember(workspace, "fresh", "new fact")
    assert store.maintain().knowledge_tombstoned == 1
    tomb = store.get_knowledge(workspace, "stale").head
    assert tomb.tombstone and tomb.origin == "retention" and tomb.confidence == 0.4
    assert [e.key for e in store.recall(workspace).entries] == ["fresh", "keep"]
    clock.now += 4 * DAY_S
    assert store.maintain().knowledge_purged == 0  # still within the grace period: `remember` can revive it
    clock.now += 2 * DAY_S
    assert store.maintain().knowledge_purged == 1
    with pytest.raises(KnowledgeNotFoundError):
        store.get_knowledge(workspace, "stale")
    clock.now += 100 * DAY_S
    store.maintain()
    assert store.get_knowledge(workspace, "keep").content == "pinned fact"
    assert not store.get_knowledge(workspace, "keep").tombstoned
    store.close()


def _busy_state(store: MemoryStore, workspace: Path, tmp_path: Path, clock: Clock):
    """Something for every step to do; returns the expired lease (dropping it would release it)."""
    seed(store, workspace, "old", store.put_asset(b"old asset", "image/png"))
    store.put_asset(b"orphan", "image/png")
    for i in range(4):
        store.remember(workspace, "k", f"v{i}")
    store.remember(workspace, "doomed", "x")
    store.forget(workspace, "doomed")
    w = tmp_path / "stale-lease"
    w.mkdir()
    stale = store.create_session(w)
    store.enqueue_job("noop", stale.id, {"n": 1})
    store.claim_job("noop", ttl_s=5).ended = True
    clock.now += 40 * DAY_S
    expired = store.acquire_lease(stale.id, w, ttl_s=5)
    clock.now += 6
    return expired


def test_dry_run_changes_nothing_and_predicts_the_real_run(db_path, home, workspace, tmp_path, clock):
    store = open_store(
        db_path, home, clock, session_retention_days=30, knowledge_retention_days=20, knowledge_keep_versions=1
    )
    expired = _busy_state(store, workspace, tmp_path, clock)
    before_rows, before_files = table_rows(db_path), file_state(store.asset_dir)
    dry = store.maintain(dry_run=True, vacuum=True)
    assert table_rows(db_path) == before_rows and file_state(store.asset_dir) == before_files
    assert dry.asset_files_removed is None and dry.asset_bytes_freed is None  # file removal is not predicted
    assert dry.dry_run and not (dry.optimized or dry.vacuumed or dry.wal_truncated)
    assert (dry.leases_failed, dry.jobs_rescued, dry.sessions_deleted) == (1, 1, 2)
    assert (dry.knowledge_tombstoned, dry.knowledge_purged, dry.versions_pruned) == (1, 1, 3)
    real = store.maintain()
    same = ("leases_failed", "jobs_rescued", "sessions_deleted", "knowledge_tombstoned", "knowledge_purged",
            "versions_pruned", "asset_entries_removed")
    assert {f: getattr(real, f) for f in same} == {f: getattr(dry, f) for f in same}
    assert real.asset_files_removed == 2 and table_rows(db_path) != before_rows
    expired.close()
    store.close()


def test_vacuum_and_wal_truncation(db_path, home, workspace, clock):
    store = open_store(db_path, home, clock)
    for i in range(50):
        store.remember(workspace, f"k{i}", "x" * 4000)
    report = store.maintain(vacuum=True)
    assert report.vacuumed and report.wal_truncated
    assert os.path.getsize(f"{db_path}-wal") == 0
    assert len(store.recall(workspace).entries) == 50
    store.close()


# -- CLI ---------------------------------------------------------------------------------------


def test_cli_maintain(monkeypatch, home, workspace, tmp_path):
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_KNOWLEDGE_KEEP_VERSIONS", "1")
    runner = CliRunner()
    with MemoryStore.open(Settings(), kinds=KINDS) as store:
        for i in range(3):
            store.remember(workspace, "k", f"v{i}")
        orphan = store.put_asset(b"never linked, past its grace period", "image/png")
        assets = store.asset_dir
    db = home / "memory" / "emelex.sqlite3"
    conn = apsw.Connection(str(db))
    conn.execute("UPDATE assets SET touched_at = touched_at - ?", (2 * DAY_S,))
    conn.close()
    old = time.time() - 2 * DAY_S
    os.utime(assets / orphan.digest, (old, old))
    before, before_files = table_rows(db), file_state(assets)
    dry = runner.invoke(app, ["memory", "maintain", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    data = json.loads(dry.output)
    assert data["dry_run"] and data["versions_pruned"] == 0  # superseded too recently: the grace period applies
    assert data["asset_entries_removed"] == 1 and data["asset_files_removed"] is None  # files: not predicted
    assert data["asset_bytes_freed"] is None
    assert table_rows(db) == before and file_state(assets) == before_files
    text = runner.invoke(app, ["memory", "maintain", "--dry-run"])
    assert text.exit_code == 0 and "file removal is not predicted" in text.output
    assert "asset files removed: not predicted by a dry run" in text.output
    assert table_rows(db) == before and file_state(assets) == before_files
    real = runner.invoke(app, ["memory", "maintain", "--vacuum", "--json"])
    assert json.loads(real.output)["asset_files_removed"] == 1 and orphan.digest not in file_state(assets)
    text = runner.invoke(app, ["memory", "maintain", "--vacuum"])
    assert text.exit_code == 0 and "vacuumed" in text.output and "dry run" not in text.output


def test_maintain_leaves_a_lease_held_by_another_process_alone(db_path, home, workspace, clock):
    import subprocess
    import sys

    clock.now = time.time() - 40 * DAY_S
    store = open_store(db_path, home, clock, session_retention_days=30)
    sid = seed(store, workspace, "old but resumed elsewhere")
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys\n"
            "from emelex_memory import MemoryStore, NewEvent, Settings\n"
            f"store = MemoryStore.open_path({str(db_path)!r}, Settings(home={str(home)!r}))\n"
            f"lease = store.acquire_lease({sid!r}, {str(workspace)!r}, ttl_s=600)\n"
            "lease.replay()\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n"
            "lease.append_turn([NewEvent('user', {'text': 'after maintain'})])\n"
            "lease.release()\n"
            "print('appended', flush=True)\n"
        )],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        clock.now = time.time()
        report = store.maintain()
        assert (report.sessions_deleted, report.leases_failed) == (0, 0)
        out, _ = holder.communicate("go\n", timeout=60)
        assert out.strip() == "appended" and holder.returncode == 0
    finally:
        if holder.poll() is None:
            holder.kill()
    assert store.get_session(sid).last_seq == 2
    clock.now += 31 * DAY_S  # idle again and no longer leased: now it goes
    assert store.maintain().sessions_deleted == 1
    store.close()


# -- the asset folder scan is paced ------------------------------------------------------------


def _statements_and_listings(store: MemoryStore, monkeypatch) -> tuple[list[str], list[str]]:
    """Run `maintain` once; return the SQL statements it ran and the directories it listed (the real calls, seen)."""
    statements: list[str] = []
    listed: list[str] = []
    real_names = Directory.names

    def names(self):
        listed.append(self.path.name)
        return real_names(self)

    monkeypatch.setattr(Directory, "names", names)
    store.db.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
    try:
        store.maintain()
    finally:
        store.db.conn.exec_trace = None
        monkeypatch.setattr(Directory, "names", real_names)
    return statements, listed


def test_maintain_does_per_file_work_only_when_the_folder_scan_is_due(tmp_path, workspace, clock, monkeypatch):
    runs = {}
    for files in (1, 40):
        db = tmp_path / f"store-{files}.sqlite3"
        with open_store(db, tmp_path / f"home-{files}", clock) as store:
            seed(store, workspace, "kept", *[store.put_asset(f"asset {n}".encode(), "image/png") for n in range(files)])
            first, first_listed = _statements_and_listings(store, monkeypatch)  # due: the first run scans
            again, again_listed = _statements_and_listings(store, monkeypatch)
            runs[files] = (first, first_listed, again, again_listed)
    assert len(runs[40][0]) > len(runs[1][0]) and runs[40][1]  # the scan checks every file against the catalog
    assert runs[1][2] == runs[40][2]  # not due: the same statements whatever the number of files
    assert runs[1][3] == runs[40][3] == []  # and no directory is listed


def test_maintain_removes_a_crash_orphan_once_the_scan_is_due_again(db_path, home, workspace, clock):
    with open_store(db_path, home, clock) as store:
        seed(store, workspace, "kept", store.put_asset(b"linked", "image/png"))
        store.maintain()  # a complete pass: the next is due after the interval
        orphan = store.asset_dir / ("ab" * 32)
        orphan.write_bytes(b"linked by a put_asset killed before its commit")
        orphan.chmod(0o600)
        clock.now += DEFAULT_GRACE_S + 1  # past the orphan's grace period, and the scan is due again
        assert store.maintain().asset_files_removed == 1 and not orphan.exists()


def test_a_folder_scan_in_progress_continues_on_the_next_maintain(db_path, home, workspace, clock):
    with open_store(db_path, home, clock, maintain_batch=2) as store:
        linked = store.put_asset(b"linked", "image/png")
        seed(store, workspace, "kept", linked)
        store.maintain()
        for n in range(5):
            orphan = store.asset_dir / (f"{n:x}" * 64)
            orphan.write_bytes(b"orphan %d" % n)
            orphan.chmod(0o600)
        clock.now += DEFAULT_GRACE_S + 1
        removed, runs = 0, 0
        while True:  # no further clock step: a pass that reached its cap goes on with the next run
            runs += 1
            report = store.maintain()
            removed += report.asset_files_removed
            if not report.more:
                break
        assert removed == 5 and runs == 3
        assert [n for n in os.listdir(store.asset_dir) if n != "tmp"] == [linked.digest]
