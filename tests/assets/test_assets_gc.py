"""Asset collection: grace periods, references, orphans, temporary files, and real cross-process races."""

from __future__ import annotations

import fcntl
import hashlib
import multiprocessing
import os
import signal
import time
import tracemalloc
from pathlib import Path

import pytest

from emelex_memory import (
    AssetMissingError,
    AssetNotFoundError,
    InvalidInputError,
    MemoryStore,
    NewEvent,
    Settings,
)
from emelex_memory.assets import collection as assets_gc

from ..support import Clock, table_rows

CTX = multiprocessing.get_context("spawn")
HOUR = 3600.0


@pytest.fixture
def clock() -> Clock:
    """Starting at the real time, so file ages line up with it."""
    return Clock(time.time())


@pytest.fixture
def gc_store(cstore: MemoryStore) -> MemoryStore:
    return cstore


def _names(folder: Path) -> set[str]:
    return set(os.listdir(folder)) - {"tmp"}


def test_unreferenced_assets_are_collected_after_the_grace_period(gc_store: MemoryStore, clock: Clock) -> None:
    old = gc_store.put_asset(b"old", "text/plain")
    clock.now += 2 * HOUR
    young = gc_store.put_asset(b"young", "text/plain")
    report = gc_store.collect_assets()
    assert (report.removed_entries, report.removed_files, report.freed_bytes) == (1, 1, 3)
    assert _names(gc_store.asset_dir) == {young.digest}
    with pytest.raises(AssetNotFoundError):
        gc_store.read_asset(old)
    assert gc_store.read_asset(young) == b"young"


def test_referenced_assets_are_never_collected(gc_store: MemoryStore, clock: Clock, workspace: Path) -> None:
    ref = gc_store.put_asset(b"kept", "image/png")
    session = gc_store.create_session(workspace)
    with gc_store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", "see", assets=(ref,))])
    clock.now += 1000 * HOUR
    assert gc_store.collect_assets(grace_s=0).removed_entries == 0
    assert gc_store.read_asset(ref) == b"kept"


def test_a_file_stays_while_another_media_kind_names_it(gc_store: MemoryStore, clock: Clock) -> None:
    as_text = gc_store.put_asset(b"both", "text/plain")
    clock.now += 2 * HOUR
    as_md = gc_store.put_asset(b"both", "text/markdown")
    assert gc_store.collect_assets().removed_entries == 1
    assert gc_store.read_asset(as_md) == b"both" and _names(gc_store.asset_dir) == {as_md.digest}
    clock.now += 2 * HOUR
    report = gc_store.collect_assets()
    assert (report.removed_entries, report.removed_files) == (1, 1)
    assert as_text.digest not in _names(gc_store.asset_dir)


def test_orphaned_files_are_kept_through_the_grace_period(gc_store: MemoryStore, clock: Clock) -> None:
    gc_store.put_asset(b"catalogued", "text/plain")
    orphan = gc_store.asset_dir / ("a" * 64)
    fd = os.open(orphan, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"left by a crash between link and commit")
    os.close(fd)
    os.utime(orphan, (clock.now, clock.now))  # its age is the store clock's alone: a slow machine changes nothing
    assert gc_store.collect_assets().removed_orphans == 0 and orphan.exists()
    clock.now += HOUR - 1
    assert gc_store.collect_assets().removed_orphans == 0 and orphan.exists()  # a second short of the grace period
    clock.now += 2
    report = gc_store.collect_assets()
    assert report.removed_orphans == 1 and not orphan.exists()


def test_strays_are_reported_never_followed_or_removed(gc_store: MemoryStore, clock: Clock, tmp_path: Path) -> None:
    gc_store.put_asset(b"x", "text/plain")
    victim = tmp_path / "victim"
    victim.write_bytes(b"outside")
    os.utime(victim, (0, 0))
    for link in (gc_store.asset_dir / ("b" * 64), gc_store.asset_dir / "tmp" / "x.part",
                 gc_store.asset_dir / "notes"):
        os.symlink(victim, link)
    clock.now += 100 * HOUR
    report = gc_store.collect_assets(grace_s=0)
    assert len(report.strays) == 3 and report.removed_orphans == report.removed_temp == 0
    assert victim.read_bytes() == b"outside"
    assert all(os.path.islink(p) for p in report.strays)


def test_inside_a_transaction_only_entries_go_and_roll_back_with_it(gc_store: MemoryStore, clock: Clock) -> None:
    ref = gc_store.put_asset(b"maybe", "text/plain")
    clock.now += 2 * HOUR

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        with gc_store.db.write():
            report = gc_store.collect_assets()
            assert (report.removed_entries, report.deferred_files, report.removed_files) == (1, 1, 0)
            raise Abort
    assert gc_store.read_asset(ref) == b"maybe"  # the entry came back and the file never left
    with gc_store.db.write():
        assert gc_store.collect_assets().deferred_files == 1
    assert (gc_store.asset_dir / ref.digest).exists()
    assert gc_store.collect_assets().removed_orphans == 1  # the next call outside a transaction removes it
    assert not (gc_store.asset_dir / ref.digest).exists()


