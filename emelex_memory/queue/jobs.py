"""Durable work queues: the jobs table, job kinds and the value types of the queue.

A job is one unit of background work on one Session (compaction,
distillation, ...). States:

    pending --claim--> claimed --complete--> done
       ^                  |  \\--fail (retryable, attempts left)--> pending (after the retry deadline)
       |                  |  \\--fail (permanent or third failure)--> failed
       |                  |  \\--worker lease expired (rescued at the next claim; counted)--> pending / failed
       |                  \\--release (Session went live, shutdown; not counted)--> pending
       +--retry_failed_job-- failed / cancelled <--cancel_job (operator; not counted)-- pending / claimed

The store methods live in `queue/service.py`, the registry of job kinds in `queue/kinds.py`; this module holds
the records and the encoding helpers the queue shares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from ..core.jsonbound import encode_canonical
from ..core.paging import Items, Page
from ..core.utf8 import is_utf8
from ..errors import InvalidInputError, JobNotFoundError


Store = Any  # the `MemoryStore` facade; typed loosely because feature packages never import store.py

STATES = ("pending", "claimed", "done", "failed", "cancelled")
TERMINAL_FAILED_STATES = ("failed", "cancelled")
MAX_SOURCE_BYTES = 16384
MAX_RESULT_BYTES = 16384
MAX_DIAGNOSTIC_CHARS = 1000
MAX_DIAGNOSTICS = 5
MAX_DIAGNOSTICS_BYTES = 8192
MAX_JOB_ROW_BYTES = 300 + MAX_SOURCE_BYTES + MAX_DIAGNOSTICS_BYTES + MAX_RESULT_BYTES  # `job_size` of the largest job


@dataclass(frozen=True)
class JobDiagnostic:
    """One bounded diagnostic of a job: when, after how many failed attempts, what happened, and a capped message.

    `event` is one of "failure", "permanent", "expired", "released",
    "cancelled", "reset". `cost` is what the attempt it ends spent, when its
    worker recorded that (`JobClaim.record_cost`): e.g. prompt and generated
    tokens and seconds.
    """

    at: float
    attempts: int
    event: str
    message: str
    cost: dict[str, Any] | None = None


@dataclass(frozen=True)
class Job:
    """A read-only snapshot of one job. `id` is the public job ID; `session_id` the public Session ID."""

    id: str
    kind: str
    session_id: str
    source_key: str
    source: dict[str, Any]
    state: str
    attempts: int
    due_at: float
    lease_holder: str | None
    lease_expires_at: float | None
    diagnostics: tuple[JobDiagnostic, ...]
    result: dict[str, Any] | None
    created_at: float
    updated_at: float
    finished_at: float | None


@dataclass(frozen=True)
class JobPage(Page[Job]):
    """A page of jobs, newest first. Pass `next_cursor` back to continue; it is None after the last page."""

    jobs = Items[Job]()


@dataclass(frozen=True)
class Enqueued:
    """What `enqueue_job` did: the job, and whether it was created now (False: the same work was already queued)."""

    job: Job
    created: bool


@dataclass(frozen=True)
class CompletionContext:
    """What a kind's completion function gets, inside the committing `BEGIN IMMEDIATE` transaction.

    The worker lease and the Session's liveness have already been checked in
    this transaction; the function re-checks anything else it depends on.
    """

    conn: apsw.Connection
    store: Store
    job: Job
    job_rowid: int
    session_rowid: int
    now: float


# -- encoding helpers shared by the queue ------------------------------------------


def encode_json(value: object, *, max_bytes: int, what: str) -> str:
    """Canonical JSON text of `value`, capped at `max_bytes`; raise a typed error otherwise."""
    return encode_canonical(value, max_bytes=max_bytes, max_depth=32, what=what).decode("utf-8")


def append_diagnostic(
    diagnostics_json: str, at: float, attempts: int, event: str, message: str, cost: Mapping[str, Any] | None = None
) -> str:
    """Return `diagnostics_json` with one more entry (with the attempt's `cost`, when given): the message capped to
    one printable line, the newest few kept, the whole bounded in size."""
    entries = json.loads(diagnostics_json)
    line = "".join(c if c.isprintable() else " " for c in message[:MAX_DIAGNOSTIC_CHARS])
    entry = {"at": at, "attempts": attempts, "event": event, "message": line}
    if cost is not None:
        entry["cost"] = dict(cost)
    entries.append(entry)
    entries = entries[-MAX_DIAGNOSTICS:]
    while True:
        text = encode_json(entries, max_bytes=64 * 1024, what="job diagnostics")
        if len(text) <= MAX_DIAGNOSTICS_BYTES or len(entries) == 1:
            return text
        entries = entries[1:]


JOB_COLUMNS = (
    "j.id, j.uuid, j.kind, s.uuid, j.source_key, j.source, j.state, j.attempts, j.due_at, j.lease_holder, "
    "j.lease_expires_at, j.diagnostics, j.result, j.created_at, j.updated_at, j.finished_at"
)
JOB_FROM = "jobs j JOIN sessions s ON s.id = j.session_id"
JOB_RETURNING = (  # JOB_COLUMNS for an UPDATE ... RETURNING on jobs
    "id, uuid, kind, (SELECT uuid FROM sessions WHERE sessions.id = jobs.session_id), source_key, source, state, "
    "attempts, due_at, lease_holder, lease_expires_at, diagnostics, result, created_at, updated_at, finished_at"
)


CLAIM_RETURNING = (  # what a claim reads back: the columns it does not set itself, plus the internal keys
    "id, session_id, uuid, kind, (SELECT uuid FROM sessions WHERE sessions.id = jobs.session_id), source_key, "
    "source, attempts, diagnostics, created_at"
)


_read_json = json.JSONDecoder().raw_decode


def stored_json(text: str) -> Any:
    """Decode JSON the queue stored itself: canonical text (`encode_json`), with no whitespace for `json.loads` to
    skip, so the decoder reads it directly (a third of the cost)."""
    return _read_json(text)[0]


def decode_diagnostics(text: str) -> tuple[JobDiagnostic, ...]:
    """The `JobDiagnostic` entries of a stored diagnostics list, oldest first."""
    if text == "[]":
        return ()
    return tuple(JobDiagnostic(d["at"], d["attempts"], d["event"], d["message"], d.get("cost"))
                 for d in stored_json(text))


def job_from_row(row: tuple) -> Job:
    """Build a `Job` from a row of `JOB_COLUMNS` or `JOB_RETURNING` (the first column, the internal id, is skipped)."""
    (_, uuid, kind, session, key, source, state, attempts, due, holder, expires, diags, result, created, updated,
     finished) = row
    return Job(
        uuid, kind, session, key, stored_json(source), state, attempts, due, holder, expires, decode_diagnostics(diags),
        None if result is None else stored_json(result), created, updated, finished,
    )


def claimed_job(row: tuple, holder: str, now: float, expires_at: float) -> Job:
    """The `Job` a claim made at `now`: a `CLAIM_RETURNING` row plus the values the claim itself wrote."""
    _, _, uuid, kind, session, key, source, attempts, diags, created = row
    return Job(
        uuid, kind, session, key, stored_json(source), "claimed", attempts, expires_at, holder, expires_at,
        decode_diagnostics(diags), None, created, now, None,
    )


def done_job(row: tuple, due_at: float, result: dict[str, Any] | None, now: float) -> Job:
    """The `Job` that completing a claim (its `CLAIM_RETURNING` row) at `now` leaves. Completion writes only the
    state, the lease columns, the result and the times, and no other column changes while the claim holds its worker
    lease; `due_at` stays the last lease expiry."""
    _, _, uuid, kind, session, key, source, attempts, diags, created = row
    return Job(
        uuid, kind, session, key, _read_json(source)[0], "done", attempts, due_at, None, None,
        () if diags == "[]" else decode_diagnostics(diags), result, created, now, now,
    )


def job_size(row: tuple) -> int:
    """A generous byte estimate of one job row, for byte-bounded pages."""
    return 300 + len(row[5]) + len(row[11]) + len(row[12] or "")


def job_row(conn: apsw.Connection, job_id: str) -> tuple:
    """The `JOB_COLUMNS` row of job `job_id`; raise `JobNotFoundError` naming the list command if there is none."""
    row = None
    if is_utf8(job_id):  # a non-UTF-8 ID (from the command line) names no job and cannot be bound
        row = conn.execute(f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE j.uuid = ?", (job_id,)).fetchone()
    if row is None:
        raise JobNotFoundError(f"no job {job_id!r}; list them with `emelex memory jobs list`")
    return row


def job_by_rowid(conn: apsw.Connection, rowid: int) -> Job:
    """The job with rowid `rowid`, which the caller knows exists."""
    return job_from_row(conn.execute(f"SELECT {JOB_COLUMNS} FROM {JOB_FROM} WHERE j.id = ?", (rowid,)).fetchone())
