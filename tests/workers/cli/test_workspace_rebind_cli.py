"""`emelex memory workspaces list|rebind` and the advice a replaced workspace gives, through typer's CliRunner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent, WorkspaceReplacedError
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support import table_rows

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def w(*args: str):
    return runner.invoke(app, ["memory", "workspaces", *args])


def history(workspace: Path) -> str:
    with MemoryStore.open(WorkerSettings()) as store:
        session = store.create_session(workspace, title="before the re-clone")
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "hi"})])
            lease.release()
    assert runner.invoke(app, ["memory", "knowledge", "remember", "build", "make test", "-w", str(workspace)]).exit_code == 0
    return session.id


def test_a_re_clone_is_refused_with_advice_that_rebind_makes_good(workspace: Path) -> None:
    sid = history(workspace)
    listed = w("list")
    assert listed.exit_code == 0
    assert listed.output.split() == [
        "1", "present", "1", "Sessions", "1", "Knowledge", "0", "rebinds", str(workspace.resolve())]
    shutil.rmtree(workspace)
    workspace.mkdir()
    data = json.loads(w("list", "--json").output)
    [entry] = data["workspaces"]
    assert (entry["id"], entry["status"], entry["sessions"], entry["knowledge"]) == (1, "replaced", 1, 1)
    assert data["next_cursor"] is None
    for args in (["list"], ["show", "build"], ["forget", "build"], ["remember", "build", "make all"]):
        shown = runner.invoke(app, ["memory", "knowledge", *args, "-w", str(workspace)])
        assert shown.exit_code == 1 and shown.output.count("\n") == 1, shown.output
        assert "last seen at this path" in shown.output and "workspaces rebind 1 " in shown.output
    with MemoryStore.open(WorkerSettings()) as store:
        with pytest.raises(WorkspaceReplacedError, match="workspaces rebind 1 ") as raised:
            store.acquire_lease(sid, workspace)
        advice = str(raised.value)
    command = advice.split("`")[1].split()  # the advice can be followed as printed
    assert command[:3] == ["emelex", "memory", "workspaces"]
    rebound = runner.invoke(app, command[1:])
    assert rebound.exit_code == 0 and "workspace 1 is now" in rebound.output and "rebound by" in rebound.output
    assert "make test" in runner.invoke(app, ["memory", "knowledge", "list", "-w", str(workspace)]).output
    with MemoryStore.open(WorkerSettings()) as store, store.acquire_lease(sid, workspace) as lease:
        assert len(list(lease.replay_all())) == 1
        lease.release()
    assert json.loads(w("list", "--json").output)["workspaces"][0]["rebinds"] == 1


def test_rebind_refuses_without_yes_or_with_bad_input_and_changes_nothing(
    workspace: Path, tmp_path: Path, home: Path
) -> None:
    history(workspace)
    shutil.rmtree(workspace)
    workspace.mkdir()
    db = WorkerSettings().database_path
    before = table_rows(db)
    for args, message in (
        (["rebind", "1", str(workspace)], "needs explicit confirmation: pass --yes"),
        (["rebind", "7", str(workspace), "--yes"], "no workspace 7"),
        (["rebind", "1", str(tmp_path / "nope"), "--yes"], "does not exist"),
        (["list", "--cursor", "99999999999999999999"], "bad workspace cursor"),
    ):
        result = w(*args)
        assert result.exit_code == 1, args
        assert result.output.startswith("error: ") and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert table_rows(db) == before


def test_list_pages_with_a_cursor(tmp_path: Path) -> None:
    with MemoryStore.open(WorkerSettings()) as store:
        for i in range(3):
            (tmp_path / f"ws{i}").mkdir()
            store.create_session(tmp_path / f"ws{i}")
    first = w("list", "--limit", "2")
    assert first.exit_code == 0 and "more: --cursor 2" in first.output
    rest = w("list", "--limit", "2", "--cursor", "2", "--json")
    assert [x["path"] for x in json.loads(rest.output)["workspaces"]] == [str((tmp_path / "ws2").resolve())]


def test_remember_new_workspace_starts_afresh_at_a_re_cloned_path(workspace: Path) -> None:
    history(workspace)
    shutil.rmtree(workspace)
    workspace.mkdir()
    k = ["memory", "knowledge"]
    made = runner.invoke(app, [*k, "remember", "lint", "ruff", "-w", str(workspace), "--new-workspace"])
    assert made.exit_code == 0, made.output
    assert runner.invoke(app, [*k, "list", "-w", str(workspace)]).output.split()[0] == "lint"
    assert [x["id"] for x in json.loads(w("list", "--json").output)["workspaces"]] == [1, 2]
    refused = w("rebind", "1", str(workspace), "--yes")  # workspace 2 holds Knowledge now: it is not retired
    assert refused.exit_code == 1 and "already is workspace 2" in refused.output


def test_rebind_onto_an_empty_workspace_says_it_retired_it(workspace: Path) -> None:
    history(workspace)
    shutil.rmtree(workspace)
    workspace.mkdir()
    with MemoryStore.open(WorkerSettings()) as store:
        store.delete_session(store.create_session(workspace, new_workspace=True).id)
    rebound = w("rebind", "1", str(workspace), "--yes")
    assert rebound.exit_code == 0 and "the empty workspace 2 it was until now is retired" in rebound.output
    assert "make test" in runner.invoke(app, ["memory", "knowledge", "list", "-w", str(workspace)]).output


def test_list_counts_rebinds_and_show_prints_the_history(workspace: Path, tmp_path: Path) -> None:
    history(workspace)
    for _ in range(2):
        shutil.rmtree(workspace)
        workspace.mkdir()
        assert w("rebind", "1", str(workspace), "--yes").exit_code == 0
    assert w("list").output.split()[6:8] == ["2", "rebinds"]
    shown = w("show", "1")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == "workspace 1: present, 1 Sessions, 1 Knowledge, 2 rebinds"
    rebinds = [line for line in lines if line.startswith("  rebound ")]
    assert len(rebinds) == 2 and all(" by " in line and " pid " in line for line in rebinds)
    assert shown.output.count(f"to   {workspace.resolve()} (device ") == 2
    page = json.loads(w("show", "1", "--limit", "1", "--json").output)
    assert len(page["rebinds"]) == 1 and page["next_cursor"]
    rest = json.loads(w("show", "1", "--cursor", page["next_cursor"], "--json").output)
    assert len(rest["rebinds"]) == 1 and rest["next_cursor"] is None
    assert rest["rebinds"][0]["old_inode"] == page["rebinds"][0]["new"]["inode"]  # the second starts where the first ended
    missing = w("show", "9")
    assert missing.exit_code == 1 and missing.output.startswith("error: no workspace 9")


def test_rebind_to_the_directory_it_already_is_needs_no_yes(workspace: Path) -> None:
    history(workspace)
    db = WorkerSettings().database_path
    before = table_rows(db)
    result = w("rebind", "1", str(workspace))
    assert result.exit_code == 0, result.output
    assert result.output == f"workspace 1 already is {workspace.resolve()}; nothing to rebind\n"
    assert table_rows(db) == before


@pytest.mark.parametrize("args", [["show", "0"], ["show", "--", "-1"], ["show", "abc"], ["rebind", "0", "."],
                                  ["rebind", "--", "-1", "."], ["show", "99999999999999999999"]])
def test_a_workspace_id_below_one_or_not_an_integer_is_a_usage_error(workspace: Path, home: Path, args) -> None:
    history(workspace)
    before = table_rows(WorkerSettings().database_path)
    result = w(*args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: Invalid value for 'WORKSPACE_ID'"), result.output
    assert table_rows(WorkerSettings().database_path) == before
