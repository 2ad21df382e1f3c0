"""A stored event payload that is not valid JSON (the events table altered behind Emelex's back): `sessions show`
reports it on the event's line (and in `--json`) instead of a traceback, reading it raises a typed error, and
`doctor` finds it by Session and seq."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import CorruptEventError, MemoryStore, NewEvent, Settings
from emelex_workers.cli import app

runner = CliRunner()


@pytest.fixture
def tampered(home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A Session of three events whose second payload was overwritten with broken JSON through a raw connection."""
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(Settings()) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "first"}), NewEvent("assistant", {"text": "broken soon"})])
            lease.append_turn([NewEvent("user", {"text": "third"})])
            lease.release()
    assert runner.invoke(app, ["memory", "doctor"]).exit_code == 0
    conn = apsw.Connection(str(home / "memory" / "emelex.sqlite3"), flags=apsw.SQLITE_OPEN_READWRITE)
    conn.execute("""UPDATE events SET payload = '{"text": "brok' WHERE seq = 2""")
    conn.close()
    return session.id


def test_reading_the_payload_is_a_typed_error(tampered: str) -> None:
    with MemoryStore.open(Settings()) as store:
        events = store.replay(tampered).events
        assert events[0].payload == {"text": "first"}
        with pytest.raises(CorruptEventError) as raised:
            events[1].payload
    assert "seq 2" in str(raised.value) and "not valid JSON" in str(raised.value)
    assert "restore the database from a backup" in str(raised.value)


def test_sessions_show_reports_the_event_and_exits_nonzero(tampered: str) -> None:
    result = runner.invoke(app, ["memory", "sessions", "show", tampered])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.splitlines()
    assert any('"first"' in line for line in lines) and any('"third"' in line for line in lines)
    bad = [line for line in lines if line.lstrip().startswith("#2 ")]
    assert len(bad) == 1 and "payload is not valid JSON" in bad[0] and "restore the database from a backup" in bad[0]
    assert lines[-1].startswith("error: ") and "seq 2" in lines[-1]


def test_sessions_show_json_reports_the_event(tampered: str) -> None:
    result = runner.invoke(app, ["memory", "sessions", "show", tampered, "--json"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    data = json.loads(result.output.splitlines()[0])
    events = {e["seq"]: e for e in data["events"]}
    assert events[1]["payload"] == {"text": "first"} and events[3]["payload"] == {"text": "third"}
    assert events[2]["payload"] is None and "not valid JSON" in events[2]["payload_error"]
    assert "payload_error" not in events[1]


def test_doctor_finds_the_event(tampered: str) -> None:
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    line = next(line for line in result.output.splitlines() if line.startswith("[FAIL] payloads"))
    assert f"Session {tampered} at seq 2" in line and "restore the database from a backup" in line
    data = json.loads(runner.invoke(app, ["memory", "doctor", "--json"]).output)
    assert not data["healthy"] and [c["ok"] for c in data["checks"] if c["name"] == "payloads"] == [False]
