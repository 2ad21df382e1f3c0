"""Every path Emelex opens refuses to follow symlinks, consistently: the models directory on every access, the
asset folder and its parents while a store is open, and a Home (or database directory) under a symlinked parent."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import InsecurePathError, MemoryStore, NewEvent, Settings, StoreClosedError, UnsafeModelPathError
from emelex_workers.cli import app
from emelex_workers.models import ModelManager

from ..support.plugins import fake_model_file
from ..workers.cli.test_models_cli_errors import tree
from ..workers.worker.test_work import env, jobs, seed  # noqa: F401 - the fixture and helpers of the worker tests


def _swap_for_symlink(path: Path, elsewhere: Path) -> None:
    """Move the real directory `path` to `elsewhere` and leave a symlink to it in its place."""
    shutil.move(path, elsewhere)
    os.symlink(elsewhere, path)


# -- the models directory -------------------------------------------------------------------------------------


def test_a_symlinked_models_directory_is_refused_by_every_model_access(home: Path, tmp_path: Path) -> None:
    settings = Settings(home=home)
    source = fake_model_file(tmp_path / "files")
    with ModelManager(settings) as manager:
        manager.install(source, name="fake")
        _swap_for_symlink(home / "models", tmp_path / "elsewhere")
        before = tree(tmp_path / "elsewhere")
        for call in (
            lambda: manager.get("fake"), manager.list, manager.inventory, lambda: manager.verify("fake"),
            lambda: manager.remove("fake"), lambda: manager.install(source, name="other"),
        ):
            with pytest.raises(UnsafeModelPathError, match=f"{home / 'models'} is a symlink"):
                call()
    assert tree(tmp_path / "elsewhere") == before


def test_memory_work_refuses_a_symlinked_models_directory(env: Settings, workspace: Path, tmp_path: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
    _swap_for_symlink(env.home_dir / "models", tmp_path / "elsewhere")
    for args in (["memory", "work"], ["memory", "compact", jobs_session(env)]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"error: {env.home_dir / 'models'} is a symlink")
    with MemoryStore.open(env) as store:
        job = jobs(store)["compaction"]
    assert job.state == "pending" and job.attempts == 0 and job.diagnostics == ()


def jobs_session(settings: Settings) -> str:
    with MemoryStore.open(settings) as store:
        return jobs(store)["compaction"].session_id


# -- a Home or database directory under a symlinked parent ------------------------------------------------------


def walk(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` -> (mode, size), without following symlinks."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(directory, name))
            out[os.path.relpath(os.path.join(directory, name), root)] = (st.st_mode, st.st_size)
    return out


@pytest.fixture
def link(tmp_path: Path) -> Path:
    """`tmp_path/link`, a symlink to the real directory `tmp_path/real`."""
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    return tmp_path / "link"


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "existing-store"])
def test_a_home_under_a_symlinked_parent_is_refused_and_nothing_is_created(
    link: Path, tmp_path: Path, existing: bool
) -> None:
    real_home = tmp_path / "real" / "home"
    if existing:
        MemoryStore.open(Settings(home=real_home)).close()
    before = walk(tmp_path)
    settings = Settings(home=link / "home")
    expected = f"under the symlink {link} .*set EMELEX_HOME to {real_home}$"
    with pytest.raises(InsecurePathError, match=expected):
        MemoryStore.open(settings)
    with pytest.raises(InsecurePathError, match=expected):
        MemoryStore.reinitialize(settings, confirm=True)
    with pytest.raises(UnsafeModelPathError, match=expected):
        ModelManager(settings).install(fake_model_file(tmp_path / "files"), name="fake")
    (tmp_path / "files" / "fake.gguf").unlink()
    os.rmdir(tmp_path / "files")
    assert walk(tmp_path) == before


def test_a_symlinked_home_names_its_real_path(tmp_path: Path) -> None:
    (tmp_path / "real-home").mkdir(mode=0o700)
    os.symlink(tmp_path / "real-home", tmp_path / "home")
    before = walk(tmp_path)
    with pytest.raises(InsecurePathError, match=f"home is a symlink.*set EMELEX_HOME to {tmp_path / 'real-home'}$"):
        MemoryStore.open(Settings(home=tmp_path / "home"))
    assert walk(tmp_path) == before


def test_an_explicit_database_under_a_symlinked_parent_is_refused_and_nothing_is_created(
    link: Path, tmp_path: Path, settings: Settings
) -> None:
    (tmp_path / "real" / "db").mkdir(mode=0o700)
    before = walk(tmp_path)
    expected = f"under the symlink {link} .*open {tmp_path / 'real' / 'db' / 'x.sqlite3'} instead$"
    with pytest.raises(InsecurePathError, match=expected):
        MemoryStore.open_path(link / "db" / "x.sqlite3", settings)
    with pytest.raises(InsecurePathError, match=expected):
        MemoryStore.reinitialize_path(link / "db" / "x.sqlite3", confirm=True)
    assert walk(tmp_path) == before


def test_the_cli_refuses_a_home_under_a_symlinked_parent_in_one_line(link: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(link / "home"))
    before = walk(tmp_path)
    for args in (["memory", "reinit", "--yes"], ["models", "install", "--default"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"error: Emelex Home {link / 'home'} is under the symlink {link}")
    assert walk(tmp_path) == before


# -- the asset folder while a store is open ----------------------------------------------------------------------


def _decoy(root: Path, asset_folder: str) -> Path:
    """A private directory laid out like a database directory, with an old orphan-looking file in its asset folder."""
    (root / asset_folder / "tmp").mkdir(mode=0o700, parents=True)
    os.chmod(root, 0o700)
    os.chmod(root / asset_folder, 0o700)
    bait = root / asset_folder / ("0" * 64)
    bait.write_bytes(b"not the store's")
    os.chmod(bait, 0o600)
    os.utime(bait, (1, 1))
    return root


@pytest.mark.parametrize("standard", [False, True], ids=["open_path", "standard"])
def test_swapping_a_parent_of_the_asset_folder_for_a_symlink_redirects_nothing(
    tmp_path: Path, settings: Settings, workspace: Path, standard: bool
) -> None:
    if not standard:
        (tmp_path / "db").mkdir(mode=0o700)
    store = MemoryStore.open(settings) if standard else MemoryStore.open_path(tmp_path / "db" / "x.sqlite3", settings)
    with store:
        first = store.put_asset(b"first asset", "text/plain")
        parent = store.path.parent
        decoy = _decoy(tmp_path / "decoy", store.asset_dir.name)
        before = walk(decoy)
        moved = tmp_path / "moved"
        os.rename(parent, moved)  # the store's real directory lives on under another name ...
        os.symlink(decoy, parent)  # ... and its old name now leads elsewhere
        second = store.put_asset(b"second asset", "text/plain")
        assert store.read_asset(first) == b"first asset" and store.read_asset(second) == b"second asset"
        with store.open_asset(second) as reader:
            assert reader.read() == b"second asset"
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "look"}, assets=(first, second))])
        assert store.verify_assets().problems == []
        report = store.collect_assets(grace_s=0)
        assert report.strays == [] and report.removed_orphans == 0
        assert walk(decoy) == before
        assert sorted(os.listdir(moved / store.asset_dir.name)) == sorted([first.digest, second.digest, "tmp"])


def test_a_symlink_in_place_of_the_asset_folder_is_refused_while_open(store: MemoryStore, tmp_path: Path) -> None:
    ref = store.put_asset(b"kept", "text/plain")
    decoy = _decoy(tmp_path / "decoy", "assets") / "assets"
    before = walk(decoy)
    os.rename(store.asset_dir, tmp_path / "real-assets")
    os.symlink(decoy, store.asset_dir)
    for call in (lambda: store.put_asset(b"new", "text/plain"), lambda: store.read_asset(ref), store.collect_assets):
        with pytest.raises(InsecurePathError, match="is a symlink"):
            call()
    assert walk(decoy) == before


def test_a_closed_store_refuses_to_put_an_asset(store: MemoryStore) -> None:
    store.put_asset(b"x", "text/plain")
    store.close()
    with pytest.raises(StoreClosedError, match="was closed"):
        store.put_asset(b"y", "text/plain")
