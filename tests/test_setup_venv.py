"""scripts/setup-venv refuses what cannot work before it creates anything, and removes a half-made venv.

Each run uses stand-in `python` executables on PATH (shell scripts answering the few calls the script makes
before any install), so no real venv or llama.cpp build is made here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "setup-venv"


def _shim(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _setup(tmp_path: Path, python: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHON": python,
           "EMELEX_WHEEL_CACHE": str(tmp_path / "wheels")}
    return subprocess.run([str(SCRIPT), str(tmp_path / ".venv")], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_an_old_python_is_refused_naming_its_version_and_nothing_is_created(tmp_path: Path) -> None:
    _shim(tmp_path / "bin", "python3.10", 'case "$1" in -V) echo "Python 3.10.12";; *) exit 1;; esac\n')
    done = _setup(tmp_path, "python3.10")
    assert done.returncode == 1
    assert done.stdout == ("[setup] Python 3.10.12 is too old: Emelex needs Python 3.11 or newer "
                           "(pass PYTHON=python3.11)\n")
    assert sorted(os.listdir(tmp_path)) == ["bin"]  # no .venv, no wheel cache


def test_a_missing_python_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    done = _setup(tmp_path, "python3.99")
    assert done.returncode == 1
    assert done.stdout == ("[setup] no 'python3.99' on PATH: install Python 3.11 or newer, or pass "
                           "PYTHON=/path/to/python3.11\n")
    assert sorted(os.listdir(tmp_path)) == ["bin"]


def test_a_failed_step_removes_the_half_made_venv(tmp_path: Path) -> None:
    # A Python new enough whose `-m venv DIR` leaves a partial DIR behind and fails, as a full disk would.
    _shim(tmp_path / "bin", "python3.12", 'case "$1" in\n  -V) echo "Python 3.12.1";;\n'
                                          '  -m) mkdir -p "$3/bin" && touch "$3/half"; exit 1;;\n  *) exit 0;;\nesac\n')
    done = _setup(tmp_path, "python3.12")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-3:] == [
        f"[setup] creating {tmp_path / '.venv'} with Python 3.12.1",
        f"[setup] failed: could not create {tmp_path / '.venv'}",
        f"[setup] removed the half-made {tmp_path / '.venv'}; fix the cause and run the same command again",
    ]
    assert not (tmp_path / ".venv").exists()
