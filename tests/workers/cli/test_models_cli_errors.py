"""`emelex models` error paths create nothing (not even Home on a fresh machine), and `models list` still lists the
good models when one is damaged."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import ModelNotInstalledError
from emelex_workers.cli import app
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings

from ...support.plugins import fake_model_file


def tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `root` (root included) -> (mode, size, mtime_ns), without following symlinks."""
    if not os.path.lexists(root):
        return {}
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            st = os.lstat(os.path.join(directory, name))
            out[os.path.relpath(os.path.join(directory, name), root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def models(*args: str):
    return CliRunner().invoke(app, ["models", *args])


BAD = [
    (["install", "/etc/passwd"], "error: /etc/passwd is not a GGUF model file"),
    (["install", "/no/such/file.gguf"], "error: cannot read model file /no/such/file.gguf"),
    (["install", "/etc/passwd", "--name", "Bad Name"], "error: a model name is 1-64 characters"),
    (["install", "/etc/passwd", "--link"], "error: /etc/passwd is not a GGUF model file"),
    (["remove", "nosuch"], "error: no model 'nosuch' is installed"),
    (["verify", "nosuch"], "error: no model 'nosuch' is installed"),
    (["remove", "../etc"], "error: a model name is 1-64 characters"),
]


@pytest.mark.parametrize("args, message", BAD)
def test_error_paths_on_a_fresh_home_create_nothing(home: Path, monkeypatch, args, message) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    result = models(*args)
    assert result.exit_code == 1 and result.output.startswith(message) and result.output.count("\n") == 1
    assert not os.path.lexists(home)


@pytest.mark.parametrize("args, message", [*BAD, (["install", "{fake}", "--name", "good"], "error: a model named")])
def test_error_paths_on_a_home_with_models_change_nothing(home: Path, tmp_path: Path, monkeypatch, args, message):
    monkeypatch.setenv("EMELEX_HOME", str(home))
    fake = fake_model_file(tmp_path / "files")
    with ModelManager(WorkerSettings()) as manager:
        manager.install(fake, name="good")
    before = tree(home)
    result = models(*[a.replace("{fake}", str(fake)) for a in args])
    assert result.exit_code == 1 and result.output.startswith(message)
    assert tree(home) == before


def test_list_shows_the_good_models_and_flags_a_damaged_one(home: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with ModelManager(WorkerSettings()) as manager:
        for name in ("alpha", "broken", "gamma"):
            manager.install(fake_model_file(tmp_path / name), name=name)
    manifest = home / "models" / "broken" / "manifest.json"
    manifest.write_bytes(b"{not json")
    result = models("list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["alpha", "gamma"]
    assert lines[2].startswith("! broken") and "damaged: model manifest" in lines[2] and "reinstall" in lines[2]
    data = json.loads(models("list", "--json").output)
    assert [m["name"] for m in data["models"]] == ["alpha", "gamma"]
    assert [d["name"] for d in data["damaged"]] == ["broken"]
    assert "not a valid JSON object" in data["damaged"][0]["problem"]


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_list_flags_an_entry_that_is_no_directory_with_a_remedy(home: Path, tmp_path: Path, monkeypatch, kind) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with ModelManager(WorkerSettings()) as manager:
        manager.install(fake_model_file(tmp_path / "alpha"), name="alpha")
    odd = home / "models" / "odd"
    if kind == "file":
        odd.write_text("not a snapshot")
    else:
        odd.symlink_to(home / "models" / "alpha")
    lines = models("list").output.splitlines()
    assert lines[0].split()[0] == "alpha" and lines[1].startswith("! odd"), lines
    assert "damaged: model directory" in lines[1] and f"move {odd} out of {home / 'models'}" in lines[1]


def test_list_flags_a_truncated_or_missing_model_file_without_hashing(home: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with ModelManager(WorkerSettings()) as manager:
        for name in ("cut", "gone", "whole"):
            manager.install(fake_model_file(tmp_path / name), name=name)
    cut = home / "models" / "cut" / "model.gguf"
    size = cut.stat().st_size
    with open(cut, "r+b") as f:
        f.truncate(size // 2)
    (home / "models" / "gone" / "model.gguf").unlink()
    result = models("list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines[:1]] == ["whole"]
    flagged = {line.split()[1]: line for line in lines[1:]}
    assert flagged["cut"].startswith("! cut") and f"is {size // 2} bytes, its manifest says {size}" in flagged["cut"]
    assert flagged["gone"].startswith("! gone") and "model file is missing" in flagged["gone"]
    assert all("`emelex models remove" in line for line in flagged.values())
    data = json.loads(models("list", "--json").output)
    assert [m["name"] for m in data["models"]] == ["whole"] and {d["name"] for d in data["damaged"]} == {"cut", "gone"}


def test_a_missing_default_model_names_the_command_that_installs_it(home: Path, monkeypatch) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with pytest.raises(ModelNotInstalledError, match=r"`emelex models install --default`"):
        with ModelManager(WorkerSettings()) as manager:
            manager.default()
    assert not home.exists() or list(home.iterdir()) == []


@pytest.mark.parametrize("args", [["list"], ["list", "--json"], ["verify", "alpha"], ["remove", "alpha"]])
def test_a_home_that_is_a_file_is_reported_not_listed_as_empty(home: Path, monkeypatch, args) -> None:
    home.write_text("not a directory")
    monkeypatch.setenv("EMELEX_HOME", str(home))
    result = models(*args)
    assert result.exit_code == 1, result.output
    message = f"{home} is not a directory: move it away (or use another path) so that it can be one"
    if "--json" in args:
        assert json.loads(result.output) == {"error": {"type": "InsecurePathError", "message": message}}
    else:
        assert result.output == f"error: {message}\n"
    assert home.read_text() == "not a directory"
