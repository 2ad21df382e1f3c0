"""Why a job is not running: who holds it or its Session and until when, and rescuing a claim whose worker died.

`waiting_jobs` explains each pending or claimed job in one bounded read: held
by a worker (`pid@host` until the claim expires), its Session in use
(`pid@host` of the Session lease until it expires), not due yet (a retry
backoff), waiting on an open agent journal (a turn of a crashed or interrupted
agent: resume the Session, or `emelex memory sessions recover` it), or due. A worker on this host whose pid no longer exists is dead
(`holder_is_dead`), and `rescue_dead_claim` then frees its job at once, as the
next claim would once its lease expired: a counted failure, retried by the
schedule. A pid that exists (even reused by another process) or a worker on
another host is never judged dead, so a live worker's claim is never taken
by this; and if it were, that worker's late write would still be refused by
its lease token.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass

from ..core.database import Database
from ..sessions.rows import range_bytes, session_rowid
from ..errors import InvalidInputError, JobStateError
from .jobs import JOB_COLUMNS, JOB_FROM, JOB_RETURNING, Job, job_from_row, job_row
from .kinds import JobKindRegistry
from ..sessions.holders import holder_is_dead, live_lease, open_journal
from .service import RECORD_FAILURE, failure_update


MAX_WAITING = 100


@dataclass(frozen=True)
class WaitingJob:
    """A pending or claimed job and why it waits.

    `reason`: "held" (claimed by the worker `holder` until `until`), "session-in-use" (the Session's lease is
    held by `holder` until `until`), "agent-journal" (no lease, but the Session has an open agent journal: workers
    skip it until the agent resumes or `emelex memory sessions recover SESSION` reconciles it), "not-due" (a retry
    after a failed attempt, due at `until`) or "due" (a worker would claim it now). `holder_dead` is True when `holder` is a worker on this host whose process no
    longer exists: `rescue_dead_claim` frees the job then.
    """

    job: Job
    reason: str
    holder: str | None
    until: float | None
    holder_dead: bool = False


@dataclass(frozen=True)
class WaitingPage:
    """The first `len(jobs)` waiting jobs, soonest due first, and how many are waiting in all."""

    jobs: list[WaitingJob]
    total: int


class JobStatus:
    """Job status methods of `MemoryStore`."""

    def __init__(self, db: Database, kinds: JobKindRegistry) -> None:
        """Serve `db` for the job kinds registered in `kinds`."""
        self._db = db
        self._kinds = kinds

    def waiting_jobs(
        self, *, kinds: Iterable[str] | None = None, limit: int = 20
    ) -> WaitingPage:
        """The pending and claimed jobs of `kinds` (default: every registered kind), soonest due first, at most
        `limit` (1-100) of them, each with why it waits; and how many wait in all. Read-only."""
        names = self._kinds.names() if kinds is None else tuple(kinds)
        for name in names:
            self._kinds.check(name)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_WAITING:
            raise InvalidInputError(f"limit must be between 1 and {MAX_WAITING}, got {limit!r}")
        if not names:
            return WaitingPage([], 0)
        marks = ", ".join("?" * len(names))
        with self._db.read() as conn:
            now = self._db.clock()
            rows = conn.execute(
                f"SELECT {JOB_COLUMNS}, l.holder, l.expires_at, {open_journal('j.session_id')} "
                f"FROM {JOB_FROM} LEFT JOIN session_leases l "
                f"ON l.session_id = j.session_id AND {live_lease('l')} "
                f"WHERE j.state IN ('pending', 'claimed') AND j.kind IN ({marks}) ORDER BY j.due_at, j.id LIMIT ?",
                (now, *names, limit),
            ).fetchall()
            total = conn.execute(
                f"SELECT count(*) FROM jobs WHERE state IN ('pending', 'claimed') AND kind IN ({marks})", names
            ).fetchone()[0]
        return WaitingPage([_waiting(job_from_row(row[:-3]), row[-3], row[-2], now, bool(row[-1])) for row in rows],
                           total)

    def rescue_dead_claim(self, job_id: str) -> Job:
        """Free a job claimed by a worker that died on this host, before its lease expires: record one counted
        failure, as the next claim would after the expiry (the job retries by the schedule, or fails terminally
        at its third failure).

        Raises `JobStateError`, changing nothing, unless the job is claimed
        and its holder is provably dead (`holder_is_dead`), and
        `JobNotFoundError` for an unknown job.
        """
        with self._db.write() as conn:
            row = job_row(conn, job_id)
            state, holder = row[6], row[9]
            if state != "claimed":
                raise JobStateError(f"job {job_id} is {state}, not claimed: no worker holds it")
            if not holder_is_dead(holder):
                raise JobStateError(
                    f"job {job_id} is held by worker {holder}, which is running or not on this host "
                    f"({socket.gethostname()}); wait for its lease to expire (the next run rescues it), or cancel "
                    f"it with `emelex memory jobs cancel {job_id}`"
                )
            now = self._db.clock()
            message = f"worker {holder} died (no such process on this host); rescued before its lease expired"
            update = failure_update(row[7], row[11], "expired", message, now, False)
            done = conn.execute(f"{RECORD_FAILURE} RETURNING {JOB_RETURNING}", (*update, now, row[0])).fetchone()
            return job_from_row(done)

    def job_source_bytes(self, job: Job) -> int | None:
        """The stored size in bytes of the events a job's source names by `first_seq`..`last_seq` (a distill
        job's), or None for a source that names no such range."""
        first, last = job.source.get("first_seq"), job.source.get("last_seq")
        if not isinstance(first, int) or not isinstance(last, int):
            return None
        with self._db.read() as conn:
            return range_bytes(conn, session_rowid(conn, job.session_id), first, last)


def _waiting(job: Job, lease_holder: str | None, lease_expires: float | None, now: float,
             open_journal: bool) -> WaitingJob:
    if job.state == "claimed":
        return WaitingJob(job, "held", job.lease_holder, job.lease_expires_at, holder_is_dead(job.lease_holder))
    if lease_holder is not None:
        return WaitingJob(job, "session-in-use", lease_holder, lease_expires)
    if open_journal:
        return WaitingJob(job, "agent-journal", None, None)
    if job.due_at > now:
        return WaitingJob(job, "not-due", None, job.due_at)
    return WaitingJob(job, "due", None, job.due_at)
