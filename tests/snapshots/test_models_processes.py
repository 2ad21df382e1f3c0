"""Model binding and removal across real processes: the snapshot-mutation lock and the reference guard."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, ModelInUseError, ModelNotInstalledError, Settings, SnapshotLockTimeoutError
from emelex_memory.snapshots.installed import snapshot_mutation_lock
from emelex_workers.models import ModelManager

from ..support.plugins import fake_model_file

CTX = multiprocessing.get_context("spawn")


def _bind(home: str, workspace: str, start, results) -> None:
    settings = Settings(home=home)
    model = ModelManager(settings).get("m")
    start.wait()
    try:
        with MemoryStore.open(settings) as store:
            session = store.create_session(workspace)
            store.bind_session_model(session.id, model)
        results.put(("bound", session.id))
    except ModelNotInstalledError as exc:
        results.put(("refused", str(exc)))


def _hold_lock(home: str, held, release) -> None:
    with snapshot_mutation_lock(Path(home), timeout_s=5):
        held.set()
        release.wait(30)


@pytest.fixture
def installed(settings: Settings, tmp_path: Path):
    with ModelManager(settings) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="m", link=True)
        MemoryStore.open(settings).close()
        yield manager


def test_a_reference_bound_by_another_process_blocks_removal(installed: ModelManager, settings: Settings,
                                                             workspace: Path) -> None:
    start, results = CTX.Barrier(1), CTX.Queue()
    child = CTX.Process(target=_bind, args=(str(settings.home), str(workspace), start, results))
    child.start()
    status, session_id = results.get(timeout=60)
    child.join(30)
    assert status == "bound"
    with pytest.raises(ModelInUseError, match=session_id):
        installed.remove("m")
    assert installed.get("m")


def test_removal_waits_for_the_lock_another_process_holds(installed: ModelManager, settings: Settings) -> None:
    held, release = CTX.Event(), CTX.Event()
    child = CTX.Process(target=_hold_lock, args=(str(settings.home_dir), held, release))
    child.start()
    try:
        assert held.wait(30)
        impatient = ModelManager(Settings(home=settings.home, model_lock_timeout_s=0.3))
        with pytest.raises(SnapshotLockTimeoutError, match="stayed held for 0.3s"):
            impatient.remove("m")
        assert installed.get("m")
    finally:
        release.set()
        child.join(30)
    installed.remove("m")


def test_binds_racing_a_removal_never_leave_a_reference_to_a_removed_snapshot(
    installed: ModelManager, settings: Settings, workspace: Path
) -> None:
    n = 3
    start, results = CTX.Barrier(n + 1), CTX.Queue()
    procs = [CTX.Process(target=_bind, args=(str(settings.home), str(workspace), start, results)) for _ in range(n)]
    for p in procs:
        p.start()
    start.wait(60)  # every child holds the InstalledModel and is about to bind
    try:
        removed = installed.remove("m")
    except ModelInUseError:
        removed = None
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    bound = [sid for status, sid in outcomes if status == "bound"]
    with MemoryStore.open(settings) as store:
        if removed is not None:
            count, _ = store.snapshot_references(removed.snapshot_id)
            assert count == 0 and not bound
            assert all("no model 'm' is installed" in msg for _, msg in outcomes)
        else:
            assert bound and installed.get("m")
            assert store.snapshot_references(installed.get("m").snapshot_id)[0] == len(bound)
