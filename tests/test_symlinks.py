"""Every path Emelex opens refuses to follow symlinks, consistently: the models directory on every access, the
asset folder and its parents while a store is open, and a Home (or database directory) under a symlinked parent."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, Settings, UnsafeModelPathError
from emelex_workers.cli import app
from emelex_workers.models import ModelManager

from .plugin_support import fake_model_file
from .test_models_cli_errors import tree
from .test_work import env, jobs, seed  # noqa: F401 - the fixture and helpers of the worker tests


def _swap_for_symlink(path: Path, elsewhere: Path) -> None:
    """Move the real directory `path` to `elsewhere` and leave a symlink to it in its place."""
    shutil.move(path, elsewhere)
    os.symlink(elsewhere, path)


# -- the models directory -------------------------------------------------------------------------------------


def test_a_symlinked_models_directory_is_refused_by_every_model_access(home: Path, tmp_path: Path) -> None:
    settings = Settings(home=home)
    source = fake_model_file(tmp_path / "files")
    with ModelManager(settings) as manager:
        manager.install(source, name="fake")
        _swap_for_symlink(home / "models", tmp_path / "elsewhere")
        before = tree(tmp_path / "elsewhere")
        for call in (
            lambda: manager.get("fake"), manager.list, manager.inventory, lambda: manager.verify("fake"),
            lambda: manager.remove("fake"), lambda: manager.install(source, name="other"),
        ):
            with pytest.raises(UnsafeModelPathError, match=f"{home / 'models'} is a symlink"):
                call()
    assert tree(tmp_path / "elsewhere") == before


def test_memory_work_refuses_a_symlinked_models_directory(env: Settings, workspace: Path, tmp_path: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
    _swap_for_symlink(env.home_dir / "models", tmp_path / "elsewhere")
    for args in (["memory", "work"], ["memory", "compact", jobs_session(env)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"error: {env.home_dir / 'models'} is a symlink")
    with MemoryStore.open(env) as store:
        job = jobs(store)["compaction"]
    assert job.state == "pending" and job.attempts == 0 and job.diagnostics == ()


def jobs_session(settings: Settings) -> str:
    with MemoryStore.open(settings) as store:
        return jobs(store)["compaction"].session_id
