"""`JobClaim`: a worker's opaque, expiring authority over one claimed job.

Only the holder of the current worker lease may complete, fail, release or
renew the job; each of those transitions re-checks the lease inside its
`BEGIN IMMEDIATE` transaction (see `queue.py`). A claim left without an
outcome is released best-effort through a zero-wait connection, retried a
bounded number of times while the database is busy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import apsw

from .connection import connect
from .jobs import Job, append_diagnostic, claimed_job
from .retry import retry_busy

if TYPE_CHECKING:
    from .store import MemoryStore


class JobClaim:
    """A worker's authority over one claimed job; obtain one with `MemoryStore.claim_job`.

    Call exactly one of `complete`, `fail` or `release` (after a
    `CommitOutcomeUnknownError` from `complete`, call one again: it first
    re-reads the job; see `outcome_unknown`). Leaving a `with`
    block without one releases the job best-effort (not counted) through a
    zero-wait connection, retried a bounded number of times while busy.
    """

    __slots__ = (
        "_store", "_row", "_holder", "_claimed_at", "_claimed_until", "_rowid", "_session_rowid", "_id", "_kind",
        "_job", "_digest", "expires_at", "ended", "_unsure_at",
    )

    def __init__(
        self, store: MemoryStore, row: tuple, holder: str, claimed_at: float, digest: bytes, expires_at: float
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
    def store(self) -> MemoryStore:
        """The store the job was claimed from, e.g. to read the job's source."""
        return self._store

    def complete(self, result: Any = None) -> Job:
        """Apply `result` through the kind's completion function, mark the job done; see `MemoryStore.complete_job`."""
        return self._store.complete_job(self, result)

    def fail(self, message: str, *, permanent: bool = False) -> Job:
        """Record a counted failure; see `MemoryStore.fail_job`."""
        return self._store.fail_job(self, message, permanent=permanent)

    def release(self, reason: str = "released by the worker") -> Job:
        """Give the job back to pending without consuming an attempt; see `MemoryStore.release_job`."""
        return self._store.release_job(self, reason)

    def renew(self, ttl_s: float | None = None) -> float:
        """Extend the worker lease by `ttl_s` (default `worker_lease_ttl_s`) from now; return the new expiry."""
        return self._store.renew_job(self, ttl_s)

    def close(self) -> None:
        """Release best-effort if no outcome was recorded: zero-wait, bounded retries while busy, never raises."""
        if self.ended:
            return
        self.ended = True
        store = self._store
        try:
            conn = connect(store.path, busy_timeout_ms=0)
        except Exception:
            return
        try:
            retry_busy(lambda: self._release_on(conn, store.clock(), "worker stopped without an outcome"))
        except Exception:
            pass  # still busy or gone: the lease expires and the next claim rescues the job
        finally:
            conn.close()

    def _release_on(self, conn: apsw.Connection, now: float, reason: str) -> None:
        with conn:
            row = conn.execute(
                "SELECT attempts, diagnostics FROM jobs WHERE id = ? AND state = 'claimed' AND lease_hash = ? "
                "AND lease_expires_at > ?",
                (self._rowid, self._digest, now),
            ).fetchone()
            if row is not None:
                conn.execute(
                    "UPDATE jobs SET state = 'pending', due_at = ?, lease_hash = NULL, lease_holder = NULL, "
                    "lease_expires_at = NULL, diagnostics = ?, updated_at = ? WHERE id = ?",
                    (now, append_diagnostic(row[1], now, row[0], "released", reason), now, self._rowid),
                )

    def __enter__(self) -> JobClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
