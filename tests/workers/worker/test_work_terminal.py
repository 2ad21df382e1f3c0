"""`emelex memory work` on a terminal (a real pseudo-terminal): live progress of the model's tokens while it runs."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_workers.settings import WorkerSettings

from .test_work_processes import WORKER, proc_env  # noqa: F401 - `proc_env` is a fixture
from .test_work import seed

TOKENS = 20
DELAY_S = 0.02  # per token: the run lasts long enough for the display to redraw with a rate


def _run_on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `args` with stdin, stdout and stderr on a 160-column pseudo-terminal; return its status and output."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while True:
        ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            proc.kill()
            raise AssertionError(f"the worker on the terminal did not finish in 120 s: {b''.join(chunks)[-2000:]!r}")
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")


def test_work_on_a_terminal_shows_live_token_progress(proc_env: dict, home: Path, workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        sid = seed(store, workspace, distill=False)
    proc_env.update(TERM="xterm-256color", EMELEX_FAKE_PLUGIN=json.dumps({"chat": TOKENS, "delay": DELAY_S}))
    status, output = _run_on_a_terminal(WORKER, proc_env)
    assert status == 0, output
    assert "[worker] model threads: " in output and "(chosen: " in output  # how many threads, and why
    assert "[compaction] job " in output and f"Session {sid}  attempt 1 of 3  source " in output  # the start line
    assert re.search(r"\[compaction\] [0-9a-f]{8} ", output)  # the live bar of the job
    assert "/64 tokens (prompt 9)" in output  # its tokens so far of the call's limit, and the prompt's
    assert "tok/s" in output  # and tokens per second
    assert " done in " in output and f"(9 prompt + {TOKENS} generated tokens)" in output  # the end line
    assert "emelex work: 1 job(s) in " in output
    assert "\x1b[" in output  # drawn with terminal control sequences, not as plain lines


def test_a_slow_prompt_evaluation_shows_on_the_terminal_before_the_first_token(
    proc_env: dict, home: Path, workspace: Path
) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        seed(store, workspace, distill=False)
    proc_env.update(TERM="xterm-256color", EMELEX_FAKE_PLUGIN=json.dumps(
        {"chat": 3, "prompt_steps": 3, "prompt_delay": 0.3}))  # the binding reports its prompt slowly
    status, output = _run_on_a_terminal(WORKER, proc_env)
    assert status == 0, output
    assert "evaluating the prompt: 0/9 tokens" in output  # drawn before anything was evaluated
    assert "evaluating the prompt: 6/9 tokens" in output  # and moved while it is
    assert output.index("evaluating the prompt: 6/9") < output.index("/64 tokens (prompt 9)")  # then generation
    assert " done in " in output and "(9 prompt + 3 generated tokens)" in output


def test_work_without_a_terminal_prints_plain_lines(proc_env: dict, home: Path, workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        seed(store, workspace, distill=False)
    proc_env.update(TERM="xterm-256color", EMELEX_FAKE_PLUGIN=json.dumps({"chat": TOKENS}))
    proc = subprocess.run(WORKER, env=proc_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    threads, started, ended = proc.stderr.splitlines()
    assert threads.startswith("[worker] model threads: ")
    assert started.startswith("[compaction] job ") and " done in " in ended
    assert "\x1b[" not in proc.stderr and "tok/s" not in proc.stderr
    assert proc.stdout.startswith("emelex work: 1 job(s) in ")


def test_the_live_bar_appears_only_once_the_model_reports_and_goes_with_its_job() -> None:
    import io

    from emelex_workers.cli.work_display import LiveProgress
    from emelex_workers.plugin_api import GenerationProgress
    from emelex_workers.worker.work_report import JobReport, JobStart

    start = JobStart("j" * 36, "compaction", "s" * 36, 1, 100)
    with LiveProgress(io.StringIO()) as live:
        live.job_started(start)
        assert live.progress.tasks == []  # no model has run: no "evaluating prompt" bar
        live.job_finished(JobReport(start.id, "compaction", start.session_id, "done", "completed", 0.1))
        live.job_started(start)
        live.generating(start, GenerationProgress(9, 3), 64)
        (task,) = live.progress.tasks
        assert task.completed == 3 and task.total == 64
        live.job_finished(JobReport(start.id, "compaction", start.session_id, "done", "completed", 0.1))
        assert live.progress.tasks == []  # no stale bar is left for the next job


def test_the_bar_shows_the_prompt_evaluation_then_the_generation_of_each_call() -> None:
    import io

    from emelex_workers.cli.work_display import LiveProgress
    from emelex_workers.plugin_api import GenerationProgress
    from emelex_workers.worker.work_report import JobStart

    now = [100.0]
    start = JobStart("j" * 36, "compaction", "s" * 36, 1, 100)
    with LiveProgress(io.StringIO(), clock=lambda: now[0]) as live:
        live.job_started(start)
        live.generating(start, GenerationProgress(2000, 0, "", evaluated_tokens=0), 64)
        (task,) = live.progress.tasks
        assert (task.completed, task.total) == (0, 2000)
        assert task.fields["tokens"] == "evaluating the prompt: 0/2000 tokens" and task.fields["rate"] == ""
        now[0] += 4.0
        live.generating(start, GenerationProgress(2000, 0, "", evaluated_tokens=512), 64)
        assert (task.completed, task.total) == (512, 2000) and task.fields["rate"] == "128.0 tok/s"
        now[0] += 10.0
        live.generating(start, GenerationProgress(2000, 1, "a"), 64)  # generation: its own rate from here
        now[0] += 0.5
        live.generating(start, GenerationProgress(2000, 5, "b"), 64)
        assert (task.completed, task.total) == (5, 64)
        assert task.fields["tokens"] == "5/64 tokens (prompt 2000)" and task.fields["rate"] == "10.0 tok/s"
        live.generating(start, GenerationProgress(300, 0, "", evaluated_tokens=0), 64)  # the job's next call
        assert (task.completed, task.total) == (0, 300)


LONG_DETAIL = ("PluginHookError: summarizer 'llamacpp' of plugin 'llamacpp' could not load the model: " +
               "the file is not readable because the disk went away while it was being read " * 4 +
               "; fix it with `emelex models verify smollm2-135m-instruct` and then run the worker again")


def test_a_failure_line_keeps_its_whole_diagnostic_wrapped_never_cut() -> None:
    import io

    from emelex_workers.cli.work_display import LiveProgress, PlainLines, end_line
    from emelex_workers.worker.work_report import JobReport, JobStart

    report = JobReport("j" * 36, "compaction", "s" * 36, "retrying", LONG_DETAIL, 1.5)
    assert end_line(report).endswith(f": {LONG_DETAIL}")
    plain = io.StringIO()
    PlainLines(plain).job_finished(report)
    assert plain.getvalue() == end_line(report) + "\n"  # one line, whole, for logs and cron mail
    out = io.StringIO()
    with LiveProgress(out) as live:
        live.job_started(JobStart(report.id, "compaction", report.session_id, 1, 100))
        live.job_finished(report)
    lines = out.getvalue().splitlines()
    assert len(lines) > 4 and all(len(line) <= 80 for line in lines)  # wrapped to the terminal's width
    words = " ".join(out.getvalue().split())
    assert words.endswith(" ".join(end_line(report).split()))  # broken at spaces only: not a character lost


def test_an_idle_run_says_so_on_a_terminal_only(proc_env: dict, home: Path, workspace: Path) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        store.create_session(workspace)
    status, output = _run_on_a_terminal(WORKER, proc_env)
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|\r", "", output)  # the live display's cursor controls
    assert status == 0 and shown.strip() == "nothing to do: no job is due", output
    piped = subprocess.run(WORKER, env=proc_env, capture_output=True, text=True, timeout=120)
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, "", "")  # cron and pipes get silence
