"""The library worker: claim one job, run a handler, record the outcome with the queue's rules.

`emelex memory work` is a thin loop over `run_one_job`. A handler is any
callable taking the `JobClaim` and returning the result its kind's completion
function expects (a `SummaryDraft` for compaction). While it runs, the shared
renewer thread renews the worker lease every third of its TTL (`queue/renewal.py`),
so a handler may take longer than the TTL; a worker that dies stops renewing,
and its claim is rescued once the lease expires. How the handler's exceptions
count:

- returns normally: the job completes (Summary appended, ...);
- `SessionLiveError` (from the handler or from completion): released to
  pending, no attempt consumed: interactive execution wins;
- `TransientJobError`: retried in-process (tenacity, bounded; the worker
  lease is renewed before each retry), then counted as a retryable failure;
- `PermanentJobError` (e.g. `SourceTooLargeError`, or `InvalidJobSourceError`
  for a source its kind's validator rejects, checked before the handler runs)
  or `SourceChangedError`: terminal at once;
- any other `Exception`: a retryable failure with a bounded diagnostic;
- `CommitOutcomeUnknownError` (the completion's commit failed in its I/O):
  the job is re-read first; a completion that is durable after all is
  "done", otherwise the failed attempt is counted like any other failure;
- `WorkerLeaseLostError`: nothing is recorded; the lease is gone;
- `KeyboardInterrupt`/`SystemExit`: released durably (not counted) as the
  claim's `with` block ends, then re-raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import tenacity
from tenacity.wait import wait_base

from ..errors import (
    CommitOutcomeUnknownError,
    InvalidInputError,
    PermanentJobError,
    SessionLiveError,
    SourceChangedError,
    TransientJobError,
    WorkerLeaseLostError,
)
from .jobs import Job, Store
from .service import JobClaim
from .renewal import RENEWER
from ..core.retry import bounded_retrying


JobHandler = Callable[[JobClaim], Any]
TRANSIENT_ATTEMPTS = 3


@dataclass(frozen=True)
class JobOutcome:
    """What one worker step did with a job.

    `status`: "done", "retrying" (counted failure, pending until
    `job.due_at`), "failed" (terminal), "released" (pending again, not
    counted) or "lost" (the worker lease was gone; nothing recorded).
    `job` is the job as this worker last saw it; `detail` is a one-line note.
    `next_claim` is the job the completion claimed in its own transaction
    when `run_one_job` was asked to go on (`claim_next`), else None: pass it
    to the next `run_one_job` as `claim`, or release it.
    """

    job: Job
    status: str
    detail: str
    next_claim: JobClaim | None = None


def describe(exc: BaseException) -> str:
    """A one-line diagnostic for an exception: its type and message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_one_job(
    store: Store,
    handler: JobHandler,
    *,
    kinds: str | Iterable[str] | None = None,
    ttl_s: float | None = None,
    transient_attempts: int = TRANSIENT_ATTEMPTS,
    transient_wait: wait_base | None = None,
    claim: JobClaim | None = None,
    claim_next: Callable[[], bool] | None = None,
) -> JobOutcome | None:
    """Claim the oldest due job of `kinds` (default: every registered kind), run `handler` on it, record the outcome.

    Returns None when no job is due. `claim` is a job this worker already
    holds (the `next_claim` of its previous outcome): it is run instead of
    claiming one; an ended claim or one of another store raises
    `InvalidInputError` before anything runs. `claim_next` is asked once the handler has returned; when
    it says True, the completion also claims the next due job of `kinds` in
    the same transaction (`complete_and_claim`: one commit per job for a
    worker that goes on), returned as the outcome's `next_claim`; a refused
    completion claims nothing. A job whose kind has a source validator
    and whose source fails it is failed permanently before the handler runs
    (`InvalidJobSourceError`). The worker lease lasts `ttl_s` (default
    `worker_lease_ttl_s`) and is renewed every third of it while the handler
    runs. `transient_attempts` bounds the in-process tries of a handler
    raising `TransientJobError`, waiting `transient_wait` between them
    (default: 1 s doubling, at most 10 s).
    """
    ttl = store.settings.worker_lease_ttl_s if ttl_s is None else ttl_s
    if claim is None:
        claim = store.claim_job(kinds, ttl_s=ttl)
        if claim is None:
            return None
    elif claim.ended or claim.store is not store:
        raise InvalidInputError(
            f"the claim on job {claim.id} has already ended; pass a claim this worker still holds, or none"
            if claim.ended else f"the claim on job {claim.id} was made on another store; run it on that store"
        )
    with claim:
        try:
            kind = store.jobs.kinds.get(claim.kind)
            if kind.validate is not None:  # a malformed stored source is a permanent failure, never a KeyError later
                kind.check_source(claim.job.source)
            RENEWER.add(claim, ttl)  # `with renewing(claim, ttl)`, without the context manager object
            try:
                result = _run_handler(handler, claim, transient_attempts, transient_wait, ttl)
            finally:
                RENEWER.remove(claim)
            following = None
            if claim_next is not None and claim_next():
                job, following = store.complete_and_claim(claim, result, kinds=kinds, ttl_s=ttl)
            else:
                job = store.complete_job(claim, result)
            return JobOutcome(job, "done", "completed", following)
        except WorkerLeaseLostError as exc:
            claim.ended = True  # nothing left to release
            return JobOutcome(claim.job, "lost", describe(exc))
        except SessionLiveError as exc:
            return _settle(claim, claim.release, describe(exc))
        except (PermanentJobError, SourceChangedError) as exc:
            return _settle(claim, partial(claim.fail, permanent=True), describe(exc))
        except CommitOutcomeUnknownError as exc:  # the claim re-reads the job first: a durable completion is "done"
            return _settle(claim, claim.fail, describe(exc))
        except Exception as exc:  # any handler failure is recorded, and the worker goes on
            return _settle(claim, claim.fail, describe(exc))


def _run_handler(handler: JobHandler, claim: JobClaim, attempts: int, wait: wait_base | None, ttl: float) -> Any:
    """Run `handler` once; after a `TransientJobError`, let tenacity retry it (renewing the lease before each wait)."""
    try:
        return handler(claim)
    except TransientJobError as exc:
        if attempts <= 1:
            raise
        failed: list[BaseException] = [exc]

    def attempt(claim: JobClaim) -> Any:
        if failed:
            raise failed.pop()  # tenacity counts the try that already failed as its first attempt
        return handler(claim)

    return bounded_retrying(
        TransientJobError,
        attempts=attempts,
        wait=wait if wait is not None else tenacity.wait_exponential(multiplier=1, max=10),
        before_sleep=lambda _state: claim.renew(ttl),
    )(attempt, claim)


def _settle(claim: JobClaim, record: Callable[[str], Job], detail: str) -> JobOutcome:
    """Record `detail` through `record` (the claim's release or fail); a lost lease is reported, not raised."""
    try:
        job = record(detail)
    except WorkerLeaseLostError as exc:
        claim.ended = True
        return JobOutcome(claim.job, "lost", describe(exc))
    if job.state == "done":  # the completion whose commit reported a failure is durable after all
        return JobOutcome(job, "done", f"completed (durable although its commit reported {detail})")
    if job.state == "failed":
        return JobOutcome(job, "failed", detail)
    last = job.diagnostics[-1].event if job.diagnostics else ""
    return JobOutcome(job, "released" if last == "released" else "retrying", detail)
