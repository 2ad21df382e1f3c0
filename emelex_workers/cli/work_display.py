"""What `emelex memory work` shows while it runs: live progress on a terminal, plain lines otherwise.

Both go to stderr, so stdout keeps the one summary line (and the waiting
lines) for cron mail and scripts. On a terminal, each job gets a line when it
starts and when it ends, and in between a live bar (rich, which typer ships)
of the tokens generated so far against the call's token limit, with the
tokens per second. Elsewhere the same start and end lines are printed plainly.
"""

from __future__ import annotations

import time
from typing import IO, TYPE_CHECKING, Any

import typer

from emelex_memory import WaitingJob

from ..worker.attempts import attempt_text
from ..worker.work_report import JobReport, JobStart, WorkObserver
from .common import when

if TYPE_CHECKING:
    from ..host.types import GenerationProgress

REFRESH_S = 0.1  # redraw at most this often (the first report of every model call is always drawn)


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
    what a done job saved or why its compaction chain stopped (`completed; 3 applied, ...`, in full; nothing for a
    plain "completed")."""
    spent = cost_text(report.cost)
    said = report.detail if report.status == "done" else report.detail[:160]
    detail = "" if report.detail == "completed" else f": {said}"
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
    return head + f"due now, not run: this run stopped ({stopped})"


class PlainLines(WorkObserver):
    """A line on `out` when each job starts and ends; no live progress (stderr is not a terminal)."""

    def __init__(self, out: IO[str]) -> None:
        """Write to `out`."""
        self.out = out

    def job_started(self, job: JobStart) -> None:
        """Print the start line."""
        typer.echo(start_line(job), file=self.out)

    def job_finished(self, report: JobReport) -> None:
        """Print the end line."""
        typer.echo(end_line(report), file=self.out)


class LiveProgress(WorkObserver):
    """Start and end lines plus, while the model generates, a live bar: tokens so far of the call's limit and
    tokens per second. Use it as a context manager around the run."""

    def __init__(self, out: IO[str], clock=time.monotonic) -> None:
        """Draw on `out`, a terminal."""
        from rich.console import Console  # imported here: only a run on a terminal pays for it
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.clock = clock
        self.progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.fields[tokens]}"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=Console(file=out), transient=True,
        )
        self._task: Any = None
        self._call_start = self._drawn = 0.0
        self._last_generated = -1

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def job_started(self, job: JobStart) -> None:
        """Print the start line; the job's bar appears with the model's first report (a job that runs no model
        gets none)."""
        self._drop_bar()
        self.progress.console.print(start_line(job), markup=False, highlight=False)
        self._last_generated = -1

    def generating(self, job: JobStart, progress: GenerationProgress, max_tokens: int | None) -> None:
        """Show or move the bar: tokens generated of at most `max_tokens`, and tokens per second in this call."""
        if self._task is None:
            self._task = self.progress.add_task(f"[{job.kind}] {job.id[:8]}", total=max_tokens, tokens="", rate="")
        now = self.clock()
        first = progress.generated_tokens < self._last_generated or self._last_generated < 0
        if first:
            self._call_start = now
        self._last_generated = progress.generated_tokens
        elapsed = now - self._call_start
        rate = f"{progress.generated_tokens / elapsed:.1f} tok/s" if elapsed > 0 else ""
        limit = f"/{max_tokens}" if max_tokens else ""
        self.progress.update(self._task, total=max_tokens, completed=progress.generated_tokens,
                             tokens=f"{progress.generated_tokens}{limit} tokens (prompt {progress.prompt_tokens})",
                             rate=rate)
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
