"""The model reference guard fails closed for a deleted-but-restorable store, using the same evidence as the
opener; an unsafe snapshot-mutation lock is a model problem (the job is released, the run exits 1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import DatabaseDeletedError, MemoryStore, Settings, UnsafeModelPathError
from emelex_memory.snapshots.installed import LOCK_NAME
from emelex_memory.core.opening import sidecar_path
from emelex_workers.cli import app
from emelex_workers.models import ModelManager

from ..support.plugins import fake_model_file
from ..workers.cli.test_models_cli_errors import tree
from ..workers.worker.test_work import env, jobs, seed  # noqa: F401 - the fixture and helpers of the worker tests


def _rm_database_and_sidecar(settings: Settings) -> None:
    os.remove(settings.database_path)
    os.remove(sidecar_path(settings.database_path))


def _rm_memory_dir(settings: Settings) -> None:
    shutil.rmtree(settings.memory_dir)


@pytest.mark.parametrize("deletion", [_rm_database_and_sidecar, _rm_memory_dir], ids=["db+sidecar", "memory-dir"])
def test_removal_fails_closed_when_the_referencing_store_was_deleted(
    settings: Settings, tmp_path: Path, workspace: Path, deletion
) -> None:
    with ModelManager(settings) as manager:
        model = manager.install(fake_model_file(tmp_path / "files"), name="m")
    with MemoryStore.open(settings) as store:
        store.bind_session_model(store.create_session(workspace).id, model)
    shutil.copytree(settings.memory_dir, tmp_path / "backup")
    deletion(settings)
    before = tree(settings.home_dir)
    with ModelManager(settings) as manager, pytest.raises(DatabaseDeletedError, match="was deleted"):
        manager.remove("m")
    assert tree(settings.home_dir) == before  # nothing removed, nothing recreated
    shutil.rmtree(settings.memory_dir, ignore_errors=True)
    shutil.copytree(tmp_path / "backup", settings.memory_dir)  # the store is restorable: its reference still holds
    with ModelManager(settings) as manager, pytest.raises(Exception, match="referenced by 1 retained Session"):
        manager.remove("m")


def test_a_home_that_never_had_a_store_has_no_references(settings: Settings, tmp_path: Path) -> None:
    with ModelManager(settings) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="m")
        manager.remove("m")
    assert not settings.memory_dir.exists()


def test_a_symlinked_snapshot_lock_is_a_model_problem(env: Settings, workspace: Path, tmp_path: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
    lock = env.home_dir / LOCK_NAME
    if os.path.lexists(lock):
        lock.unlink()
    (tmp_path / "elsewhere").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", lock)
    with pytest.raises(UnsafeModelPathError, match="symlink"):
        ModelManager(env).remove("fake")
    result = CliRunner().invoke(app, ["memory", "work"])
    assert result.exit_code == 1 and result.stdout == "", result.output
    assert result.stderr.splitlines()[-1].startswith(f"error: {lock} is a symlink")  # after the job's own lines
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")] == [
        result.stderr.splitlines()[-1]]
    with MemoryStore.open(env) as store:
        job = jobs(store)["compaction"]
    assert job.state == "pending" and job.attempts == 0
    assert [d.event for d in job.diagnostics] == ["released"]
    assert job.diagnostics[0].message.startswith("model unavailable, no attempt consumed: UnsafeModelPathError")
