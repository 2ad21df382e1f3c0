"""`emelex memory work`: run due compaction and distillation jobs through the plugins, fit for cron and launchd.

Output. On stderr, before the first job, how many model threads the run uses
and why; a line when each job starts (kind, job, Session, source
tokens) and when it ends (outcome, seconds, prompt and generated tokens); on a
terminal, a live bar of the tokens generated and tokens per second in between.
On stdout, one summary line when any job ran, then a line for every done job
whose result says more than "completed" (what a distillation applied, what
the guards rejected, or why it saved nothing), then a line for every job left
waiting and why (held by a worker, its Session in use, an open agent journal,
a retry not yet due),
with the command that frees a job whose worker died on this host. Nothing at
all when there was nothing to do (a Home without a store yet is such an idle
run and creates nothing: cron may run it on a fresh machine). `--quiet` keeps
only the summary line; `--json` prints the full report, always.

Stopping. SIGINT (Ctrl-C) or SIGTERM (`systemctl stop`, launchd) is
acknowledged on stderr at once (`stopping (SIGINT): job J goes back to
pending ...`); the job's model work stops where the binding checks (the
llama.cpp binding: at its next loading step, graph node or token) and the job
is released to pending without consuming an attempt. A second signal ends the
process at once: the job in hand is released through a zero-wait connection
if the database lets it (otherwise its worker lease expires), and the status
is 128+N of that signal.

Exit status: 0 when every claimed job completed or was released (also when
jobs were left waiting), 3 when any job failed (retrying later or terminally),
128+N when stopped by signal N (130 for SIGINT, 143 for SIGTERM), 1 for an
error before any claim (e.g. no model installed).
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import nullcontext
from typing import Annotated, Optional

import typer

from emelex_memory import COMPACTION_KIND, DISTILL_KIND, MemoryStore, NoStoreError

from ..worker.work import GracefulStop, Worker
from ..worker.work_report import WorkObserver, WorkReport
from ..settings import WorkerSettings
from .common import JsonFlag, SaidAtOnce, echo_json, one_of, settings_of
from .work_display import LiveProgress, PlainLines, threads_line, waiting_line

EXIT_JOB_FAILED = 3
KindOpt = Annotated[Optional[str], typer.Option(
    metavar="KIND", callback=one_of(COMPACTION_KIND, DISTILL_KIND),
    help=f"Only jobs of this kind: {COMPACTION_KIND} or {DISTILL_KIND}.")]
MaxJobsOpt = Annotated[Optional[int], typer.Option(
    metavar="N", min=1, help="Claim at most this many jobs (default: the work_max_jobs setting).")]
MaxSecondsOpt = Annotated[Optional[float], typer.Option(
    metavar="SECONDS", min=0.001, help="Claim no job after this many seconds (default: the work_max_seconds setting).")]
QuietFlag = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Print only the summary line: no progress, job or waiting lines.")]


def _observer(quiet: bool, as_json: bool, settings: WorkerSettings) -> WorkObserver | None:
    if quiet or as_json:
        return None
    preamble = lambda: threads_line(settings)  # noqa: E731 - printed only once a job starts
    return LiveProgress(sys.stderr, preamble=preamble) if sys.stderr.isatty() else PlainLines(sys.stderr, preamble)


def work(
    ctx: typer.Context,
    kind: KindOpt = None,
    max_jobs: MaxJobsOpt = None,
    max_seconds: MaxSecondsOpt = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Run due compaction and distillation jobs on the local model; skip Sessions in use.

    Stops when no job is due, at --max-jobs/--max-seconds, or on SIGINT/SIGTERM (releasing the job in hand).
    Shows each job as it starts and ends (live progress on a terminal), then why jobs were left waiting.

    Silent when there is nothing to do (on a terminal it says so); several may run at once, from cron, launchd or
    systemd.
    """
    settings = settings_of(ctx)
    stop = GracefulStop()
    with stop.installed():  # until the end: a signal while the report is printed is handled the same way
        try:
            store = MemoryStore.open(settings, create=False)
        except NoStoreError:
            store = None  # nothing was ever queued here
        say = SaidAtOnce()
        stop.on_request = lambda name: _acknowledge(name, None, say)
        stop.on_repeat = lambda name: _stop_at_once(None, name, say)
        try:
            if store is None:
                report = WorkReport()
            else:
                observer = _observer(quiet, as_json, settings)
                live = observer if isinstance(observer, LiveProgress) else nullcontext()
                with store, live:
                    worker = Worker(store, settings, kinds=(kind,) if kind else (COMPACTION_KIND, DISTILL_KIND),
                                    stop=stop, observer=observer)
                    say.live = observer.progress.console if isinstance(observer, LiveProgress) else None
                    stop.on_request = lambda name: _acknowledge(name, worker, say)
                    stop.on_repeat = lambda name: _stop_at_once(worker, name, say)
                    try:
                        report = worker.run(max_jobs=max_jobs, max_seconds=max_seconds)
                    finally:
                        worker.close()
                        say.live = None  # the live display has ended
            if as_json:
                echo_json("idle" if report.idle else "worked", report.as_dict())
            else:
                _print(report, quiet)
        finally:
            say.close()
    if report.stopped.startswith("signal:"):
        name = report.stopped.removeprefix("signal:")
        raise typer.Exit(128 + signal.Signals[name].value if name in signal.Signals.__members__ else 1)
    if report.counts["failed"] or report.counts["retrying"]:
        raise typer.Exit(EXIT_JOB_FAILED)


