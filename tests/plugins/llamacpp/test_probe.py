"""The llama.cpp probe: doctor runs it, and the worker runs it before its first inference, so a build that crashes
on this CPU is a one-line error naming the rebuild command, never a silent exit.

The crash is real (a child process killed by SIGILL) but comes from `tests/support/crashing_llama`, a stand-in llama_cpp
put first on PYTHONPATH, since no build here crashes on its own CPU.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings

from ...workers.worker.test_work import seed
from tests.support.models import require_default_model

require_default_model()

CRASHING = Path(__file__).parents[2] / "support" / "crashing_llama"
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
REBUILD = "`make rebuild-llama`"


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    """A Home with the embedded default model installed (linked), and an environment pointing at it."""
    with ModelManager(WorkerSettings(home=home)) as manager:
        manager.install_default(link=True)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    environment.update(EMELEX_HOME=str(home), EMELEX_PLUGINS_AUTOLOAD="0")
    return environment


def _crashing(env: dict[str, str]) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join([str(CRASHING), env.get("PYTHONPATH", "")])}


def test_doctor_probes_the_default_model(env: dict[str, str], home: Path) -> None:
    MemoryStore.open(WorkerSettings(home=home)).close()
    done = subprocess.run([*EMELEX, "memory", "doctor"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[ok] llama.cpp: generated 8 tokens with smollm2-135m-instruct on this CPU" in done.stdout
    assert "[ok] model threads: " in done.stdout and "(chosen: " in done.stdout


def test_doctor_reports_a_crashing_build_as_one_line_naming_the_rebuild(env: dict[str, str], home: Path) -> None:
    MemoryStore.open(WorkerSettings(home=home)).close()
    done = subprocess.run([*EMELEX, "memory", "doctor", "--json"], env=_crashing(env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    check = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "llama.cpp")
    assert check == {"name": "llama.cpp", "ok": False, "detail": (
        "llama.cpp crashed (SIGILL) generating on this CPU: its build does not fit this machine; rebuild it with "
        f"{REBUILD}")}


def test_the_worker_stops_with_one_line_instead_of_dying_silently(env: dict[str, str], home: Path,
                                                                    workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        seed(store, workspace, distill=False)
    done = subprocess.run([*EMELEX, "memory", "work"], env=_crashing(env), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    error = done.stderr.splitlines()[-1]
    assert error == ("error: llama.cpp crashed (SIGILL) generating on this CPU: its build does not fit this machine; "
                     f"rebuild it with {REBUILD}")
    assert "released" in done.stderr  # the job's end line: released, no attempt consumed
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (job,) = store.list_jobs().jobs
        assert job.state == "pending" and job.attempts == 0


def test_a_passed_probe_is_remembered_in_home_for_this_build_model_and_cpu(env: dict[str, str], home: Path) -> None:
    from emelex_llamacpp.probe import probe_key

    child = ("import sys\n"
             "from emelex_workers.settings import WorkerSettings\n"
             "from emelex_workers.models import ModelManager\n"
             "from emelex_workers.host.manager import bind_model, get_plugin_manager\n"
             "settings = WorkerSettings()\n"
             "with ModelManager(settings) as manager:\n"
             "    model = manager.default()\n"
             "_, binding = bind_model(get_plugin_manager(settings), model, settings)\n"
             "print(binding.context_window)\n"
             "binding.close()\n")
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (marker,) = (home / "cache").iterdir()
    with ModelManager(WorkerSettings(home=home)) as manager:
        model = manager.default()
    from emelex_memory.snapshots.installed import content_digest

    assert marker.name == f"llama-probe-{probe_key(model.model_file, content_digest(model.files))}"
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600 and stat.S_IMODE((home / "cache").stat().st_mode) == 0o700
    # The same build on another CPU, or another build, is another key: the stand-in llama_cpp has other libraries.
    other = subprocess.run(
        [sys.executable, "-c", "import sys; from emelex_llamacpp.probe import probe_key; "
                               "print(probe_key(sys.argv[1], sys.argv[2]))", str(model.model_file),
         content_digest(model.files)], env=_crashing(env), capture_output=True, text=True, timeout=60, check=True)
    assert other.stdout.strip() != marker.name.removeprefix("llama-probe-")


def test_chat_stops_with_one_line_and_creates_nothing(env: dict[str, str], home: Path, workspace: Path) -> None:
    done = subprocess.run([*EMELEX, "chat"], env=_crashing(env), cwd=workspace, input="hello\n", capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ("error: llama.cpp crashed (SIGILL) generating on this CPU: its build does not fit this "
                           f"machine; rebuild it with {REBUILD}\n")
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        assert store.list_sessions().sessions == []
