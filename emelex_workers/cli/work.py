"""`emelex memory work`: run due compaction and distillation jobs through the plugins, fit for cron and launchd.

Quiet when idle (no output, exit 0), and a Home without a store yet is an
idle run that creates nothing (cron may run it on a fresh machine); otherwise
one summary line on stdout;
`--json` prints the full report always. On a terminal, a progress line per
job goes to stderr. Exit status: 0 when every claimed job completed or was
released, 3 when any job failed (retrying later or terminally), 128+N when
stopped by signal N (130 for SIGINT, 143 for SIGTERM), 1 for an error before
any claim (e.g. no model installed).
"""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Optional

import typer

from emelex_memory import COMPACTION_KIND, DISTILL_KIND, MemoryStore, NoStoreError

from ..work import GracefulStop, JobReport, Worker, WorkReport
from .framework import echo_json, one_of, settings_of

EXIT_JOB_FAILED = 3
KindOpt = Annotated[Optional[str], typer.Option(
    metavar="KIND", callback=one_of(COMPACTION_KIND, DISTILL_KIND),
    help=f"Only jobs of this kind: {COMPACTION_KIND} or {DISTILL_KIND}.")]
MaxJobsOpt = Annotated[Optional[int], typer.Option(
    metavar="N", min=1, help="Claim at most this many jobs (default: the work_max_jobs setting).")]
MaxSecondsOpt = Annotated[Optional[float], typer.Option(
    metavar="SECONDS", min=0.001, help="Claim no job after this many seconds (default: the work_max_seconds setting).")]


def _progress(job: JobReport) -> None:
    typer.echo(f"[{job.kind}] {job.id}  Session {job.session_id}  {job.status} in {job.seconds:.1f}s"
               + ("" if job.status == "done" else f": {job.detail[:160]}"), err=True)


def work(
    ctx: typer.Context,
    kind: KindOpt = None,
    max_jobs: MaxJobsOpt = None,
    max_seconds: MaxSecondsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON, even when idle.")] = False,
) -> None:
    """Run due compaction and distillation jobs on the local model; skip Sessions in use.

    Stops when no job is due, at --max-jobs/--max-seconds, or on SIGINT/SIGTERM (releasing the job in hand).

    Quiet when idle; several may run at once, from cron, launchd or systemd.
    """
    settings = settings_of(ctx)
    stop = GracefulStop()
    try:
        store = MemoryStore.open(settings, create=False)
    except NoStoreError:
        store = None  # nothing was ever queued here
    if store is None:
        report = WorkReport()
    else:
        with stop.installed(), store:
            worker = Worker(store, settings, kinds=(kind,) if kind else (COMPACTION_KIND, DISTILL_KIND), stop=stop,
                            on_job=_progress if sys.stderr.isatty() else None)
            try:
                report = worker.run(max_jobs=max_jobs, max_seconds=max_seconds)
            finally:
                worker.close()
    if as_json:
        echo_json("idle" if report.idle else "worked", report.as_dict())
    elif not report.idle:
        typer.echo(report.summary_line())
    if report.stopped.startswith("signal:"):
        name = report.stopped.removeprefix("signal:")
        raise typer.Exit(128 + signal.Signals[name].value if name in signal.Signals.__members__ else 1)
    if report.counts["failed"] or report.counts["retrying"]:
        raise typer.Exit(EXIT_JOB_FAILED)