def _again(name: str) -> str:
    return "Ctrl-C again" if name == "SIGINT" else f"{name} again"


def _acknowledge(name: str, worker: Worker | None, say: SaidAtOnce) -> None:
    """In the signal handler, at once: say that a stop was requested and what becomes of the job in hand."""
    job = None if worker is None else worker.job_in_hand()
    say(f"stopping ({name}): job {job} goes back to pending after its current step, no attempt consumed; "
        f"{_again(name)} to stop at once" if job else
        f"stopping ({name}): no further job is claimed; {_again(name)} to stop at once")


def _stop_at_once(worker: Worker | None, name: str, say: SaidAtOnce) -> None:
    """A second stop request, in its signal handler: release what can be released without waiting, say so, and
    end the process with 128+N."""
    done = "" if worker is None else worker.release_at_once(
        f"worker stopped at once by a second {name}; no attempt consumed")
    say(f"stopped at once ({name}){': ' + done if done else ''}", raw=True)
    if say.live is not None and say.fd is not None:
        os.write(say.fd, b"\x1b[?25h")  # the live display hid the cursor, and nothing will show it again
    os._exit(128 + signal.Signals[name].value if name in signal.Signals.__members__ else 1)


def _print(report: WorkReport, quiet: bool) -> None:
    """The summary line when anything ran, then (unless `quiet`) what each done job that saved something or
    nothing says (`done: distill job J: completed; 3 applied, ...`) and why each job left waiting waits."""
    if not report.idle:
        typer.echo(report.summary_line())
    elif not quiet and not (report.waiting and report.waiting.jobs) and sys.stdout.isatty():
        typer.echo("nothing to do: no job is due")  # a person at a terminal; cron and pipes get silence
    if quiet:
        return
    for job in report.jobs:
        if job.status == "done" and job.detail != "completed":
            typer.echo(f"done: {job.kind} job {job.id}: {job.detail}")
    if report.waiting is None:
        return
    for waiting in report.waiting.jobs:
        typer.echo(waiting_line(waiting, report.stopped))
    more = report.waiting.total - len(report.waiting.jobs)
    if more > 0:
        typer.echo(f"waiting: {more} more job(s); see `emelex memory jobs list --state pending`")
