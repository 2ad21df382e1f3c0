"""`emelex memory workspaces list|rebind` and the advice a replaced workspace gives, through typer's CliRunner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent, Settings, WorkspaceReplacedError
from emelex_workers.cli import app

from .conftest import table_rows

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def w(*args: str):
    return runner.invoke(app, ["memory", "workspaces", *args])


def history(workspace: Path) -> str:
    with MemoryStore.open(Settings()) as store:
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
    assert listed.output.split() == ["1", "present", "1", "Sessions", "1", "Knowledge", str(workspace.resolve())]
    shutil.rmtree(workspace)
    workspace.mkdir()
    data = json.loads(w("list", "--json").output)
    [entry] = data["workspaces"]
    assert (entry["id"], entry["status"], entry["sessions"], entry["knowledge"]) == (1, "replaced", 1, 1)
    assert data["next_cursor"] is None
    shown = runner.invoke(app, ["memory", "knowledge", "list", "-w", str(workspace)])
    assert shown.output.strip() == "no Knowledge in this workspace"
    with MemoryStore.open(Settings()) as store:
        with pytest.raises(WorkspaceReplacedError, match="workspaces rebind 1 ") as raised:
            store.acquire_lease(sid, workspace)
        advice = str(raised.value)
    command = advice.split("`")[1].split()  # the advice can be followed as printed
    assert command[:3] == ["emelex", "memory", "workspaces"]
    rebound = runner.invoke(app, command[1:])
    assert rebound.exit_code == 0 and "workspace 1 is now" in rebound.output and "rebound by" in rebound.output
    assert "make test" in runner.invoke(app, ["memory", "knowledge", "list", "-w", str(workspace)]).output
    with MemoryStore.open(Settings()) as store, store.acquire_lease(sid, workspace) as lease:
        assert len(list(lease.replay_all())) == 1
        lease.release()
    assert json.loads(w("list", "--json").output)["workspaces"][0]["rebinds"] == 1


def test_rebind_refuses_without_yes_or_with_bad_input_and_changes_nothing(
    workspace: Path, tmp_path: Path, home: Path
) -> None:
    history(workspace)
    shutil.rmtree(workspace)
    workspace.mkdir()
    db = Settings().database_path
    before = table_rows(db)
    for args, message in (
        (["rebind", "1", str(workspace)], "needs explicit confirmation: pass --yes"),
        (["rebind", "7", str(workspace), "--yes"], "no workspace 7"),
        (["rebind", "1", str(tmp_path / "nope"), "--yes"], "does not exist"),
        (["rebind", "0", str(workspace), "--yes"], "positive integer"),
        (["list", "--cursor", "99999999999999999999"], "bad workspace cursor"),
    ):
        result = w(*args)
        assert result.exit_code == 1, args
        assert result.output.startswith("error: ") and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert table_rows(db) == before


def test_list_pages_with_a_cursor(tmp_path: Path) -> None:
    with MemoryStore.open(Settings()) as store:
        for i in range(3):
            (tmp_path / f"ws{i}").mkdir()
            store.create_session(tmp_path / f"ws{i}")
    first = w("list", "--limit", "2")
    assert first.exit_code == 0 and "more: --cursor 2" in first.output
    rest = w("list", "--limit", "2", "--cursor", "2", "--json")
    assert [x["path"] for x in json.loads(rest.output)["workspaces"]] == [str((tmp_path / "ws2").resolve())]
