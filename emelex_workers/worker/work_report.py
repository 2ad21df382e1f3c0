"""What a worker run reports: each job as it starts and ends, an observer's hooks, and the run's report.

`Worker` (work.py) fills these in; `emelex memory work` prints them (cli/work_display.py) or their
`as_dict()` JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from emelex_memory import WaitingJob, WaitingPage

if TYPE_CHECKING:
    from ..host.types import GenerationProgress


MAX_REPORTED_JOBS = 1000


@dataclass(frozen=True)
class JobStart:
    """A job this run claimed, as it starts: its ID, kind, Session, which attempt this is, its source's size
    in tokens (`source_estimated`: an estimate of 4 bytes per token, made when it was queued or from the stored
    bytes, rather than counted with the model's tokenizer), and whether the summarizer or distiller that runs it
    calls the model (`needs_model`)."""

    id: str
    kind: str
    session_id: str
    attempt: int
    source_tokens: int | None
    source_estimated: bool = False
    needs_model: bool = True


@dataclass(frozen=True)
class JobReport:
    """One job this run touched: its ID, kind, Session, what happened, a one-line detail, seconds spent and what
    the attempt cost (see `metering.JobCost.as_dict`; None when no model was reached)."""

    id: str
    kind: str
    session_id: str
    status: str
    detail: str
    seconds: float
    cost: dict[str, Any] | None = None


class WorkObserver:
    """What a progress display overrides: each method is called in the worker's thread, in order, and the
    defaults do nothing. An observer that raises is dropped for the rest of the run; the job goes on."""

    def job_started(self, job: JobStart) -> None:
        """A job was claimed and is about to run."""

    def generating(self, job: JobStart, progress: GenerationProgress, max_tokens: int | None) -> None:
        """The model reported progress on one `chat` call of `job` (at most `max_tokens` tokens)."""

    def job_finished(self, report: JobReport) -> None:
        """The job ended (done, retrying, failed, released or lost)."""


@dataclass
class WorkReport:
    """What one worker run did. `stopped` is "empty", "max-jobs", "max-seconds" or "signal:<NAME>"."""

    rescued: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("done", "retrying", "failed", "released", "lost"), 0))
    jobs: list[JobReport] = field(default_factory=list)
    stopped: str = "empty"
    seconds: float = 0.0
    waiting: WaitingPage | None = None
    embedded: int = 0  # vectors the embedding pass stored (an embedder set)

    @property
    def claimed(self) -> int:
        """Jobs claimed in this run."""
        return sum(self.counts.values())

    @property
    def idle(self) -> bool:
        """True when the run neither claimed, rescued nor embedded anything."""
        return self.claimed == 0 and self.rescued == 0 and self.embedded == 0

    def add(self, job: JobReport) -> None:
        """Count one job (keeping the details of the first 1000)."""
        self.counts[job.status] = self.counts.get(job.status, 0) + 1
        if len(self.jobs) < MAX_REPORTED_JOBS:
            self.jobs.append(job)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        waiting = self.waiting or WaitingPage([], 0)
        return {"claimed": self.claimed, "rescued": self.rescued, **self.counts, "embedded": self.embedded,
                "stopped": self.stopped,
                "seconds": round(self.seconds, 3), "jobs": [j.__dict__ for j in self.jobs],
                "waiting": [waiting_dict(w) for w in waiting.jobs], "waiting_total": waiting.total}

    def summary_line(self) -> str:
        """One line for people and cron mail."""
        parts = ", ".join(f"{n} {k}" for k, n in self.counts.items() if n)
        rescued = f"; rescued {self.rescued} expired claim(s)" if self.rescued else ""
        embedded = f"; embedded {self.embedded} row(s) for search" if self.embedded else ""
        return (f"emelex work: {self.claimed} job(s) in {self.seconds:.1f}s ({parts or 'none'}){rescued}{embedded}; "
                f"stopped: {self.stopped}")


def done_detail(result: Any) -> str:
    """What a done job's `result` says: "completed", plus for a distillation what it applied and what the
    faithfulness guards rejected, or why it saved nothing; for a compaction step, why its chain stopped; for a
    compaction whose Summary the guards cut, how many sentences they cut."""
    result = result if isinstance(result, dict) else {}
    if isinstance(result.get("chain_stopped"), str):
        return f"completed; {result['chain_stopped']}"
    cut = sum(v for k, v in result.items() if k.startswith("cut_") and k != "cut_tail" and isinstance(v, int))
    if cut:
        return f"completed; {cut} sentence{'s' if cut != 1 else ''} cut by the faithfulness guards"
    if "nothing_saved" in result:
        return f"completed; {result['nothing_saved']}"
    if "applied" not in result:
        return "completed"
    rejected = sum(v for k, v in result.items() if k.startswith("rejected_") and isinstance(v, int))
    return f"completed; {result['applied']} applied, {rejected} rejected by the faithfulness guards"


def waiting_dict(waiting: WaitingJob) -> dict[str, Any]:
    """A waiting job as JSON-ready data: the job's ID, kind, Session, state and failed attempts, and why it waits
    (`reason`, `holder`, `until`, `holder_dead`; see `WaitingJob`)."""
    job = waiting.job
    return {"id": job.id, "kind": job.kind, "session_id": job.session_id, "state": job.state,
            "attempts": job.attempts, "reason": waiting.reason, "holder": waiting.holder, "until": waiting.until,
            "holder_dead": waiting.holder_dead}
