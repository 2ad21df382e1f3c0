"""A refused open creates nothing, and reading where no store exists says so instead of creating one: a deleted
database keeps its sidecar absent, an explicit store deleted with its sidecar stays refused, read-only commands
on a fresh Home report "no store yet" (the worker idles quietly), and an empty EMELEX_* variable counts as unset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import DatabaseDeletedError, InvalidHomeError, MemoryStore, NoStoreError, Settings
from emelex_memory.maintenance.doctor import diagnose
from emelex_memory.core.opening import sidecar_path
from emelex_workers.cli import app

from .test_symlinks import walk


def _state(tmp_path: Path) -> dict[str, tuple[int, int]]:
    return walk(tmp_path)


# -- a refused open creates nothing ---------------------------------------------------------------------------


@pytest.mark.parametrize("standard", [True, False], ids=["standard", "open_path"])
def test_a_database_deleted_with_its_sidecar_is_refused_without_recreating_the_sidecar(
    tmp_path: Path, settings: Settings, db_path: Path, workspace: Path, standard: bool
) -> None:
    with MemoryStore.open(settings) if standard else MemoryStore.open_path(db_path, settings) as store:
        store.create_session(workspace)
        database = store.path
    os.remove(database)
    os.remove(sidecar_path(database))
    before = _state(tmp_path)
    for _ in range(2):
        with pytest.raises(DatabaseDeletedError, match="deleted and nothing was recreated"):
            MemoryStore.open(settings) if standard else MemoryStore.open_path(db_path, settings)
    assert _state(tmp_path) == before and not os.path.lexists(sidecar_path(database))


def test_a_deleted_standard_database_is_refused_whatever_else_was_deleted_with_it(
    tmp_path: Path, settings: Settings
) -> None:
    MemoryStore.open(settings).close()
    os.remove(settings.database_path)
    for also_gone in (None, sidecar_path(settings.database_path), settings.memory_dir / "assets"):
        if also_gone is not None:
            os.rename(also_gone, tmp_path / f"aside-{also_gone.name}")
        before = _state(tmp_path)
        with pytest.raises(DatabaseDeletedError):
            MemoryStore.open(settings)
        assert _state(tmp_path) == before


def test_creating_a_store_creates_its_asset_folder(settings: Settings, db_path: Path) -> None:
    with MemoryStore.open(settings) as std, MemoryStore.open_path(db_path, settings) as other:
        assert os.path.isdir(std.asset_dir) and os.path.isdir(other.asset_dir)


# -- opening without creating ---------------------------------------------------------------------------------


def test_open_without_create_on_a_fresh_home_raises_and_creates_nothing(tmp_path: Path, settings: Settings,
                                                                         db_path: Path) -> None:
    before = _state(tmp_path)
    with pytest.raises(NoStoreError, match=f"no store at {settings.home_dir} yet"):
        MemoryStore.open(settings, create=False)
    with pytest.raises(NoStoreError, match=f"no store at {db_path} yet"):
        MemoryStore.open_path(db_path, settings, create=False)
    settings.home_dir.mkdir(mode=0o700)
    (settings.home_dir / "memory").mkdir(mode=0o700)
    before = _state(tmp_path)
    with pytest.raises(NoStoreError):
        MemoryStore.open(settings, create=False)
    assert _state(tmp_path) == before


def test_open_without_create_opens_an_existing_store(settings: Settings, workspace: Path) -> None:
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
    with MemoryStore.open(settings, create=False) as store:
        assert store.get_session(session.id).id == session.id


def test_doctor_on_a_fresh_home_reports_no_store_and_creates_nothing(tmp_path: Path, settings: Settings) -> None:
    before = _state(tmp_path)
    report = diagnose(settings)
    assert not report.healthy
    (opened,) = [c for c in report.checks if c.name == "open"]
    assert not opened.ok and opened.detail.startswith(f"no store at {settings.home_dir} yet")
    assert _state(tmp_path) == before


READ_ONLY = [
    ["memory", "doctor"],
    ["memory", "sessions", "show", "some-session"],  # every listing is an empty list there: test_first_run.py
    ["memory", "sessions", "delete", "some-session", "--yes"],
    ["memory", "jobs", "retry", "some-job"],
    ["memory", "jobs", "cancel", "some-job"],
    ["memory", "compact", "some-session", "--context-window", "4096"],
    ["memory", "knowledge", "show", "key"],
    ["memory", "knowledge", "pin", "key"],
    ["memory", "knowledge", "unpin", "key"],
    ["memory", "knowledge", "forget", "key"],
    ["memory", "assets", "show", "a" * 64],
    ["memory", "assets", "verify"],
    ["memory", "maintain"],
    ["memory", "workspaces", "show", "1"],
    ["memory", "workspaces", "rebind", "1", ".", "--yes"],
]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: " ".join(a[1:3]))
def test_commands_on_a_fresh_home_say_there_is_no_store_and_create_nothing(
    tmp_path: Path, home: Path, workspace: Path, monkeypatch, args: list[str]
) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.chdir(workspace)
    before = _state(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert f"no store at {home} yet" in result.output and "Traceback" not in result.output
    assert _state(tmp_path) == before


@pytest.mark.parametrize("args", [["memory", "work"], ["memory", "work", "--json"]])
def test_work_on_a_fresh_home_is_an_idle_run_that_creates_nothing(tmp_path: Path, home: Path, monkeypatch,
                                                                  args: list[str]) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    before = _state(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    if "--json" in args:
        report = json.loads(result.output)
        assert report["claimed"] == 0 and report["rescued"] == 0 and report["stopped"] == "empty"
    else:
        assert result.output == ""
    assert _state(tmp_path) == before


# -- empty EMELEX_* variables -----------------------------------------------------------------------------------


def test_an_empty_emelex_home_counts_as_unset(tmp_path: Path, workspace: Path, monkeypatch) -> None:
    user_home = tmp_path / "user"
    (user_home / ".emelex").mkdir(parents=True, mode=0o700)
    (user_home / ".emelex" / "config.toml").write_text("busy_timeout_ms = 1234\n")
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.setenv("EMELEX_HOME", "")
    monkeypatch.setenv("EMELEX_BUSY_TIMEOUT_MS", "")  # empty: the config.toml value applies, not an error
    monkeypatch.chdir(workspace)
    settings = Settings()
    assert settings.home_dir == user_home / ".emelex" and settings.busy_timeout_ms == 1234
    result = CliRunner().invoke(app, ["memory", "knowledge", "show", "key"])
    assert result.exit_code == 1 and f"no store at {user_home / '.emelex'} yet" in result.output
    assert os.listdir(workspace) == []


def test_an_empty_home_argument_is_refused(monkeypatch) -> None:
    with pytest.raises(ValueError, match="home must not be empty"):
        Settings(home="")


@pytest.mark.parametrize("relative", ["emelex-home", "./home", "../x/home"])
def test_a_relative_emelex_home_is_refused_and_nothing_is_created(
    tmp_path: Path, workspace: Path, monkeypatch, relative: str
) -> None:
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("EMELEX_HOME", relative)
    before = _state(tmp_path)
    with pytest.raises(InvalidHomeError, match="EMELEX_HOME must be an absolute path \\(or start with ~\\)"):
        Settings()
    with pytest.raises(InvalidHomeError):
        Settings(home=relative)
    result = CliRunner().invoke(app, ["memory", "knowledge", "remember", "k", "v"])
    assert result.exit_code == 1 and result.output.startswith("error: EMELEX_HOME must be an absolute path")
    assert result.output.count("\n") == 1 and _state(tmp_path) == before


def test_a_home_starting_with_a_tilde_is_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("EMELEX_HOME", "~/somewhere")
    assert Settings().home_dir == tmp_path / "somewhere"
