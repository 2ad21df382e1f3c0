"""`emelex memory assets list|show|verify` and the asset facts of `emelex memory doctor`, through CliRunner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import AssetRef, MemoryStore, NewEvent
from emelex_workers.cli import app
from emelex_workers.cli import assets as assets_cli
from emelex_workers.settings import WorkerSettings

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def _seed(workspace: Path) -> tuple[str, list[AssetRef]]:
    with MemoryStore.open(WorkerSettings()) as store:
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
    assert data["problem_count"] == 1
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


def test_verify_json_lists_a_bounded_number_of_problems_and_counts_them_all(
    workspace: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, refs = _seed(workspace)
    for ref in refs:
        os.chmod(home / "memory" / "assets" / ref.digest, 0o644)
    monkeypatch.setattr(assets_cli, "MAX_JSON_PROBLEMS", 1)
    result = runner.invoke(app, ["memory", "assets", "verify", "--json", "--page-size", "1"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["problem_count"] == 2 and len(data["problems"]) == 1 and data["complete"]
    text = runner.invoke(app, ["memory", "assets", "verify", "--page-size", "1"])  # text streams every problem
    assert text.output.count("[FAIL]") == 2 and "2 problem(s)" in text.output


def test_sessions_show_lists_each_events_assets(workspace: Path) -> None:
    session_id, refs = _seed(workspace)
    shown = runner.invoke(app, ["memory", "sessions", "show", session_id])
    assert shown.exit_code == 0, shown.output
    assert f"asset {refs[0].digest[:12]}  40 bytes  image/png" in shown.output
    assert refs[1].digest[:12] not in shown.output  # stored, but no event links it
    assert "  history:   1 event in 1 turn, " in shown.output  # counted in words: one event, not "1 events"
    data = json.loads(runner.invoke(app, ["memory", "sessions", "show", session_id, "--json"]).output)
    assert [e["assets"] for e in data["events"]] == [
        [{"digest": refs[0].digest, "size": 40, "media_kind": "image/png"}]]


def test_show_says_when_more_links_exist(workspace: Path) -> None:
    session_id, refs = _seed(workspace)
    with MemoryStore.open(WorkerSettings()) as store:
        with store.acquire_lease(session_id, workspace) as lease:
            list(lease.replay_all())
            lease.append_turn([NewEvent("user", "again", assets=(refs[0],))])
    result = runner.invoke(app, ["memory", "assets", "show", refs[0].digest, "--links", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.count("linked:   Session") == 1 and "more than 1 events" in result.output
    data = json.loads(runner.invoke(app, ["memory", "assets", "show", refs[0].digest, "--json"]).output)
    assert len(data["links"]) == 2 and not data["more_links"] and not data["more_entries"]
