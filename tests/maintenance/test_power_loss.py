"""Power loss outside SQLite's transactions: backup, restore, asset adoption and a first open, cut at seeded points.

`tests/support/power_loss.py` records what each file call made durable (a file's bytes by its fsync, a directory's
entries by the directory's fsync) and, at the cut, rewrites the tree to that durable state. Each operation is
run once uncut to count its mutating calls, then cut at the end (right after it returned: everything it
acknowledged must be durable), just before each of its fsyncs (which reaches every durable state a cut can leave)
and at a seeded sample of the other calls. The promises checked:
an acknowledged backup verifies; an acknowledged restore opens with every catalogued asset intact; an adopted
asset file is present; a store whose first open was cut either does not exist or opens, and doctor passes.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, NewEvent, Settings
from emelex_memory.assets.refs import asset_dir_for
from emelex_memory.errors import EmelexError, NoStoreError
from emelex_memory.maintenance.backup import backup_store, restore_backup, verify_backup
from emelex_memory.maintenance.doctor import diagnose

from ..support.power_loss import simulated

SEED = 18
CUTS = 12  # cut points drawn at random among all mutating calls, besides the one before each fsync


def _cut_points(points: list[int]) -> list[int]:
    """Where to cut an operation whose uncut run gave `points` (before each fsync, then after its last call): all
    of them, which reach every durable state a cut can leave, and a seeded sample of the other calls."""
    calls = points[-1]
    rng = random.Random(SEED)
    return sorted(set(points) | set(rng.sample(range(calls), min(CUTS, calls))))


def _run(root: Path, monkeypatch, operation: Callable[[], object], at: int | None) -> tuple[bool, list[int]]:
    """Run `operation` with the power cut at call `at` (None: not cut); then drop what was not durable. Returns
    whether the operation returned (was acknowledged) and where to cut it: before each of its fsyncs and after
    its last call."""
    with simulated(root, monkeypatch) as loss:
        loss.cut_at(at)
        operation()
    acknowledged = not loss.cut
    loss.power_off()
    return acknowledged, [*loss.syncs, loss.calls]


def _model_manifest(home: Path) -> None:
    folder = home / "models" / "tiny"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "manifest.json").write_text('{"name": "tiny"}')


def _filled_store(home: Path, ws: Path) -> list:
    """A store with a Session whose turns link three assets, and an installed model's manifest; returns the refs."""
    ws.mkdir(exist_ok=True)
    refs = []
    with MemoryStore.open(Settings(home=home)) as store:
        s = store.create_session(ws)
        with store.acquire_lease(s.id, ws) as lease:
            list(lease.replay_all())
            for i in range(3):
                ref = store.put_asset(f"picture {i}".encode() * 300, "image/png")
                lease.append_turn([NewEvent("user", {"text": f"q{i}"}, assets=(ref,))])
                refs.append(ref)
            lease.release()
    _model_manifest(home)
    return refs


def _check_store(home: Path, refs: list) -> None:
    with MemoryStore.open(Settings(home=home)) as store:
        for ref in refs:
            assert store.read_asset(ref) == store.read_asset(ref)  # verified against its digest on every read
        assert store.verify_assets().problems == []
    report = diagnose(Settings(home=home))
    assert report.healthy, [c for c in report.checks if not c.ok]


# -- cut right after the operation returned: what it acknowledged is durable -----------------------------------


def test_an_acknowledged_backup_verifies_after_a_power_loss(tmp_path: Path, monkeypatch) -> None:
    home, out = tmp_path / "home", tmp_path / "out"
    _filled_store(home, tmp_path / "ws")
    out.mkdir()
    with MemoryStore.open(Settings(home=home)) as store:
        assert _run(out, monkeypatch, lambda: backup_store(store, out / "b"), None)[0]
    verify_backup(out / "b")


def test_an_acknowledged_restore_opens_with_every_asset_after_a_power_loss(tmp_path: Path, monkeypatch) -> None:
    home, out = tmp_path / "home", tmp_path / "out"
    refs = _filled_store(home, tmp_path / "ws")
    with MemoryStore.open(Settings(home=home)) as store:
        backup_store(store, tmp_path / "b")
    out.mkdir()
    target = Settings(home=out / "home")
    assert _run(out, monkeypatch, lambda: restore_backup(tmp_path / "b", target), None)[0]
    _check_store(out / "home", refs)
    assert (out / "home" / "restored-model-manifests" / "tiny" / "manifest.json").read_text() == '{"name": "tiny"}'


def _orphan(store: MemoryStore, data: bytes) -> None:
    """What a put killed between linking its file and committing leaves: the digest-named file, uncatalogued, its
    link not yet durable."""
    digest = hashlib.sha256(data).hexdigest()
    path = store.asset_dir / digest
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _store_with_assets(home: Path) -> None:
    """A store whose asset folder and its `tmp/` exist already (a first put creates `tmp/` and fsyncs the folder)."""
    with MemoryStore.open(Settings(home=home)) as store:
        store.put_asset(b"a first picture", "image/png")


