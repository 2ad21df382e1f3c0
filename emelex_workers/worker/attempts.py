"""The one wording of a job's attempts in everything a user reads: "attempt N of M".

M is the queue's limit (`MAX_FAILED_ATTEMPTS`: the third failure is
terminal). N counts from 1 and names the attempt a line is about: the one
running or due next for an active job, the one that succeeded for a done job,
the last one for a failed job.
"""

from __future__ import annotations

from emelex_memory import Job
from emelex_memory.core.retry import MAX_FAILED_ATTEMPTS

COUNTED_EVENTS = frozenset({"failure", "permanent", "expired"})  # diagnostics that record a counted failure


def attempt_text(n: int) -> str:
    """`attempt N of M` for the `n`-th attempt (1-based) of a job."""
    return f"attempt {n} of {MAX_FAILED_ATTEMPTS}"


def job_attempt(job: Job) -> int:
    """The attempt a job's state is about: its last (failed) one when it failed, else the one after its failures
    (running, due next, or the one that succeeded)."""
    return max(job.attempts, 1) if job.state == "failed" else job.attempts + 1


def diagnostic_attempt(event: str, failed: int) -> int:
    """The attempt a diagnostic is about, from its `event` and the failed attempts it records: the one that failed
    for a counted failure, else the one that was running or due (released, cancelled, reset)."""
    return max(failed, 1) if event in COUNTED_EVENTS else failed + 1
