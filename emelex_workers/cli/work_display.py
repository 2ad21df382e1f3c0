"""What `emelex memory work` shows while it runs: live progress on a terminal, plain lines otherwise.

Both go to stderr, so stdout keeps the one summary line (and the waiting
lines) for cron mail and scripts. On a terminal, each job gets a line when it
starts and when it ends, and in between a live bar (rich, which typer ships)
of the prompt's tokens evaluated so far, then of the tokens generated against
the call's token limit, with the tokens per second and the elapsed time.
Elsewhere the same start and end lines are printed plainly. Before the first
job, one line says how many model threads the run uses and why
(`[worker] model threads: ...`, see emelex_workers/models/threads.py). An end line is
never cut: a failure's whole diagnostic is printed (wrapped on a terminal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import typer

from emelex_memory import WaitingJob

from ..worker.attempts import attempt_text
from ..worker.work_report import JobReport, JobStart, WorkObserver
from ..settings import WorkerSettings
from .common import when

if TYPE_CHECKING:
    from ..host.types import GenerationProgress

REFRESH_S = 0.1  # redraw at most this often (the first report of every model call is always drawn)
SILENT_LINES_S = (10.0, 30.0)  # plain output: a line once a model server is silent this long, then this often


def threads_line(settings: WorkerSettings) -> str:
    """`[worker] model threads: 2 (chosen: 2 CPUs usable, 0.1 of them busy (measured)); this process may use 2
    CPUs, ...`, with any warning (see `threads.thread_choice`)."""
    from ..models.threads import thread_choice

    return f"[worker] {thread_choice(settings).line()}"


def start_line(job: JobStart) -> str:
    """`[compaction] job J  Session S  attempt 1 of 3  source 9082 tokens` (`9082 tokens (estimated)` for an
    estimate)."""
    from emelex_memory.compaction.planning import tokens_text  # here: an idle worker loads no compaction code

    size = "source size unknown" if job.source_tokens is None else (
        f"source {tokens_text(job.source_tokens, job.source_estimated)}")
    return f"[{job.kind}] job {job.id}  Session {job.session_id}  {attempt_text(job.attempt)}  {size}"


def cost_text(cost: dict[str, Any] | None) -> str:
    """`812 prompt + 64 generated tokens` (marked when estimated), `model not called`, or "" for no cost."""
    if not cost:
        return ""
    if not cost.get("model_calls"):
        return "model not called"
    estimated = " (estimated)" if cost.get("estimated") else ""
    return f"{cost.get('prompt_tokens', 0)} prompt + {cost.get('generated_tokens', 0)} generated tokens{estimated}"


def end_line(report: JobReport) -> str:
    """`[compaction] job J  done in 3.2s (812 prompt + 64 generated tokens)`, plus the detail of a failure or of
    what a done job saved or why its compaction chain stopped (`completed; 3 applied, ...`; nothing for a plain
    "completed"), always in full: never cut (on a terminal it is wrapped at word boundaries)."""
    spent = cost_text(report.cost)
    detail = "" if report.detail == "completed" else f": {report.detail}"
    return (f"[{report.kind}] job {report.id}  {report.status} in {report.seconds:.1f}s"
            f"{f' ({spent})' if spent else ''}{detail}")


def waiting_line(waiting: WaitingJob, stopped: str) -> str:
    """Why one job was left waiting, with the command that frees it when its worker is dead."""
    job = waiting.job
    head = f"waiting: {job.kind} job {job.id}  Session {job.session_id}: "
    until = when(waiting.until, "?")
    if waiting.reason == "held":
        if waiting.holder_dead:
            return (head + f"held by worker {waiting.holder} until {until}, but that process is gone "
                    f"(no such pid on this host); free it now with `emelex memory jobs rescue {job.id}`")
        return head + f"held by worker {waiting.holder} until {until}"
    if waiting.reason == "session-in-use":
        return head + f"Session in use by {waiting.holder} until {until}"
    if waiting.reason == "agent-journal":
        return head + ("waiting on an open agent journal (an agent turn that did not finish); resume the Session, "
                       f"or reconcile it with `emelex memory sessions recover {job.session_id}`")
    if waiting.reason == "not-due":
        return head + f"{attempt_text(job.attempts + 1)} due at {until}, after a failure"
    if stopped.startswith("signal:"):
        return head + f"due now, not run: this run was stopped by {stopped.removeprefix('signal:')}"
    return head + f"due now, not run: this run stopped ({stopped})"


class PlainLines(WorkObserver):
    """A line on `out` when each job starts and ends, and while a model server stays silent, a line after
    `SILENT_LINES_S[0]` seconds and every `SILENT_LINES_S[1]` after that; no live progress (stderr is not a
    terminal)."""

    def __init__(self, out: IO[str], preamble: Callable[[], str] | None = None) -> None:
        """Write to `out`; `preamble()` (when given) is printed once, before the start line of the first job that
        needs the model."""
        self.out = out
        self._preamble = preamble
        self._said = 0.0  # the longest silence said so far (of the current wait)

    def generating(self, job: JobStart, progress: GenerationProgress, max_tokens: int | None) -> None:
        """Say how long a model server has been silent, now and then (see the class docstring)."""
        waited = progress.waiting_s
        if waited is None or waited < self._said:
            self._said = 0.0  # no wait, or a new one
            if waited is None:
                return
        first, every = SILENT_LINES_S
        due = first if not self._said else self._said + every
        if waited >= due:
            self._said = waited
            typer.echo(f"[{job.kind}] job {job.id}  waiting for the model server: {waited:.0f} s", file=self.out)

    def job_started(self, job: JobStart) -> None:
        """Print the preamble before the first job that needs the model, then the start line."""
        if self._preamble is not None and job.needs_model:
            typer.echo(self._preamble(), file=self.out)
            self._preamble = None
        typer.echo(start_line(job), file=self.out)

    def job_finished(self, report: JobReport) -> None:
        """Print the end line."""
        typer.echo(end_line(report), file=self.out)


class LiveProgress(WorkObserver):
    """Start and end lines plus, while the model runs, a live bar: the prompt's tokens evaluated so far (for a
    binding that reports it), then the tokens generated of the call's limit, with tokens per second and the time
    elapsed (which keeps counting between reports). Use it as a context manager around the run."""

    def __init__(self, out: IO[str], clock=time.monotonic, preamble: Callable[[], str] | None = None) -> None:
        """Draw on `out`, a terminal; `preamble()` (when given) is printed once, before the start line of the first
        job that needs the model."""
        from rich.console import Console  # imported here: only a run on a terminal pays for it
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.clock = clock
        self.progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.fields[tokens]}"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=Console(file=out), transient=True,
        )
        self._task: Any = None
        self._call_start = self._drawn = 0.0
        self._phase, self._last_generated = "", -1  # "prompt" or "generation" of the current model call
        self._preamble = preamble

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def job_started(self, job: JobStart) -> None:
        """Print the start line; the job's bar appears with the model's first report (a job that runs no model
        gets none)."""
        self._drop_bar()
        if self._preamble is not None and job.needs_model:
            self.progress.console.print(self._preamble(), markup=False, highlight=False)
            self._preamble = None
        self.progress.console.print(start_line(job), markup=False, highlight=False)
        self._phase, self._last_generated = "", -1

    def generating(self, job: JobStart, progress: GenerationProgress, max_tokens: int | None) -> None:
        """Show or move the bar: while the prompt is evaluated, its tokens evaluated so far of all and tokens per
        second; then the tokens generated of at most `max_tokens`, and tokens per second in this call."""
        if self._task is None:
            self._task = self.progress.add_task(f"[{job.kind}] {job.id[:8]}", total=max_tokens, tokens="", rate="")
        now = self.clock()
        evaluating = progress.evaluated_tokens is not None
        phase = "prompt" if evaluating else "generation"
        first = phase != self._phase or (not evaluating and progress.generated_tokens < self._last_generated)
        if first:  # a new call, or its generation after its prompt
            self._phase, self._call_start = phase, now
        elapsed = now - self._call_start
        if progress.waiting_s is not None:
            done, total = progress.generated_tokens, max_tokens
            tokens = f"waiting for the model server: {progress.waiting_s:.0f} s"
        elif evaluating:
            done, total = progress.evaluated_tokens, progress.prompt_tokens
            tokens = f"evaluating the prompt: {done}/{total} tokens"
            self._last_generated = -1
        else:
            done, total = progress.generated_tokens, max_tokens
            limit = f"/{max_tokens}" if max_tokens else ""
            tokens = f"{done}{limit} tokens (prompt {progress.prompt_tokens})"
            self._last_generated = done
        rate = f"{done / elapsed:.1f} tok/s" if elapsed > 0 and done else ""
        self.progress.update(self._task, total=total, completed=done, tokens=tokens, rate=rate)
        if first or now - self._drawn >= REFRESH_S:
            self._drawn = now
            self.progress.refresh()

    def job_finished(self, report: JobReport) -> None:
        """Remove the bar and print the end line."""
        self._drop_bar()
        self.progress.console.print(end_line(report), markup=False, highlight=False)

    def _drop_bar(self) -> None:
        """Remove the current bar, if any, and redraw, so none outlives its job."""
        if self._task is not None:
            self.progress.remove_task(self._task)
            self._task = None
            self.progress.refresh()
