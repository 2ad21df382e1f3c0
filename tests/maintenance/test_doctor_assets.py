"""`emelex memory doctor` re-hashes asset files, bounded, says how many it checked of how many, reports a corrupted
file, and creates no asset folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import AssetRef, MemoryStore, Settings
from emelex_memory.maintenance.doctor import diagnose
from emelex_workers.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def _put(n: int) -> list[AssetRef]:
    with MemoryStore.open(Settings()) as store:
        return sorted((store.put_asset(f"asset {i} ".encode() * 10, "text/plain") for i in range(n)),
                      key=lambda r: r.digest)


def _corrupt(home: Path, ref: AssetRef) -> None:
    """Overwrite the file's bytes in place (same size, owner and mode): only re-hashing can tell."""
    path = home / "memory" / "assets" / ref.digest
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, bytes(data))
    finally:
        os.close(fd)


def _asset_check(data: dict) -> dict:
    return next(c for c in data["checks"] if c["name"] == "assets")


def test_doctor_reports_a_corrupted_asset(home: Path) -> None:
    refs = _put(3)
    assert runner.invoke(app, ["memory", "doctor"]).exit_code == 0
    _corrupt(home, refs[1])
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1 and "NOT healthy" in result.output
    line = next(line for line in result.output.splitlines() if line.startswith("[FAIL] assets"))
    assert refs[1].digest in line and "checked 3 of 3 asset entries" in line
    check = _asset_check(json.loads(runner.invoke(app, ["memory", "doctor", "--json"]).output))
    assert not check["ok"] and refs[1].digest in check["detail"]


def test_doctor_checks_a_bounded_number_and_says_how_many(home: Path) -> None:
    refs = _put(3)
    _corrupt(home, refs[2])  # beyond the bound: not found, and the output says the check was partial
    result = runner.invoke(app, ["memory", "doctor", "--max-assets", "2"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("[ok] assets"))
    assert "checked 2 of 3 asset entries" in line and "emelex memory assets verify" in line
    report = diagnose(Settings(), max_asset_entries=3, max_asset_bytes=1)  # at least one file, then the byte bound
    check = next(c for c in report.checks if c.name == "assets")
    assert check.ok and "checked 1 of 3 asset entries" in check.detail


def test_doctor_creates_no_asset_folder(home: Path) -> None:
    MemoryStore.open(Settings()).close()  # a new store comes with its asset folder
    folder = home / "memory" / "assets"
    shutil.rmtree(folder)  # gone (say, removed by hand): doctor checks what is there and recreates nothing
    result = runner.invoke(app, ["memory", "doctor"])
    assert result.exit_code == 0, result.output
    assert "[ok] assets: checked 0 of 0 asset entries" in result.output
    assert not os.path.lexists(folder)


def test_files_that_were_never_read_count_no_hashed_bytes(home: Path) -> None:
    refs = _put(3)
    os.remove(home / "memory" / "assets" / refs[0].digest)  # missing: nothing to read
    os.chmod(home / "memory" / "assets" / refs[1].digest, 0o644)  # refused on its mode, before reading
    check = next(c for c in diagnose(Settings()).checks if c.name == "assets")
    assert f"checked 3 of 3 asset entries ({refs[2].size} bytes hashed)" in check.detail
    shutil.rmtree(home / "memory" / "assets")  # no folder at all: no bytes hashed either
    check = next(c for c in diagnose(Settings()).checks if c.name == "assets")
    assert "checked 3 of 3 asset entries (0 bytes hashed), 3 damaged" in check.detail
