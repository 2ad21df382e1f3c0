"""Inputs a new user's walkthrough found crashing with a traceback: each is a typed one-line error that changes
nothing, `restore` says where the model manifests went, and `sessions recover` names --workspace DIR."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore
from emelex_memory.agent.journal import open_turn
from emelex_workers.cli import app
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings

from ...support import table_rows
from ...support.plugins import fake_model_file
from .test_models_cli_errors import tree


def run(*args: str, home: str | Path, **env: str):
    return CliRunner().invoke(app, list(args), env={"EMELEX_HOME": os.fspath(home), **env})


def one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    for fragment in fragments:
        assert fragment in result.output, result.output


@pytest.mark.parametrize("url", ["http://[::1", "http://[zz]:80"])
def test_add_server_with_a_malformed_ipv6_url_is_a_one_line_error(home: Path, url: str) -> None:
    result = run("models", "add-server", "x", "--url", url, "--model", "m", home=home)
    one_line_error(result, "malformed", "http://HOST:PORT")
    assert not os.path.lexists(home)


def test_a_home_naming_an_unknown_user_is_a_one_line_error(tmp_path: Path) -> None:
    result = run("config", "show", home="~nosuchuser-emelex/x")
    one_line_error(result, "EMELEX_HOME", "'~nosuchuser-emelex/x'")


def test_a_home_whose_name_is_not_utf8_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    home = os.fsdecode(os.fsencode(tmp_path) + b"/h\xff")
    result = run("memory", "knowledge", "remember", "a", "b", "--new-workspace", home=home)
    one_line_error(result, "not valid UTF-8", "EMELEX_HOME")
    assert os.listdir(tmp_path) == []


def test_a_backup_to_a_path_that_is_not_utf8_is_refused_and_creates_nothing(home: Path, tmp_path: Path,
                                                                             workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        store.create_session(workspace)
    files = tree(home).keys()
    before = table_rows(WorkerSettings(home=home).database_path)
    dest = os.fsdecode(os.fsencode(tmp_path) + b"/x-\xff")
    one_line_error(run("memory", "backup", dest, home=home), "not valid UTF-8", "backup directory")
    assert not os.path.lexists(dest) and tree(home).keys() == files
    assert table_rows(WorkerSettings(home=home).database_path) == before


def test_a_restore_from_a_path_that_is_not_utf8_is_refused_and_creates_nothing(home: Path, tmp_path: Path,
                                                                               workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        store.create_session(workspace)
    assert run("memory", "backup", str(tmp_path / "bk"), home=home).exit_code == 0
    src = os.fsencode(tmp_path) + b"/bk\xff"
    os.rename(tmp_path / "bk", src)
    fresh = tmp_path / "fresh"
    one_line_error(run("memory", "restore", os.fsdecode(src), home=fresh), "not valid UTF-8", "backup")
    assert not os.path.lexists(fresh)


def test_restore_says_where_the_model_manifests_went(home: Path, tmp_path: Path, workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        store.create_session(workspace)
    with ModelManager(WorkerSettings(home=home)) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="good")
    assert run("memory", "backup", str(tmp_path / "bk"), home=home).exit_code == 0
    fresh = tmp_path / "fresh"
    result = run("memory", "restore", str(tmp_path / "bk"), home=fresh)
    assert result.exit_code == 0, result.output
    assert "1 model manifests" in result.output
    assert f"{fresh / 'restored-model-manifests'}" in result.output and "add-server" in result.output
    assert os.path.isdir(fresh / "restored-model-manifests")


def open_agent_turn(home: Path, workspace: Path) -> str:
    """A Session whose agent turn was left open (as a crash leaves it), its lease released."""
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        sid = store.create_session(workspace).id
        with store.acquire_lease(sid, workspace) as lease:
            lease.replay()
            open_turn(store, lease, "go")
            lease.release()
    return sid


def test_recover_of_a_renamed_workspace_names_workspace_dir(home: Path, workspace: Path, tmp_path: Path) -> None:
    sid = open_agent_turn(home, workspace)
    workspace.rename(tmp_path / "renamed")
    before = table_rows(WorkerSettings(home=home).database_path)
    result = run("memory", "sessions", "recover", sid, home=home)
    one_line_error(result, "--workspace DIR", str(workspace))
    assert "run it from" not in result.output
    os.mkdir(workspace)  # another directory where it was: pass the moved one with --workspace
    result = run("memory", "sessions", "recover", sid, "--workspace", str(workspace), home=home)
    one_line_error(result, "--workspace", "rebind")
    assert "run it from" not in result.output
    assert table_rows(WorkerSettings(home=home).database_path) == before


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_recover_checks_workspace_first_even_with_nothing_open(home: Path, workspace: Path, tmp_path: Path,
                                                               kind: str) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        sid = store.create_session(workspace).id
    bad = tmp_path / "bad"
    if kind == "file":
        bad.write_text("x")
    result = run("memory", "sessions", "recover", sid, "--workspace", str(bad), home=home)
    one_line_error(result, "--workspace", str(bad))
    assert "nothing to recover" not in result.output


@pytest.mark.parametrize("args", [
    ("memory", "backup", ""),
    ("memory", "backup", "   "),
    ("memory", "restore", ""),
    ("memory", "search", "-w", "", "hello"),
    ("memory", "workspaces", "rebind", "1", ""),
])
def test_an_empty_path_is_a_usage_error_not_the_current_directory(home: Path, tmp_path: Path, workspace: Path,
                                                                 monkeypatch, args) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        store.create_session(workspace)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    before = table_rows(WorkerSettings(home=home).database_path)
    result = run(*args, home=home)
    assert result.exit_code == 2, result.output
    assert "an empty path names no directory" in result.output and "Traceback" not in result.output
    assert os.listdir(here) == []  # a backup did not land in the current directory
    assert table_rows(WorkerSettings(home=home).database_path) == before
