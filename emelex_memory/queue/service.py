"""The work-queue half of `MemoryStore`: enqueue, claim, complete, fail, release, cancel, retry and list jobs.

Every transition is one `BEGIN IMMEDIATE` transaction, and the worker lease
(an opaque, expiring token of which only the SHA-256 is stored) is re-checked
inside it: a stale worker's late write is refused with `WorkerLeaseLostError`.
Claiming first rescues expired claims as counted failures, so no separate
sweeper is needed. Retry deadlines come from `retry.RETRY_SCHEDULE`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import apsw

from ..core.cursors import cursor_int
from ..core.connection import connect
from ..core.database import Database
from ..core.paging import take
from ..sessions.rows import session_rowid
from ..errors import (
    CommitOutcomeUnknownError,
    InvalidInputError,
    JobNotFoundError,
    JobStateError,
    SessionLiveError,
    WorkerLeaseLostError,
)
from .jobs import (
    CLAIM_RETURNING,
    JOB_COLUMNS,
    JOB_FROM,
    JOB_RETURNING,
    MAX_JOB_ROW_BYTES,
    MAX_RESULT_BYTES,
    MAX_SOURCE_BYTES,
    STATES,
    TERMINAL_FAILED_STATES,
    CompletionContext,
    Enqueued,
    Job,
    JobPage,
    Store,
    append_diagnostic,
    done_job,
    encode_json,
    job_by_rowid,
    job_from_row,
    job_row,
    job_size,
    stored_json,
)
from ..core.id_prefix import resolve_id
from ..core.io_errors import restated
from .claim import JobClaim
from .kinds import JobKindRegistry
from ..sessions.holders import holder_label, live_lease, open_journal
from ..core.utf8 import check_utf8


RESCUE_BATCH = 100
_ACTIVE = "state IN ('pending', 'claimed')"  # repeats the partial index's WHERE so SQLite uses jobs_active
_EXPIRED_CLAIMS = f"FROM jobs WHERE {_ACTIVE} AND state = 'claimed' AND due_at <= ?"  # worker lease expired by ?
_LIVE_SESSION_OF_JOB = (  # a live lease, or an open agent journal, which counts as live
    f"SELECT 1 FROM session_leases l WHERE l.session_id = jobs.session_id AND {live_lease('l')} "
    f"UNION ALL SELECT 1 WHERE {open_journal('jobs.session_id')}"
)


def failure_update(attempts: int, diagnostics: str, event: str, message: str, now: float, permanent: bool,
                    cost: Mapping[str, Any] | None = None):
    """The new (state, attempts, due_at, finished_at, diagnostics) of a job after one counted failure."""
    from ..core.retry import RETRY_SCHEDULE  # here: tenacity is imported only by a run that records a failure

    failed = attempts + 1
    terminal = permanent or RETRY_SCHEDULE.is_terminal(failed)
    due = now if terminal else now + RETRY_SCHEDULE.delay(failed)
    diags = append_diagnostic(diagnostics, now, failed, event, message, cost)
    return ("failed" if terminal else "pending", failed, due, now if terminal else None, diags)


_COMPLETE = (  # re-checks the worker lease and that the Session is not live; changes one row only if it completed
    "UPDATE jobs SET state = 'done', finished_at = ?, updated_at = ?, lease_hash = NULL, lease_holder = NULL, "
    "lease_expires_at = NULL WHERE id = ? AND state = 'claimed' AND lease_hash = ? AND lease_expires_at > ? "
    f"AND NOT EXISTS ({_LIVE_SESSION_OF_JOB})"
)


@functools.lru_cache(maxsize=64)
def _claim_sql(kind_count: int, guarded: bool) -> str:
    """The claim: one `UPDATE ... RETURNING` of the oldest due pending job of the kinds whose Session is not live.

    A `guarded` claim claims nothing while an expired claim waits to be rescued; see `claim_job`. The pending job is
    found through `jobs_active` (state, due_at, id), whose order after `state = 'pending'` is the claim's; its
    partial-index condition is repeated (`_ACTIVE`) so SQLite may use it. That index's first leaves hold the claimed
    entries and the oldest pending ones, so a completion and the next claim rewrite one page of it. The unary `+`
    keeps the planner from looking the kinds up in the (kind, Session, source key) index instead, which sorts every
    due job of those kinds.
    """
    marks = ", ".join("?" * kind_count)
    guard = f"AND NOT EXISTS (SELECT 1 {_EXPIRED_CLAIMS}) " if guarded else ""
    return (
        "UPDATE jobs SET state = 'claimed', lease_hash = ?, lease_holder = ?, lease_expires_at = ?, due_at = ?, "
        f"updated_at = ? WHERE id = (SELECT j.id FROM jobs j WHERE j.{_ACTIVE} AND j.state = 'pending' "
        f"AND j.due_at <= ? AND +j.kind IN ({marks}) AND NOT EXISTS (SELECT 1 FROM session_leases l "
        f"WHERE l.session_id = j.session_id AND {live_lease('l')}) "
        f"AND NOT {open_journal('j.session_id')} "  # nor an open agent journal
        f"ORDER BY j.due_at, j.id LIMIT 1) {guard}RETURNING {CLAIM_RETURNING}"
    )


_holder = holder_label()  # `pid@host` of this process, looked up once instead of per claim


def _lease_digest() -> bytes:
    """A new worker lease: the SHA-256 of a fresh 256-bit token from the OS CSPRNG. The token itself is never needed
    again: the claim object holds the digest and is the authority."""
    return hashlib.sha256(os.urandom(32)).digest()


def _relabel() -> None:
    global _holder
    _holder = holder_label()


os.register_at_fork(after_in_child=_relabel)  # a forked child claims under its own pid


RECORD_FAILURE = (
    "UPDATE jobs SET state = ?, attempts = ?, due_at = ?, finished_at = ?, diagnostics = ?, lease_hash = NULL, "
    "lease_holder = NULL, lease_expires_at = NULL, updated_at = ? WHERE id = ?"
)


class JobQueue:
    """The work queues (`store.jobs`): enqueue, claim, complete, fail, release, cancel, retry and list jobs."""

    def __init__(self, db: Database, owner: Store, kinds: JobKindRegistry) -> None:
        """Serve `db` for the job kinds registered in `kinds`; `owner` is the `MemoryStore` handed to claims
        (`JobClaim.store`) and completion functions."""
        self._db = db
        self._owner = owner
        self.kinds = kinds

    # -- enqueueing and reading --------------------------------------------------------

    def enqueue_job(
        self,
        kind: str,
        session_id: str,
        source: Mapping[str, Any],
        *,
        source_key: str | None = None,
        due_at: float | None = None,
    ) -> Enqueued:
        """Queue `kind` work on a Session, idempotently: the same (kind, Session, source key) is queued once.

        `source` is a JSON mapping (at most 16 KiB canonical) that exactly
        describes the work; `source_key` (1-128 characters) defaults to the
        SHA-256 hex of its canonical JSON. `due_at` (default now) delays the
        first claim. Queueing work that exists, in any state, returns that job
        unchanged with `created=False`. A kind registered with a source
        validator checks the source (as it will be stored) first; a bad one
        raises `InvalidJobSourceError` and nothing is written.
        """
        registered = self.kinds.get(kind)
        if not isinstance(source, Mapping):
            raise InvalidInputError("a job source must be a JSON object (a mapping)")
        source_json = encode_json(dict(source), max_bytes=MAX_SOURCE_BYTES, what="the job source")
        registered.check_source(json.loads(source_json))
        key = hashlib.sha256(source_json.encode("utf-8")).hexdigest() if source_key is None else source_key
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise InvalidInputError("a job source key must be a string of 1-128 characters")
        if due_at is not None and (isinstance(due_at, bool) or not isinstance(due_at, (int, float))
                                   or not math.isfinite(due_at)):
            raise InvalidInputError(f"due_at must be a finite timestamp, got {due_at!r}")
        with self._db.write() as conn:
            rowid = session_rowid(conn, session_id)
            now = self._db.clock()
            inserted = conn.execute(
                "INSERT INTO jobs (uuid, kind, session_id, source_key, source, state, due_at, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?) ON CONFLICT (kind, session_id, source_key) DO NOTHING "
                "RETURNING id",
                (str(uuid.uuid4()), kind, rowid, key, source_json, now if due_at is None else due_at, now, now),
            ).fetchall()
            if inserted:
                job_rowid = inserted[0][0]
            else:
                job_rowid = conn.execute(
                    "SELECT id FROM jobs WHERE kind = ? AND session_id = ? AND source_key = ?", (kind, rowid, key)
                ).fetchone()[0]
            return Enqueued(job_by_rowid(conn, job_rowid), bool(inserted))

    def get_job(self, job_id: str) -> Job:
        """A snapshot of one job by its public ID; raise `JobNotFoundError` if there is none."""
        with self._db.read() as conn:
            return job_from_row(job_row(conn, job_id))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        session_id: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> JobPage:
        """Page through jobs newest first, optionally of one state, kind and Session; bounded in items and bytes.

        `max_bytes` must be at least `MAX_JOB_ROW_BYTES` (41,260: the largest
        job), so every page holds at least one job and never exceeds it.
        """
        if state is not None and state not in STATES:
            raise InvalidInputError(f"job state must be one of {', '.join(STATES)}, got {state!r}")
        check_utf8(kind, "the job kind")
        check_utf8(session_id, "the Session ID")
        where, params = [], []
        if state is not None:
            where.append("j.state = ?")
            params.append(state)
        if kind is not None:
            where.append("j.kind = ?")
            params.append(kind)
        if session_id is not None:
            where.append("s.uuid = ?")
            params.append(session_id)
        return self._job_page(where, params, cursor, limit, max_bytes)

    def failed_jobs(
        self,
        *,
        kind: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> JobPage:
        """Page through terminal jobs (failed, or cancelled by an operator) newest first, with bounded diagnostics.

        Bounded in items and bytes like `list_jobs`.
        """
        where, params = ["j.state IN ('failed', 'cancelled')"], []
        if kind is not None:
            where.append("j.kind = ?")
            params.append(kind)
        return self._job_page(where, params, cursor, limit, max_bytes)

    def _job_page(self, where: list[str], params: list, cursor, limit, max_bytes) -> JobPage:
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_JOB_ROW_BYTES)
        if cursor is not None:
            try:
                where = [*where, "j.id < ?"]
                params = [*params, cursor_int(cursor)]
            except (TypeError, ValueError):
                raise InvalidInputError(f"bad job cursor {cursor!r}; pass a next_cursor from a previous page") from None
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} {clause} ORDER BY j.id DESC LIMIT ?", (*params, limit + 1)
            ).fetchall()
        taken, next_cursor = take(rows, limit, max_bytes, job_size, lambda row: str(row[0]))
        return JobPage([job_from_row(row) for row in taken], next_cursor)

    # -- claiming ------------------------------------------------------------------

    def claim_job(
        self, kinds: str | Iterable[str] | None = None, *, ttl_s: float | None = None
    ) -> JobClaim | None:
        """Claim the oldest due pending job of `kinds` (default: every registered kind); None when there is none.

        One `BEGIN IMMEDIATE` transaction first rescues expired claims (each a
        counted failure), then claims with one `UPDATE ... RETURNING`,
        skipping jobs whose Session has a live execution lease. The worker
        lease lasts `ttl_s` (default `worker_lease_ttl_s`).
        """
        names, ttl = self._claim_terms(kinds, ttl_s)
        digest, holder = _lease_digest(), _holder  # made before the write lock is taken, the claim after it is freed
        with self._db.write() as conn:
            now = self._db.clock()
            row = self._claim(conn, names, ttl, now, digest, holder)
        return None if row is None else JobClaim(self._owner, row, holder, now, digest, now + ttl)

    def _claim_terms(self, kinds: str | Iterable[str] | None, ttl_s: float | None) -> tuple[tuple[str, ...], float]:
        """The checked kind names and worker lease TTL of a claim."""
        names = self.kinds.names() if kinds is None else (kinds,) if isinstance(kinds, str) else tuple(kinds)
        for name in names:
            self.kinds.check(name)
        if not names:
            raise InvalidInputError("claim_job needs at least one job kind")
        return names, self._worker_ttl(ttl_s)

    def _claim(
        self, conn: apsw.Connection, names: tuple[str, ...], ttl: float, now: float, digest: bytes, holder: str
    ) -> tuple | None:
        """Inside a write transaction: rescue expired claims as needed and claim the oldest due job of `names` under
        the worker lease `digest` held by `holder`, until `now + ttl`; return the claim's `CLAIM_RETURNING` row (for
        its `JobClaim`), or None when no job is due."""
        expires = now + ttl
        params = (digest, holder, expires, expires, now, now, *names, now)
        # Rescue first, in one statement with the claim in the common case: the guarded claim claims nothing
        # while an expired claim exists. When it claims nothing, rescue expired claims and, if there were any,
        # claim again; either way the claim sees no expired claim, exactly as if the rescue had run before it.
        row = conn.execute(_claim_sql(len(names), True), (*params, now)).fetchone()
        if row is None and self._rescue(conn, now):
            row = conn.execute(_claim_sql(len(names), False), params).fetchone()
        return row

    def rescue_expired_jobs(self) -> int:
        """Turn up to 100 expired claims into counted failures (as every claim does first); return how many."""
        with self._db.write() as conn:
            return self._rescue(conn, self._db.clock())

    def _rescue(self, conn: apsw.Connection, now: float) -> int:
        rows = conn.execute(
            f"SELECT id, attempts, diagnostics, lease_holder, lease_expires_at {_EXPIRED_CLAIMS} "
            f"ORDER BY due_at LIMIT {RESCUE_BATCH}",
            (now,),
        ).fetchall()  # a literal LIMIT: a bound one makes this probe, which usually finds nothing, 4x slower
        for rowid, attempts, diags, holder, expired in rows:
            message = f"worker lease of {holder} expired at {expired:.3f} without an outcome"
            state, failed, due, finished, diags = failure_update(attempts, diags, "expired", message, now, False)
            conn.execute(RECORD_FAILURE, (state, failed, due, finished, diags, now, rowid))
        return len(rows)

    def _worker_ttl(self, ttl_s: float | None) -> float:
        ttl = self._db.settings.worker_lease_ttl_s if ttl_s is None else ttl_s
        if not 0 < ttl <= 86_400:
            raise InvalidInputError(f"worker lease TTL must be between 0 and 86400 seconds, got {ttl}")
        return ttl

    # -- the worker's transitions --------------------------------------------------------

    def _held(self, conn: apsw.Connection, claim: JobClaim) -> tuple[tuple, float]:
        """Inside a write transaction: verify `claim` still holds its job; return (attempts, diagnostics), now."""
        now = self._db.clock()
        return self._check_held(conn, claim, now), now

    def _check_held(self, conn: apsw.Connection, claim: JobClaim, now: float) -> tuple:
        if claim.ended:
            raise WorkerLeaseLostError(f"the claim on job {claim.id} has already ended")
        row = conn.execute(
            "SELECT state, lease_hash, lease_expires_at, attempts, diagnostics FROM jobs WHERE id = ?", (claim._rowid,)
        ).fetchone()
        if row is None or row[0] != "claimed" or row[1] != claim._digest:
            raise WorkerLeaseLostError(
                f"this worker no longer holds job {claim.id} (cancelled, rescued or finished elsewhere); "
                "drop the result"
            )
        if row[2] <= now:
            raise WorkerLeaseLostError(
                f"the worker lease on job {claim.id} expired; the next claim counts it as a failure and retries it"
            )
        return row[3:]

    def complete_job(self, claim: JobClaim, result: Any = None) -> Job:
        """Complete a claimed job in one transaction: re-check the worker lease and that the Session is not live,
        apply `result` through the kind's completion function, and mark the job done.

        Raises `WorkerLeaseLostError` when the lease is no longer held,
        `SessionLiveError` when the Session went live (release the job then),
        or the completion function's error; in every case nothing is written.
        `CommitOutcomeUnknownError` means the commit itself failed and the
        completion may or may not be durable: the claim records that
        (`JobClaim.outcome_unknown`), and its next `complete`, `fail` or
        `release` first re-reads the job, returning it when that completion
        is durable.
        """
        if claim._unsure_at is not None and (settled := self._settled(claim)) is not None:
            return settled
        return self._complete_then(claim, result, None)[0]

    def complete_and_claim(
        self, claim: JobClaim, result: Any = None, *, kinds: str | Iterable[str] | None = None,
        ttl_s: float | None = None,
    ) -> tuple[Job, JobClaim | None]:
        """Complete `claim` exactly as `complete_job` does and, in the same transaction, claim the next job exactly as
        `claim_job(kinds, ttl_s=ttl_s)` does; return the done job and the new claim (None when no job is due).

        One commit for what `complete_job` then `claim_job` commit twice: a worker that goes on to its next job
        pays a single transaction per job. Both happen or neither: when the completion is refused
        (`WorkerLeaseLostError`, `SessionLiveError`, the completion function's error) nothing is written and nothing
        is claimed. After `CommitOutcomeUnknownError` the claim is settled as after `complete_job`'s; the next job,
        if its claim was durable after all, is held by no one and is rescued once its worker lease expires, as the
        claim of a worker that died is. For a claim whose earlier completion had an unknown outcome the job is
        re-read first: when that completion is durable after all, the done job is returned with None (nothing is
        claimed); otherwise it is completed and the next job claimed as above.
        """
        names, ttl = self._claim_terms(kinds, ttl_s)
        if claim._unsure_at is not None and (settled := self._settled(claim)) is not None:
            return settled, None
        return self._complete_then(claim, result, (names, ttl))

    def _complete_then(
        self, claim: JobClaim, result: Any, then_claim: tuple[tuple[str, ...], float] | None
    ) -> tuple[Job, JobClaim | None]:
        """Complete `claim` in one write transaction and, given `then_claim` (kind names, TTL), claim the next job in
        it too."""
        kind = self.kinds.get(claim.kind)
        row = None  # the next claim's row
        if then_claim is not None:
            digest, holder = _lease_digest(), _holder
        try:
            with self._db.write() as conn:
                now = self._db.clock()
                # One statement re-checks the worker lease and the Session's liveness and marks the job done; the
                # kind's effect follows in the same transaction, so any failure below rolls all of it back.
                completed = False
                if not claim.ended:
                    conn.execute(_COMPLETE, (now, now, claim._rowid, claim._digest, now, now))
                    completed = conn.changes() == 1
                if not completed:
                    self._check_held(conn, claim, now)
                    raise SessionLiveError(
                        f"Session {claim.job.session_id} of job {claim.id} became live; interactive use wins, "
                        "release the job"
                    )
                outcome = result
                if kind.complete is not None:
                    ctx = CompletionContext(conn, self._owner, claim.job, claim._rowid, claim._session_rowid, now)
                    outcome = kind.complete(ctx, result)
                text = None
                if outcome is not None and not isinstance(outcome, Mapping):
                    raise InvalidInputError(f"the result of a {kind.name} job must be None or a JSON object")
                if claim.cost is not None:
                    outcome = {**(outcome or {}), "cost": claim.cost}
                if outcome is not None:
                    text = encode_json(dict(outcome), max_bytes=MAX_RESULT_BYTES, what="the job result")
                    conn.execute("UPDATE jobs SET result = ? WHERE id = ?", (text, claim._rowid))
                if then_claim is not None:
                    row = self._claim(conn, *then_claim, now, digest, holder)
        except CommitOutcomeUnknownError as exc:
            claim._unsure_at = now
            raise restated(
                exc, self._db.path, f"the completion of job {claim.id}",
                "call complete, fail or release on the claim again: it re-reads the job first and returns it when "
                "that completion is durable (never completing it twice)",
            ) from exc.__cause__
        # Built after the commit, so the write lock is held no longer than the writing needs.
        job = done_job(claim._row, claim.expires_at, None if text is None else stored_json(text), now)
        claim.ended = True
        claim._job = job
        following = None if row is None else JobClaim(self._owner, row, holder, now, digest, now + then_claim[1])
        return job, following

    def fail_job(self, claim: JobClaim, message: str, *, permanent: bool = False) -> Job:
        """Record one counted failure of a claimed job with a bounded diagnostic `message`.

        A retryable failure returns the job to pending with the next retry
        deadline of `RETRY_SCHEDULE`; a permanent one, or the third failure,
        leaves it terminally failed. Raises `WorkerLeaseLostError` (writing
        nothing) when this worker no longer holds the job. After a completion
        with an unknown outcome, returns the done job instead when that
        completion is durable (see `complete_job`).
        """
        if not isinstance(message, str) or not message.strip():
            raise InvalidInputError("a job failure needs a non-empty message")
        if claim._unsure_at is not None and (settled := self._settled(claim)) is not None:
            return settled
        with self._db.write() as conn:
            (attempts, diags), now = self._held(conn, claim)
            event = "permanent" if permanent else "failure"
            update = failure_update(attempts, diags, event, message, now, permanent, claim.cost)
            row = conn.execute(f"{RECORD_FAILURE} RETURNING {JOB_RETURNING}", (*update, now, claim._rowid)).fetchone()
            job = job_from_row(row)
        claim.ended = True
        claim.job = job
        return job

    def release_job(self, claim: JobClaim, reason: str = "released by the worker") -> Job:
        """Return a claimed job to pending without consuming an attempt (Session went live, worker shutting down).

        Raises `WorkerLeaseLostError` (writing nothing) when this worker no
        longer holds the job. After a completion with an unknown outcome,
        returns the done job instead when that completion is durable (see
        `complete_job`).
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("releasing a job needs a non-empty reason")
        if claim._unsure_at is not None and (settled := self._settled(claim)) is not None:
            return settled
        with self._db.write() as conn:
            job = self._release(conn, claim, reason)
        claim.ended = True
        claim.job = job
        return job

    def release_job_at_once(self, claim: JobClaim, reason: str) -> bool:
        """`release_job` through a zero-wait connection of its own, for a process that must end now (a second stop
        request, from its signal handler, whatever the store's own connection is doing): it never waits for a busy
        database and never raises. True when the job is pending again; False when it could not be released (the
        database busy, the claim no longer held or its completion's outcome unknown, any failure): the worker lease
        then expires, and the next claim rescues the job as a counted failure."""
        if claim.ended or claim._unsure_at is not None or not isinstance(reason, str) or not reason.strip():
            return False
        try:
            conn = connect(self._db.path, busy_timeout_ms=0)
        except Exception:
            return False
        try:
            with conn:
                job = self._release(conn, claim, reason)
            claim.ended = True
            claim.job = job
            return True
        except Exception:
            return False
        finally:
            conn.close()

    def _release(self, conn: apsw.Connection, claim: JobClaim, reason: str) -> Job:
        """Inside a write transaction on `conn`: the job held by `claim` back to pending, uncounted, with `reason`."""
        (attempts, diags), now = self._held(conn, claim)
        return job_from_row(conn.execute(
            "UPDATE jobs SET state = 'pending', due_at = ?, diagnostics = ?, lease_hash = NULL, "
            f"lease_holder = NULL, lease_expires_at = NULL, updated_at = ? WHERE id = ? RETURNING {JOB_RETURNING}",
            (now, append_diagnostic(diags, now, attempts, "released", reason, claim.cost), now, claim._rowid),
        ).fetchone())

    def _settled(self, claim: JobClaim) -> Job | None:
        """For a claim whose completion had an unknown outcome: the done job, ending the claim, when that completion
        is durable (the job is done and finished at that completion's time); None when it is not."""
        with self._db.read() as conn:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE j.id = ?", (claim._rowid,)).fetchone()
        if row is None or row[6] != "done" or row[15] != claim._unsure_at:
            return None
        job = job_from_row(row)
        claim.ended = True
        claim.job = job
        return job

    def renew_job(self, claim: JobClaim, ttl_s: float | None = None) -> float:
        """Extend a held worker lease by `ttl_s` (default `worker_lease_ttl_s`) from now; return the new expiry."""
        ttl = self._worker_ttl(ttl_s)
        with self._db.write() as conn:
            _, now = self._held(conn, claim)
            conn.execute(
                "UPDATE jobs SET lease_expires_at = ?, due_at = ?, updated_at = ? WHERE id = ?",
                (now + ttl, now + ttl, now, claim._rowid),
            )
        claim.expires_at = now + ttl
        return claim.expires_at

    # -- the operator's transitions ---------------------------------------------------------

    def cancel_job(self, job_id: str, *, reason: str = "cancelled by the operator") -> Job:
        """Cancel a pending or claimed job: it becomes terminal ('cancelled') without consuming an attempt.

        A worker holding it loses its authority (its late write is refused).
        Raises `JobStateError` for a job that is already done, failed or
        cancelled. `retry_failed_job` puts a cancelled job back in the queue.
        """
        with self._db.write() as conn:
            row = job_row(conn, job_id)
            if row[6] not in ("pending", "claimed"):
                raise JobStateError(f"job {job_id} is {row[6]}; only pending or claimed jobs can be cancelled")
            now = self._db.clock()
            return job_from_row(conn.execute(
                "UPDATE jobs SET state = 'cancelled', finished_at = ?, diagnostics = ?, lease_hash = NULL, "
                f"lease_holder = NULL, lease_expires_at = NULL, updated_at = ? WHERE id = ? RETURNING {JOB_RETURNING}",
                (now, append_diagnostic(row[11], now, row[7], "cancelled", reason), now, row[0]),
            ).fetchone())

    def retry_failed_job(self, job_id: str) -> Job:
        """Reset one terminal (failed or cancelled) job to pending, due now, with its failed-attempt count cleared.

        Its ID, kind, Session and source provenance stay exactly as they
        were; the diagnostics keep their history plus a "reset" entry. Raises
        `JobStateError` for a job that is pending, claimed or done.
        """
        with self._db.write() as conn:
            row = job_row(conn, job_id)
            if row[6] not in TERMINAL_FAILED_STATES:
                raise JobStateError(f"job {job_id} is {row[6]}; only failed or cancelled jobs can be retried")
            now = self._db.clock()
            diags = append_diagnostic(row[11], now, row[7], "reset", f"reset to pending from {row[6]}")
            return job_from_row(conn.execute(
                "UPDATE jobs SET state = 'pending', attempts = 0, due_at = ?, finished_at = NULL, diagnostics = ?, "
                f"updated_at = ? WHERE id = ? RETURNING {JOB_RETURNING}",
                (now, diags, now, row[0]),
            ).fetchone())

    def resolve_job_id(self, prefix: str) -> str:
        """The full ID of the one job whose ID is `prefix` or starts with it (at least 4 characters, any case).

        Raises `JobNotFoundError` when none matches and `AmbiguousIdError`
        when the prefix is too short or matches several (listing them).
        """
        with self._db.read() as conn:
            return resolve_id(conn, "jobs", prefix, "job", JobNotFoundError, "list them with `emelex memory jobs list`")
