"""`JobClaim`: a worker's opaque, expiring authority over one claimed job.

Only the holder of the current worker lease may complete, fail, release or
renew the job; each of those transitions re-checks the lease inside its
`BEGIN IMMEDIATE` transaction (see `queue/service.py`). A `with` block left without an
outcome releases the job durably (not counted) through the store's own
connection and its bounded busy wait, so an interrupted worker never loses an
attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInputError, WorkerLeaseLostError
from .jobs import Job, Store, claimed_job, encode_json, stored_json

MAX_COST_BYTES = 1024


class JobClaim:
    """A worker's authority over one claimed job; obtain one with `MemoryStore.claim_job`.

    Call exactly one of `complete`, `fail` or `release` (after a
    `CommitOutcomeUnknownError` from `complete`, call one again: it first
    re-reads the job; see `outcome_unknown`). Leaving a `with` block without
    one releases the job durably, not counted, like `release`.
    """

    __slots__ = (
        "_store", "_row", "_holder", "_claimed_at", "_claimed_until", "_rowid", "_session_rowid", "_id", "_kind",
        "_job", "_digest", "expires_at", "ended", "_unsure_at", "cost",
    )

    def __init__(
        self, store: Store, row: tuple, holder: str, claimed_at: float, digest: bytes, expires_at: float
    ) -> None:
        """Wrap a claim `MemoryStore.claim_job` just made: its `CLAIM_RETURNING` row, the lease holder label, when it
        was made, the SHA-256 of the worker lease token and the lease expiry."""
        self._store = store
        self._row = row
        self._holder = holder
        self._claimed_at = claimed_at
        self._claimed_until = expires_at
        self._rowid, self._session_rowid, self._id, self._kind = row[:4]
        self._job: Job | None = None
        self._digest = digest
        self.expires_at = expires_at
        self.ended = False
        self._unsure_at: float | None = None  # the time of a completion whose commit outcome is unknown
        self.cost: dict[str, Any] | None = None  # see record_cost

    def __repr__(self) -> str:
        return f"<JobClaim {self.kind} {self.id} expires_at={self.expires_at:.3f} ended={self.ended}>"

    @property
    def id(self) -> str:
        """The public job ID."""
        return self._id

    @property
    def kind(self) -> str:
        """The job's kind."""
        return self._kind

    @property
    def job(self) -> Job:
        """The job as this worker last saw it: as claimed until an outcome is recorded, then as that left it.

        Built on first use, so a handler that never looks pays nothing for decoding it.
        """
        if self._job is None:
            self._job = claimed_job(self._row, self._holder, self._claimed_at, self._claimed_until)
        return self._job

    @job.setter
    def job(self, job: Job) -> None:
        self._job = job

    @property
    def outcome_unknown(self) -> bool:
        """True after `complete` raised `CommitOutcomeUnknownError` and before the outcome was settled: the next
        `complete`, `fail` or `release` first re-reads the job and returns it if that completion is durable."""
        return self._unsure_at is not None

    @property
    def store(self) -> Store:
        """The store the job was claimed from, e.g. to read the job's source."""
        return self._store

    def record_cost(self, cost: Mapping[str, Any]) -> None:
        """Record what this attempt spent (a small JSON object, e.g. `{"prompt_tokens": ..., "generated_tokens":
        ..., "seconds": ...}`): completing the job stores it as its result's "cost"; failing or releasing it, in
        that outcome's diagnostic. Raises `InvalidInputError` for anything but a JSON object of at most 1 KiB."""
        if not isinstance(cost, Mapping):
            raise InvalidInputError(f"a job's cost is a JSON object, not a {type(cost).__name__}")
        self.cost = stored_json(encode_json(dict(cost), max_bytes=MAX_COST_BYTES, what="the job's cost"))

    def complete(self, result: Any = None) -> Job:
        """Apply `result` through the kind's completion function, mark the job done; see `MemoryStore.complete_job`."""
        return self._store.complete_job(self, result)

    def fail(self, message: str, *, permanent: bool = False) -> Job:
        """Record a counted failure; see `MemoryStore.fail_job`."""
        return self._store.fail_job(self, message, permanent=permanent)

    def release(self, reason: str = "released by the worker") -> Job:
        """Give the job back to pending without consuming an attempt; see `MemoryStore.release_job`."""
        return self._store.release_job(self, reason)

    def close(self, reason: str = "the worker stopped at once") -> bool:
        """Release best-effort through a zero-wait connection, for a process that must end now; never blocks, never
        raises. True when the job is pending again, False otherwise (see `MemoryStore.release_job_at_once`)."""
        return self._store.release_job_at_once(self, reason)

    def renew(self, ttl_s: float | None = None) -> float:
        """Extend the worker lease by `ttl_s` (default `worker_lease_ttl_s`) from now; return the new expiry."""
        return self._store.renew_job(self, ttl_s)

    def __enter__(self) -> JobClaim:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """Release durably (not counted) if no outcome was recorded; a lease lost meanwhile is no error here, and
        while an exception propagates, a failed release never replaces it (the lease then expires and the next
        claim rescues the job)."""
        if self.ended:
            return
        why = "the worker left the job without an outcome"
        try:
            self._store.release_job(self, why if exc_type is None else f"{why} ({exc_type.__name__})")
        except WorkerLeaseLostError:
            self.ended = True  # no longer held: there is nothing left to release
        except Exception:
            if exc_type is None:
                raise