def test_collection_is_bounded_and_resumes(gc_store: MemoryStore, clock: Clock, db_path: Path) -> None:
    refs = [gc_store.put_asset(f"asset {i}".encode(), "text/plain") for i in range(5)]
    clock.now += 2 * HOUR
    first = gc_store.collect_assets(limit=2)
    assert first.removed_entries == 2 and first.more
    for i in range(5):  # orphans: more than one call's worth
        path = gc_store.asset_dir / (f"{i}" * 64)
        path.write_bytes(b"orphan")
        os.chmod(path, 0o600)
    clock.now += 2 * HOUR
    removed, calls = 0, 0
    while True:
        report = gc_store.collect_assets(limit=2)
        removed += report.removed_files
        calls += 1
        if not report.more:
            break
    assert removed == 3 + 5 and calls >= 4
    assert _names(gc_store.asset_dir) == set()
    with pytest.raises(InvalidInputError):
        gc_store.collect_assets(limit=0)
    with pytest.raises(InvalidInputError):
        gc_store.collect_assets(grace_s=-1)
    with pytest.raises(InvalidInputError):
        gc_store.collect_assets(digests="ab" * 32)
    with pytest.raises(InvalidInputError):
        gc_store.collect_assets(digests=[refs[0].digest, "zz"])


def test_targeted_collection_touches_only_the_given_digests(gc_store: MemoryStore, clock: Clock) -> None:
    a = gc_store.put_asset(b"a", "text/plain")
    b = gc_store.put_asset(b"b", "text/plain")
    clock.now += 2 * HOUR
    report = gc_store.collect_assets(digests=[a.digest])
    assert (report.removed_entries, report.removed_files) == (1, 1)
    assert gc_store.read_asset(b) == b"b"


def _temp_file(folder: Path, name: str) -> Path:
    path = folder / "tmp" / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"abandoned")
    os.close(fd)
    return path


