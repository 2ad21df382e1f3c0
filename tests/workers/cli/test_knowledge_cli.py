"""`emelex memory knowledge list|show|history|remember|pin|unpin|forget` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support import table_rows

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def k(*args: str):
    return runner.invoke(app, ["memory", "knowledge", *args])


def test_remember_list_show_history(workspace: Path, home: Path) -> None:
    with MemoryStore.open(WorkerSettings()) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "use make test"})])
        source = store.knowledge_source(session.id, 1, 1)
        store.remember(workspace, "tests", "run make test", confidence=0.8, source=source)
    assert k("remember", "style", "black, 110 columns", "-w", str(workspace)).exit_code == 0
    assert k("remember", "style", "ruff format", "-w", str(workspace), "--confidence", "0.6").exit_code == 0
    listed = k("list", "-w", str(workspace))
    assert listed.exit_code == 0
    assert listed.output.splitlines() == ["style  v2  conf 0.60  ruff format", "tests  v1  conf 0.80  run make test"]
    shown = k("show", "tests", "-w", str(workspace))
    assert shown.exit_code == 0 and f"Session {session.id} seq 1..1" in shown.output
    data = json.loads(k("show", "tests", "-w", str(workspace), "--json").output)
    assert data["head"]["source"]["session"] == session.id and data["head"]["confidence"] == 0.8
    hist = json.loads(k("history", "style", "-w", str(workspace), "--json").output)
    assert [(v["version"], v["content"]) for v in hist["versions"]] == [(1, "black, 110 columns"), (2, "ruff format")]
    page = k("history", "style", "-w", str(workspace), "--limit", "1")
    assert "black" in page.output and "ruff" not in page.output and "more: --after 1" in page.output


def test_the_current_directory_is_the_default_workspace(workspace: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(workspace)
    assert k("remember", "here", "only in workspace").exit_code == 0
    assert "here" in k("list").output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert k("list").output.strip() == "no Knowledge in this workspace"
    result = k("show", "here")
    assert result.exit_code == 1 and result.output.startswith("error: no Knowledge 'here'")


def test_pin_forget_unpin(workspace: Path, home: Path) -> None:
    w = ["-w", str(workspace)]
    k("remember", "a", "alpha", *w)
    assert k("pin", "a", *w).output.strip() == "a: pinned"
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    refused = k("forget", "a", *w)
    assert refused.exit_code == 1 and "unpin" in refused.output and "Traceback" not in refused.output
    assert table_rows(db) == before
    assert k("unpin", "a", *w).exit_code == 0
    assert k("forget", "a", *w).output.strip() == "a: forgotten (tombstone version 2)"
    assert k("list", *w).output.strip() == "no Knowledge in this workspace"
    assert "forgotten" in k("list", "--all", *w).output
    assert "TOMBSTONE" in k("history", "a", *w).output


def test_list_pages_with_a_cursor(workspace: Path) -> None:
    for i in range(5):
        k("remember", f"k{i}", f"v{i}", "-w", str(workspace))
    first = json.loads(k("list", "-w", str(workspace), "--limit", "3", "--json").output)
    more = ["--cursor", first["next_cursor"], "--json"]
    second = json.loads(k("list", "-w", str(workspace), "--limit", "3", *more).output)
    assert [e["key"] for e in first["entries"] + second["entries"]] == [f"k{i}" for i in range(5)]
    assert second["next_cursor"] is None


def test_bad_input_prints_one_line_and_changes_nothing(workspace: Path, home: Path) -> None:
    w = ["-w", str(workspace)]
    assert k("remember", "kept", "v", *w).exit_code == 0
    assert k("remember", "gone", "v", *w).exit_code == 0 and k("forget", "gone", *w).exit_code == 0
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    for args, message in [
        (["remember", " padded", "v", *w], "surrounding whitespace"),
        (["remember", "k", "   ", *w], "non-blank"),
        (["remember", "k", "v", "-w", str(workspace / "missing")], "does not exist"),
        (["list", "-w", str(workspace / "missing")], "does not exist"),
        (["pin", "nosuch", *w], "no Knowledge 'nosuch'"),
        (["pin", "gone", *w], "forgotten; remember it again"),
        (["forget", "nosuch", *w], "no Knowledge 'nosuch'"),
        (["unpin", "nosuch", *w], "no Knowledge 'nosuch'"),
    ]:
        result = k(*args)
        assert result.exit_code == 1 and result.output.count("\n") == 1, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, (args, result.output)
        assert table_rows(db) == before, args
    for args, flag in [
        (["remember", "k", "v", *w, "--confidence", "2"], "--confidence"),
        (["history", "kept", *w, "--limit", "0"], "--limit"),
    ]:
        result = k(*args)  # a value out of range is a usage error naming the flag: exit 2, plus a --help hint
        assert result.exit_code == 2 and result.output.count("\n") == 2, (args, result.output)
        assert result.output.startswith(f"error: Invalid value for '{flag}'"), (args, result.output)
        assert table_rows(db) == before, args
