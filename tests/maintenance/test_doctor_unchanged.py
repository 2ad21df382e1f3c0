"""`emelex memory doctor` changes nothing it checks: a deleted sidecar or marker is reported missing (not recreated
and then passed), an older schema is reported (not migrated), a fresh Home is one line, and a symlinked Home gets
one remedy."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, Settings
from emelex_memory.maintenance.doctor import diagnose
from emelex_memory.core.migrations import MIGRATIONS, migrate
from emelex_memory.core.opening import sidecar_path
from emelex_memory.store import STORE_MARKER
from emelex_workers.cli import app

from ..support import file_state, table_rows
from ..core.test_symlinks import walk

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


@pytest.mark.parametrize("name", ["lock sidecar", "store marker"])
def test_a_deleted_sidecar_or_marker_is_reported_missing_and_stays_missing(home: Path, name: str) -> None:
    MemoryStore.open(Settings()).close()
    gone = sidecar_path(Settings().database_path) if name == "lock sidecar" else home / STORE_MARKER
    os.remove(gone)
    before = walk(home)
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert f"[FAIL] {name}: {gone} is missing; the next command that opens the store" in result.output
    assert f"[ok] {name}" not in result.output
    assert walk(home) == before and not os.path.lexists(gone)


def test_an_older_schema_is_reported_and_not_migrated(db_path: Path, settings: Settings) -> None:
    conn = apsw.Connection(str(db_path))
    conn.execute("PRAGMA journal_mode=WAL").fetchall()  # as every Emelex database is
    migrate(conn, MIGRATIONS[:7])
    conn.close()
    os.chmod(db_path, 0o600)
    before, files = table_rows(db_path), file_state(db_path.parent)
    report = diagnose(settings, database=db_path)
    (schema,) = [c for c in report.checks if c.name == "schema"]
    assert not schema.ok and schema.detail.startswith(f"version 7 of {len(MIGRATIONS)}")
    assert "opening the store migrates it" in schema.detail and "doctor itself changes nothing" in schema.detail
    assert not any(c.name in ("transcripts", "assets", "contents") for c in report.checks)  # they wait for it
    assert table_rows(db_path) == before and file_state(db_path.parent) == files


def test_doctor_on_a_fresh_home_prints_one_line(tmp_path: Path, home: Path) -> None:
    before = walk(tmp_path)
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: no store at {home} yet") and result.output.count("\n") == 1
    assert walk(tmp_path) == before


def test_a_symlinked_home_gets_one_remedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real-home"
    MemoryStore.open(Settings(home=real)).close()
    link = tmp_path / "linked-home"
    link.symlink_to(real)
    monkeypatch.setenv("EMELEX_HOME", str(link))
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1
    failed = [line for line in result.output.splitlines() if line.startswith("[FAIL]")]
    assert len(failed) == 1 and f"set EMELEX_HOME to {real}" in failed[0], result.output
    assert "replace it with a directory" not in result.output
