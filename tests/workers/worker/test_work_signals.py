"""`emelex memory work` on the embedded default model (real llama.cpp inference in a real process on a real
pseudo-terminal), stopped by SIGINT and by SIGTERM at each stage of its model work: while llama.cpp is checked on
this CPU (the probe child), while the model file is being loaded, while the prompt is evaluated and while tokens are
generated. Every time: the stop is acknowledged on the terminal, the job goes back to pending with its attempt count
unchanged, its diagnostic names the stage it was stopped at, the status is 128+N, and nothing prints a traceback (nor
llama-cpp-python's "Exception ignored on calling ctypes callback function"). A second signal ends the process at
once, the job still released."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, NewEvent, Settings, content_digest
from emelex_workers.settings import WorkerSettings
from emelex_workers.models import ModelManager
from emelex_workers.worker.planning import default_model_budget
from tests.support.models import remember_probe_pass, require_default_model
from tests.support.terminal import Terminal, mapped

require_default_model()

from emelex_llamacpp.probe import ensure_generates  # noqa: E402 - only where llama_cpp is installed

WORKER = [sys.executable, "-c", "from emelex_workers.cli import main; main()", "memory", "work", "--kind",
          "compaction"]
TOPICS = ("the parser", "the cache", "the scheduler", "the exporter", "the importer", "the index", "the backup")
STAGES = {  # stage -> (what the run shows just before it: a pseudo-terminal text, "child" or "mapped"; what the
    # job's diagnostic then says it was stopped at)
    "probe": ("child", "while checking that llama.cpp runs on this CPU"),
    "load": ("mapped", "while loading the model"),
    "prompt": ("evaluating the prompt", "while evaluating the prompt"),
    "generation": ("tokens (prompt ", "while generating"),
}


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> Path:
    """The embedded model's file, with llama.cpp's probe passed once for the module (its marker is copied into each
    test's Home, except where the probe is the stage under test)."""
    home = tmp_path_factory.mktemp("probe-home")
    with ModelManager(WorkerSettings(home=home, plugins_autoload=False)) as manager:
        model = manager.install_default(link=True)
    ensure_generates(model.model_file, home, model_digest=content_digest(model.files))
    return model.model_file


def _home_with_a_job(home: Path, workspace: Path, model_file: Path, *, probe_passed: bool) -> str:
    """A Home with the default model linked and one compaction job over a long Session; its job ID."""
    settings = WorkerSettings(home=home, plugins_autoload=False, model_max_context_tokens=2048)
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    if probe_passed:
        remember_probe_pass(home, model)
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            list(lease.replay_all())
            for n in range(28):
                topic = TOPICS[n % len(TOPICS)]
                lease.append_turn([
                    NewEvent("user", {"text": f"What did we decide about {topic} in step {n}? Please remind me of "
                                              "the reasons and of anything we left open."}),
                    NewEvent("assistant", {"text": f"In step {n} we kept {topic} as it is, measured it again, and "
                                                   f"wrote the figures down in notes/{n}.md for the next review."}),
                ])
        with default_model_budget(settings) as budget:  # planned with the model's own tokenizer, as the CLI does
            queued = store.queue_compaction(session.id, context_window=budget.context_window,
                                            count_tokens=budget.count_tokens, force=True)
    assert queued.job is not None
    return queued.job.id


def _has_child(pid: int) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    text = f.read().decode()
            except OSError:
                continue
            if int(text[text.rfind(")") + 2:].split()[1]) == pid:
                return True
    return False


def _send(terminal: Terminal, signum: int) -> None:
    """SIGINT as a terminal's Ctrl-C sends it (to the whole process group, a probe child included); SIGTERM as a
    service manager sends it (to the worker)."""
    if signum == signal.SIGINT:
        os.killpg(terminal.proc.pid, signum)
    else:
        terminal.proc.send_signal(signum)


def _job(home: Path, job_id: str):
    with MemoryStore.open(Settings(home=home)) as store:
        return store.get_job(job_id)


def _run_and_stop(home: Path, model_file: Path, stage: str, signals: list[int]) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env.update(EMELEX_HOME=str(home), EMELEX_PLUGINS_AUTOLOAD="0", EMELEX_SUMMARY_MODE="abstractive",
               EMELEX_MODEL_MAX_CONTEXT_TOKENS="2048", TERM="xterm-256color")
    terminal = Terminal(WORKER, env, start_new_session=True)
    shown, _ = STAGES[stage]
    pid = terminal.proc.pid
    if shown == "child":
        terminal.wait_for(lambda: _has_child(pid))
    elif shown == "mapped":
        terminal.wait_for(lambda: mapped(pid, model_file))
    else:
        terminal.wait_for(lambda: shown in terminal.output)
    for n, signum in enumerate(signals):
        if n:  # a person presses again once the first was acknowledged (two at once arrive as one)
            terminal.wait_for(lambda: "to stop at once" in terminal.output, ended_ok=True)
        try:
            _send(terminal, signum)
        except ProcessLookupError:  # the run had ended already
            pass
    return terminal.finish()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_signal_at_each_stage_of_model_work_releases_the_job_at_once_without_an_attempt(
    stage: str, signum: int, probed: Path, tmp_path: Path, workspace: Path
) -> None:
    home = tmp_path / "home"
    job_id = _home_with_a_job(home, workspace, probed, probe_passed=stage != "probe")
    status, output = _run_and_stop(home, probed, stage, [signum])
    name = signal.Signals(signum).name
    assert status == 128 + signum, output[-3000:]
    assert f"stopping ({name}): job {job_id} goes back to pending after its current step, no attempt consumed" \
        in output, output[-3000:]
    assert "Traceback" not in output and "Exception ignored" not in output, output[-3000:]
    # The model file is mapped as its loading begins; the rest of a cached 100 MB file loads in milliseconds, so a
    # signal sent then may land just after it (the load's own abort is proven in test_engine_stop.py).
    stages = (STAGES[stage][1], "once the model was loaded") if stage == "load" else (STAGES[stage][1],)
    assert "released in " in output and any(f"stopped by {name} {s}" in output for s in stages), output[-3000:]
    job = _job(home, job_id)
    assert job.state == "pending" and job.attempts == 0
    assert job.diagnostics[-1].message.startswith(tuple(f"worker stopped by {name} {s}" for s in stages))
    assert job.diagnostics[-1].message.endswith("; no attempt consumed")


def test_a_second_signal_at_once_after_the_first_ends_the_worker_without_a_trace(
    probed: Path, tmp_path: Path, workspace: Path
) -> None:
    """A person pressing Ctrl-C twice during the prompt's evaluation: whichever of the two ends the run (the first
    one's stop is quick on this model, so the second often finds the job released already; the second's own release
    is proven where a binding ignores the stop, test_work_processes.py), the status is 130, nothing prints a
    traceback and the job is pending with no attempt consumed."""
    home = tmp_path / "home"
    job_id = _home_with_a_job(home, workspace, probed, probe_passed=True)
    status, output = _run_and_stop(home, probed, "prompt", [signal.SIGINT, signal.SIGINT])
    assert status == 130, output[-3000:]
    assert "Traceback" not in output and "Exception ignored" not in output, output[-3000:]
    job = _job(home, job_id)
    assert job.state == "pending" and job.attempts == 0
    assert job.diagnostics[-1].message in (
        "worker stopped at once by a second SIGINT; no attempt consumed",
        *(d.message for d in job.diagnostics if d.message.startswith("worker stopped by SIGINT while evaluating")))

