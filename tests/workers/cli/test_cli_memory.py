"""The `emelex memory` CLI for Sessions, doctor and reinit, through typer's CliRunner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.core.connection import connect
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support import file_state

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def _seed(workspace: Path) -> str:
    with MemoryStore.open(WorkerSettings()) as store:
        session = store.create_session(workspace, title="cli test")
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "hello"}), NewEvent("assistant", {"text": "hi there"})])
    return session.id


def test_doctor_on_a_new_store_is_healthy(home: Path) -> None:
    MemoryStore.open(WorkerSettings()).close()
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 0, result.output
    assert "healthy" in result.output and "FAIL" not in result.output
    assert "[ok] pragmas: " in result.output and result.output.count("journal_mode") == 1  # once, not twice
    assert "[ok] connection settings: " in result.output and "connection_settings: {" not in result.output
    data = json.loads(runner.invoke(app, ["memory", "doctor", "--json"]).output)
    assert data["healthy"] and data["facts"]["schema_version"] >= 1
    assert data["facts"]["pragmas"]["journal_mode"] == "wal"  # the JSON keeps every fact


def test_doctor_reports_a_bad_mode_and_exits_nonzero(home: Path) -> None:
    MemoryStore.open(WorkerSettings()).close()
    db = home / "memory" / "emelex.sqlite3"
    os.chmod(db, 0o644)
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "chmod 600" in result.output


def test_sessions_list_and_show(workspace: Path) -> None:
    session_id = _seed(workspace)
    listed = runner.invoke(app, ["memory", "sessions", "list"])
    assert listed.exit_code == 0 and session_id in listed.output and "cli test" in listed.output
    header, line = listed.output.splitlines()
    assert header.split() == ["SESSION", "UPDATED", "TURNS", "TITLE", "[WORKSPACE]"]
    assert line.index(session_id) == header.index("SESSION") and line.index("cli test") == header.index("TITLE")
    assert line.index(str(workspace)) == header.index("WORKSPACE")
    shown = runner.invoke(app, ["memory", "sessions", "show", session_id])
    assert shown.exit_code == 0 and "hi there" in shown.output and "2 events in 1 turn," in shown.output
    data = json.loads(runner.invoke(app, ["memory", "sessions", "show", session_id, "--json"]).output)
    assert [e["payload"]["text"] for e in data["events"]] == ["hello", "hi there"]
    data = json.loads(runner.invoke(app, ["memory", "sessions", "list", "--json"]).output)
    assert [s["id"] for s in data["sessions"]] == [session_id]


def test_errors_are_one_line_without_traceback(workspace: Path, home: Path) -> None:
    _seed(workspace)
    result = runner.invoke(app, ["memory", "sessions", "show", "no-such-id"])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and result.output.startswith("error: no Session")
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["memory", "sessions", "list", "--limit", "0"])  # a usage error names the flag
    assert result.exit_code == 2 and result.output.startswith("error: Invalid value for '--limit': must be between 1")


def test_invalid_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMELEX_BUSY_TIMEOUT_MS", "-1")
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1 and result.output.startswith("error: invalid setting busy_timeout_ms")


def test_reinit_after_deletion(workspace: Path, home: Path) -> None:
    _seed(workspace)
    db = home / "memory" / "emelex.sqlite3"
    before = file_state(db.parent)
    for args in (["memory", "reinit", "--yes"], ["memory", "reinit"]):  # refused before confirmation is asked
        refused = runner.invoke(app, args)
        assert refused.exit_code == 1 and refused.output.startswith(f"error: database {db} exists"), refused.output
        assert refused.output.count("\n") == 1
    assert file_state(db.parent) == before
    os.remove(db)
    deleted = runner.invoke(app, ["memory", "sessions", "list"])
    assert deleted.exit_code == 1 and "was deleted and nothing was recreated" in deleted.output
    assert not db.exists()
    unconfirmed = runner.invoke(app, ["memory", "reinit"])
    assert unconfirmed.exit_code == 1 and "--yes" in unconfirmed.output and not db.exists()
    assert runner.invoke(app, ["memory", "reinit", "--yes"]).exit_code == 0
    assert runner.invoke(app, ["memory", "sessions", "list"]).output.strip() == "no Sessions"


def test_config_toml_in_home_is_read(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text("session_lease_ttl_s = 12.5\n")
    assert WorkerSettings().session_lease_ttl_s == 12.5
    monkeypatch.setenv("EMELEX_SESSION_LEASE_TTL_S", "7")
    assert WorkerSettings().session_lease_ttl_s == 7
    assert WorkerSettings(session_lease_ttl_s=3).session_lease_ttl_s == 3


def test_malformed_config_toml_is_one_line(home: Path) -> None:
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text("busy_timeout_ms = = 3\n")
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and "config.toml is not valid TOML" in result.output
    assert result.output.strip().count("\n") == 0


def test_doctor_reports_a_deleted_database(home: Path) -> None:
    MemoryStore.open(WorkerSettings()).close()
    db = home / "memory" / "emelex.sqlite3"
    os.remove(db)
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert "was deleted and nothing was recreated" in result.output and "is missing" in result.output
    assert not db.exists()


@pytest.mark.parametrize("tampering", ["UPDATE events SET byte_end = byte_end - 1 WHERE seq = 2",
                                       "UPDATE events SET seq = 3 WHERE seq = 2"])
def test_doctor_reports_a_transcript_whose_head_would_be_wrong(home: Path, workspace: Path, tampering: str) -> None:
    session_id = _seed(workspace)
    assert runner.invoke(app, ["memory", "doctor"]).exit_code == 0
    conn = connect(home / "memory" / "emelex.sqlite3", busy_timeout_ms=1000)
    with conn:
        conn.execute(tampering)
    conn.close()
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert f"Session {session_id} at seq" in result.output and "restore the database" in result.output


def test_doctor_reports_a_corrupt_database(home: Path, workspace: Path) -> None:
    _seed(workspace)
    db = home / "memory" / "emelex.sqlite3"
    data = bytearray(db.read_bytes())
    page = 4096
    for offset in range(page, len(data), page):  # scribble over the header of every page after the first
        data[offset:offset + 12] = b"\x07" * 12
    db.write_bytes(bytes(data))
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "Traceback" not in result.output


def test_doctor_reports_a_symlinked_sidecar(home: Path, tmp_path: Path) -> None:
    MemoryStore.open(WorkerSettings()).close()
    side = home / "memory" / ".emelex.sqlite3.lock"
    os.remove(side)
    os.symlink(tmp_path / "elsewhere", side)
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1 and "symlink" in result.output
