"""Special files never hang Emelex: a FIFO (or other non-regular file) where a model manifest, stamp, model file,
linked target, GGUF source, config.toml, lock file or asset file belongs gives a typed one-line error.

Commands that could block run in a real subprocess with a generous timeout, so a regression fails the test
instead of hanging the suite (the timeout is a hang bound, not a timing assertion).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_memory import InsecurePathError, MemoryStore, Settings
from emelex_workers.settings import WorkerSettings
from emelex_memory.snapshots.installed import LOCK_NAME, MANIFEST_NAME, STAMP_NAME
from emelex_memory.core.opening import sidecar_path
from emelex_workers.models import ModelManager

from ..support import file_state
from ..support.plugins import fake_model_file, fake_plugin_distribution
from ..workers.worker.test_work import FAKE_SETTINGS, jobs, seed

HANG_BOUND_S = 120


def emelex(home: Path, *args: str, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the `emelex` CLI in a subprocess against `home`; fail the test if it does not finish."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env.update(FAKE_SETTINGS, EMELEX_HOME=str(home))
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    try:
        return subprocess.run(
            [sys.executable, "-c", "from emelex_workers.cli import main; main()", *args],
            env=env, capture_output=True, text=True, timeout=HANG_BOUND_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`emelex {' '.join(args)}` hung on a special file")


def one_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return result.stderr


def fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


@pytest.fixture
def installed(tmp_path: Path, home: Path) -> Settings:
    """Home with the fake model installed as "fake" (owned) and "linked" (a linked target)."""
    settings = WorkerSettings(home=home, **{k.removeprefix("EMELEX_").lower(): v for k, v in FAKE_SETTINGS.items()})
    with ModelManager(settings) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="fake")
        manager.install(fake_model_file(tmp_path / "linked", "target.gguf"), name="linked", link=True)
    return settings


def test_a_fifo_manifest_is_reported_by_list_and_refused_by_verify(installed: Settings, home: Path) -> None:
    fifo_in_place_of(home / "models" / "fake" / MANIFEST_NAME)
    listed = emelex(home, "models", "list")
    assert listed.returncode == 0, listed.stderr
    assert "! fake" in listed.stdout and "is not a regular file" in listed.stdout
    one_error_line(emelex(home, "models", "verify", "fake"), "manifest", "is not a regular file")


@pytest.mark.parametrize("victim", ["model.gguf", "linked-target"])
def test_a_fifo_model_file_or_linked_target_is_refused_by_verify(installed: Settings, home: Path, tmp_path: Path,
                                                                 victim: str) -> None:
    if victim == "model.gguf":
        fifo_in_place_of(home / "models" / "fake" / "model.gguf")
        name = "fake"
    else:
        fifo_in_place_of(tmp_path / "linked" / "target.gguf")
        name = "linked"
    one_error_line(emelex(home, "models", "verify", name), "is not a regular file")


@pytest.mark.parametrize("victim", [MANIFEST_NAME, STAMP_NAME])
def test_memory_work_releases_the_job_when_the_manifest_or_stamp_is_a_fifo(
    installed: Settings, home: Path, tmp_path: Path, workspace: Path, victim: str
) -> None:
    with MemoryStore.open(installed) as store:
        seed(store, workspace, distill=False)
    fifo_in_place_of(home / "models" / "fake" / victim)
    result = emelex(home, "memory", "work", "--quiet", extra_path=fake_plugin_distribution(tmp_path / "site"))
    one_error_line(result, "is not a regular file")
    with MemoryStore.open(installed) as store:
        job = jobs(store)["compaction"]
    assert job.state == "pending" and job.attempts == 0  # released: a model problem consumes no attempt


def test_a_fifo_given_to_models_install_is_refused_and_creates_nothing(home: Path, tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    os.mkfifo(source, 0o600)
    for args in (["models", "install", str(source)], ["models", "install", str(source), "--link"]):
        one_error_line(emelex(home, *args), "is not a GGUF model file")
    assert not os.path.lexists(home)


def test_a_fifo_config_toml_is_a_settings_error(home: Path) -> None:
    home.mkdir(mode=0o700)
    os.mkfifo(home / "config.toml", 0o600)
    before = file_state(home)
    one_error_line(emelex(home, "models", "list"), "config.toml", "is not a regular file")
    assert file_state(home) == before


def test_a_symlinked_config_toml_is_a_settings_error(home: Path, tmp_path: Path) -> None:
    home.mkdir(mode=0o700)
    real = tmp_path / "real.toml"
    real.write_text("busy_timeout_ms = 1234\n")
    os.symlink(real, home / "config.toml")
    with pytest.raises(Exception, match="config.toml is a symlink") as caught:
        Settings(home=home)
    assert type(caught.value).__name__ == "SettingsFileError"


def test_lock_files_that_are_fifos_are_refused(installed: Settings, home: Path) -> None:
    MemoryStore.open(installed).close()
    for path in (sidecar_path(installed.database_path), home / LOCK_NAME):
        if os.path.lexists(path):
            path.unlink()
        os.mkfifo(path, 0o600)
    with pytest.raises(InsecurePathError, match="not a regular file"):
        MemoryStore.open(installed)
    one_error_line(emelex(home, "models", "remove", "fake"), LOCK_NAME, "not a regular file")


def test_a_fifo_asset_file_is_reported_not_read(store: MemoryStore) -> None:
    ref = store.put_asset(b"bytes that will be replaced", "text/plain")
    fifo_in_place_of(store.asset_dir / ref.digest)
    page = store.verify_assets()
    assert [p.digest for p in page.problems] == [ref.digest] and "not a regular file" in page.problems[0].detail
    with pytest.raises(Exception, match="not a regular file"):
        store.read_asset(ref)