def test_an_adopted_orphan_asset_file_is_present_after_a_power_loss(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    _store_with_assets(home)
    data = b"an orphaned picture" * 50
    put = {}

    def adopt() -> None:
        with MemoryStore.open(Settings(home=home)) as store:
            _orphan(store, data)
            put["ref"] = store.put_asset(data, "image/png")

    assert _run(home, monkeypatch, adopt, None)[0]
    with MemoryStore.open(Settings(home=home)) as store:
        assert store.read_asset(put["ref"]) == data


def test_an_acknowledged_put_reads_back_whole_after_a_power_loss(tmp_path: Path, monkeypatch) -> None:
    """A new asset's bytes are durable before its name is published: the temporary file is fsynced first."""
    home = tmp_path / "home"
    _store_with_assets(home)
    data = b"a new picture, never stored before" * 100
    put = {}

    def store_it() -> None:
        with MemoryStore.open(Settings(home=home)) as store:
            put["ref"] = store.put_asset(data, "image/png")

    assert _run(home, monkeypatch, store_it, None)[0]
    with MemoryStore.open(Settings(home=home)) as store:
        assert store.read_asset(put["ref"]) == data
        assert store.verify_assets().problems == []


# -- cut at seeded points along the way ---------------------------------------------------------------------------


def test_backup_cut_anywhere_leaves_a_backup_that_verifies_if_acknowledged(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    _filled_store(home, tmp_path / "ws")
    with MemoryStore.open(Settings(home=home)) as store:
        out = tmp_path / "count"
        out.mkdir()
        _, points = _run(out, monkeypatch, lambda: backup_store(store, out / "b"), None)
        for at in _cut_points(points):
            out = tmp_path / f"cut-{at}"
            out.mkdir()
            acknowledged, _ = _run(out, monkeypatch, lambda: backup_store(store, out / "b"), at)
            assert acknowledged == (at == points[-1])
            if acknowledged:
                verify_backup(out / "b")
            else:
                with pytest.raises(EmelexError):  # a partial backup is never taken for a complete one
                    verify_backup(out / "b")
            backup_store(store, out / "b")  # and a new backup over the partial one completes
            verify_backup(out / "b")


def test_restore_cut_anywhere_opens_with_every_asset_if_acknowledged(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    refs = _filled_store(home, tmp_path / "ws")
    with MemoryStore.open(Settings(home=home)) as store:
        backup_store(store, tmp_path / "b")
    out = tmp_path / "count"
    out.mkdir()
    _, points = _run(out, monkeypatch, lambda: restore_backup(tmp_path / "b", Settings(home=out / "home")), None)
    for at in _cut_points(points):
        out = tmp_path / f"cut-{at}"
        out.mkdir()
        target = Settings(home=out / "home")
        acknowledged, _ = _run(out, monkeypatch, lambda: restore_backup(tmp_path / "b", target), at)
        assert acknowledged == (at == points[-1])
        if acknowledged:
            _check_store(out / "home", refs)
            continue
        try:
            MemoryStore.open(target, create=False).close()
        except NoStoreError:  # nothing was restored: restoring again completes
            restore_backup(tmp_path / "b", target)
        _check_store(out / "home", refs)


def test_asset_adoption_cut_anywhere_keeps_every_acknowledged_asset(tmp_path: Path, monkeypatch) -> None:
    data = b"an orphaned picture" * 50
    count_home = tmp_path / "count"
    _store_with_assets(count_home)

    def adopt(home: Path, put: dict) -> Callable[[], None]:
        def run() -> None:
            with MemoryStore.open(Settings(home=home)) as store:
                _orphan(store, data)
                put["ref"] = store.put_asset(data, "image/png")
        return run

    _, points = _run(count_home, monkeypatch, adopt(count_home, {}), None)
    for at in _cut_points(points):
        home, put = tmp_path / f"cut-{at}", {}
        _store_with_assets(home)
        acknowledged, _ = _run(home, monkeypatch, adopt(home, put), at)
        assert acknowledged == (at == points[-1])
        with MemoryStore.open(Settings(home=home)) as store:
            assert store.verify_assets().problems == []  # a catalogued entry never names a missing file
            if acknowledged:
                assert store.read_asset(put["ref"]) == data


def test_a_first_open_cut_anywhere_leaves_no_store_or_one_that_opens(tmp_path: Path, monkeypatch) -> None:
    def first_open(home: Path) -> Callable[[], None]:
        return lambda: MemoryStore.open(Settings(home=home)).close()

    root = tmp_path / "count"
    root.mkdir()
    _, points = _run(root, monkeypatch, first_open(root / "home"), None)
    for at in _cut_points(points):
        root = tmp_path / f"cut-{at}"
        root.mkdir()
        home = root / "home"
        acknowledged, _ = _run(root, monkeypatch, first_open(home), at)
        assert acknowledged == (at == points[-1])
        if acknowledged:
            assert os.path.exists(home / "memory" / "emelex.sqlite3")
        with MemoryStore.open(Settings(home=home)) as store:  # opens it, or creates it: never refuses
            assert store.asset_dir == asset_dir_for(Settings(home=home).database_path)
        report = diagnose(Settings(home=home))
        assert report.healthy, [c for c in report.checks if not c.ok]
