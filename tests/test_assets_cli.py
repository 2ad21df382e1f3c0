"""`emelex memory assets list|show|verify` and the asset facts of `emelex memory doctor`, through CliRunner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import AssetRef, MemoryStore, NewEvent, Settings
from emelex_workers.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def _seed(workspace: Path) -> tuple[str, list[AssetRef]]:
    with MemoryStore.open(Settings()) as store:
        refs = [store.put_asset(b"png " * 10, "image/png"), store.put_asset(b"wav " * 20, "audio/wav")]
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", "look", assets=(refs[0],))])
    return session.id, refs


def test_list_pages_and_prints_json(workspace: Path) -> None:
    _, refs = _seed(workspace)
    result = runner.invoke(app, ["memory", "assets", "list", "--limit", "1"])
    assert result.exit_code == 0, result.output
    first = min(refs, key=lambda r: r.digest)
    assert first.digest in result.output and "more: --cursor" in result.output
    data = json.loads(runner.invoke(app, ["memory", "assets", "list", "--json"]).output)
    assert {(a["digest"], a["media_kind"], a["size"], a["links"]) for a in data["assets"]} == {
        (refs[0].digest, "image/png", 40, 1), (refs[1].digest, "audio/wav", 80, 0)}
    assert data["next_cursor"] is None


def test_show_names_the_file_its_entries_and_linking_events(workspace: Path, home: Path) -> None:
    session_id, refs = _seed(workspace)
    result = runner.invoke(app, ["memory", "assets", "show", refs[0].digest])
    assert result.exit_code == 0, result.output
    assert str(home / "memory" / "assets" / refs[0].digest) in result.output
    assert "verified: ok" in result.output and f"Session {session_id} event #1" in result.output
    data = json.loads(runner.invoke(app, ["memory", "assets", "show", refs[0].digest, "--json"]).output)
    assert data["verified"] and data["links"] == [
        {"session": session_id, "seq": 1, "ordinal": 0, "media_kind": "image/png"}]
    missing = runner.invoke(app, ["memory", "assets", "show", "c" * 64])
    assert missing.exit_code == 1 and "no asset" in missing.output


def test_verify_reports_what_is_wrong_and_fails(workspace: Path, home: Path) -> None:
    _, refs = _seed(workspace)
    ok = runner.invoke(app, ["memory", "assets", "verify", "--page-size", "1"])
    assert ok.exit_code == 0, ok.output
    assert "checked 2 entries, 120 bytes hashed: 0 problem(s)" in ok.output
    os.chmod(home / "memory" / "assets" / refs[1].digest, 0o644)
    bad = runner.invoke(app, ["memory", "assets", "verify"])
    assert bad.exit_code == 1
    assert f"[FAIL] {refs[1].digest} (audio/wav)" in bad.output and "mode 0644" in bad.output
    data = json.loads(runner.invoke(app, ["memory", "assets", "verify", "--json"]).output)
    assert data["complete"] and [p["digest"] for p in data["problems"]] == [refs[1].digest]
    shown = runner.invoke(app, ["memory", "assets", "show", refs[1].digest])
    assert shown.exit_code == 1 and "mode 0644" in shown.output


def test_doctor_counts_assets(workspace: Path, home: Path) -> None:
    _seed(workspace)
    data = json.loads(runner.invoke(app, ["memory", "doctor", "--json"]).output)
    assert data["healthy"]
    assert (data["facts"]["assets"], data["facts"]["asset_bytes"]) == (2, 120)
    assert any(c["name"] == "asset directory" and c["ok"] for c in data["checks"])
    os.chmod(home / "memory" / "assets", 0o777)
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1 and "[FAIL] asset directory" in result.output