def test_the_temporary_file_scan_moves_past_locked_files(gc_store: MemoryStore, clock: Clock) -> None:
    gc_store.put_asset(b"x", "text/plain")
    held = []
    for i in range(20):  # writers still at work, whatever the age of their files
        fd = os.open(_temp_file(gc_store.asset_dir, f"held{i:02}{os.urandom(4).hex()}.part"), os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(fd)
    abandoned = [_temp_file(gc_store.asset_dir, f"{os.urandom(8).hex()}.part") for _ in range(3)]
    clock.now += 2 * HOUR
    removed = skipped = calls = 0
    try:
        while calls < 100:
            report = gc_store.collect_assets(limit=1)
            removed, skipped, calls = removed + report.removed_temp, skipped + report.skipped_locked, calls + 1
            if not report.more:
                break
        assert not report.more and calls == 23  # one file examined per call, each once per pass
        assert (removed, skipped) == (3, 20)
        assert not any(p.exists() for p in abandoned) and len(os.listdir(gc_store.asset_dir / "tmp")) == 20
    finally:
        for fd in held:
            os.close(fd)
    report = gc_store.collect_assets(limit=100)  # the scan wrapped around: the next pass sees them all again
    assert (report.removed_temp, report.skipped_locked) == (20, 0)


def test_files_of_another_owner_are_strays_never_removed(
    gc_store: MemoryStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = gc_store.put_asset(b"not really ours", "text/plain")
    temp = _temp_file(gc_store.asset_dir, "abandoned.part")
    clock.now += 2 * HOUR
    me = os.geteuid()
    monkeypatch.setattr(assets_gc, "geteuid", lambda: me + 1)  # the files now belong to someone else
    report = gc_store.collect_assets(grace_s=0)
    assert report.removed_entries == 1 and report.removed_files == report.removed_temp == 0
    assert sorted(report.strays) == sorted([str(gc_store.asset_dir / ref.digest), str(temp)])
    assert (gc_store.asset_dir / ref.digest).exists() and temp.exists()
    monkeypatch.undo()
    report = gc_store.collect_assets(grace_s=0)
    assert (report.removed_orphans, report.removed_temp) == (1, 1)


def test_the_orphan_scan_holds_a_bounded_number_of_names(gc_store: MemoryStore, clock: Clock) -> None:
    gc_store.put_asset(b"x", "text/plain")
    for i in range(4000):
        os.close(os.open(gc_store.asset_dir / hashlib.sha256(b"%d" % i).hexdigest(), os.O_CREAT | os.O_WRONLY, 0o600))
    clock.now += 2 * HOUR
    tracemalloc.start()
    try:
        report = gc_store.collect_assets(limit=10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.removed_orphans == 10 and report.more
    assert peak < 100_000, peak  # holding all 4000 names would take about 450 kB


# --- real processes --------------------------------------------------------------------

ROUNDS = 120  # rounds of the race always played
MAX_ROUNDS = 2000  # more rounds are played, up to this bound, until the collector has won a race at least once


def _publish(db: str, home: str, session_id: str, workspace: str, start, done, results) -> None:
    try:
        store = MemoryStore.open_path(db, Settings(home=home))
        lease = store.acquire_lease(session_id, workspace, ttl_s=600)
        lease.replay()
        start.wait(60)
        lost = rounds = 0
        while rounds < ROUNDS or (not lost and rounds < MAX_ROUNDS):
            data = f"race round {rounds} ".encode() * 100
            while True:
                ref = store.put_asset(data, "text/plain")
                store.put_asset(data, "text/plain")  # a second put meets the file already there
                try:
                    lease.append_turn([NewEvent("user", {"round": rounds}, assets=(ref,))])
                    break
                except (AssetNotFoundError, AssetMissingError):
                    lost += 1  # collected between put and link: put it again
            rounds += 1
    finally:
        done.set()  # stops the collector even if this process failed
    lease.release()
    results.put(("publisher", lost, rounds))


def _collect(db: str, home: str, start, done, results) -> None:
    store = MemoryStore.open_path(db, Settings(home=home))
    start.wait(60)
    removed = 0
    while not done.is_set():
        removed += store.collect_assets(grace_s=0, limit=50).removed_files
    results.put(("collector", removed, 0))


def test_a_publisher_racing_a_collector_never_loses_a_referenced_file(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        session = store.create_session(workspace)
        store.put_asset(b"warm up", "text/plain")
    start, done, results = CTX.Barrier(2), CTX.Event(), CTX.Queue()
    procs = [
        CTX.Process(target=_publish, args=(str(db_path), str(settings.home), session.id, str(workspace), start, done,
                                           results), daemon=True),
        CTX.Process(target=_collect, args=(str(db_path), str(settings.home), start, done, results), daemon=True),
    ]
    for p in procs:
        p.start()
    counts = {role: (n, rounds) for role, n, rounds in (results.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (lost, rounds), (removed, _) = counts["publisher"], counts["collector"]
    # The race really happened: the collector removed a just-published file before its link at least once
    # (each such loss is one removal, besides the warm-up file's), and the publisher put the bytes again.
    assert lost > 0 and removed > lost, counts
    with MemoryStore.open_path(db_path, settings) as store:
        events, after = [], 0
        while page := store.replay(session.id, after, limit=500).events:
            events += page
            after = page[-1].seq
        assert len(events) == rounds, counts
        for i, event in enumerate(events):
            [ref] = event.assets
            assert store.read_asset(ref) == f"race round {i} ".encode() * 100
        store.collect_assets(grace_s=0)
        assert store.verify_assets().problems == []
        assert _names(store.asset_dir) == {e.assets[0].digest for e in events}


def _write_forever(db: str, home: str, ready) -> None:
    store = MemoryStore.open_path(db, Settings(home=home))

    def chunks():
        yield b"partial " * 1000
        ready.set()
        time.sleep(600)  # killed here, mid-write
        yield b"never"

    store.put_asset(chunks(), "application/octet-stream")


def test_a_writer_killed_mid_write_leaves_a_temp_file_collected_after_an_hour(
    db_path: Path, settings: Settings
) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        store.put_asset(b"existing", "text/plain")
        folder = store.asset_dir
    ready = CTX.Event()
    writer = CTX.Process(target=_write_forever, args=(str(db_path), str(settings.home), ready))
    writer.start()
    try:
        assert ready.wait(60)
        [temp] = os.listdir(folder / "tmp")
        later = MemoryStore.open_path(db_path, settings, clock=lambda: time.time() + 2 * HOUR)
        report = later.collect_assets()
        assert (report.skipped_locked, report.removed_temp) == (1, 0)  # a live writer's lock wins over age
        rows, names = table_rows(db_path), _names(folder)
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(60)
    assert writer.exitcode == -signal.SIGKILL
    assert table_rows(db_path) == rows and _names(folder) == names
    assert os.listdir(folder / "tmp") == [temp]
    with MemoryStore.open_path(db_path, settings) as now:
        report = now.collect_assets(grace_s=0)
        assert report.removed_temp == 0 and os.listdir(folder / "tmp") == [temp]  # younger than one hour
    report = later.collect_assets()
    assert (report.removed_temp, report.skipped_locked, report.freed_bytes) == (1, 0, 8000)
    assert os.listdir(folder / "tmp") == []
    later.close()
