"""The library worker `run_one_job`: how each handler outcome is recorded under the queue's rules."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
import tenacity

from emelex_memory import (
    InvalidInputError,
    JobClaim,
    MemoryStore,
    PermanentJobError,
    TransientJobError,
    run_one_job,
)
from emelex_memory.job_kinds import builtin_kinds

from ..support import Clock, kinds_fixture

KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)
NO_WAIT = tenacity.wait_none()


@pytest.fixture
def clock() -> Clock:
    return Clock(2_000_000.0)


@pytest.fixture
def job(cstore: MemoryStore, workspace: Path):
    session = cstore.create_session(workspace)
    return cstore.enqueue_job("noop", session.id, {"work": 1}).job


def test_an_empty_queue_returns_none(cstore: MemoryStore) -> None:
    assert run_one_job(cstore, lambda claim: None) is None


def test_a_handler_result_completes_the_job(cstore: MemoryStore, job) -> None:
    seen: list[JobClaim] = []

    def handler(claim: JobClaim) -> dict:
        seen.append(claim)
        return {"answer": 42}

    outcome = run_one_job(cstore, handler, kinds="noop")
    assert outcome.status == "done" and outcome.job.state == "done" and outcome.job.result == {"answer": 42}
    assert seen[0].job.id == job.id and seen[0].job.source == {"work": 1}


def test_transient_errors_retry_in_process_renewing_the_worker_lease(cstore: MemoryStore, job, clock: Clock) -> None:
    calls = []

    def flaky(claim: JobClaim) -> dict:
        calls.append(clock.now)
        clock.now += 8  # without renewal the 10 s lease would expire before the third try
        if len(calls) < 3:
            raise TransientJobError("inference server hiccup")
        return {"ok": True}

    outcome = run_one_job(cstore, flaky, ttl_s=10, transient_attempts=3, transient_wait=NO_WAIT)
    assert outcome.status == "done" and len(calls) == 3
    assert outcome.job.attempts == 0


def test_transient_errors_past_their_bound_are_one_counted_failure(cstore: MemoryStore, job, clock: Clock) -> None:
    calls = []

    def always(claim: JobClaim) -> None:
        calls.append(1)
        raise TransientJobError("still down")

    outcome = run_one_job(cstore, always, transient_attempts=2, transient_wait=NO_WAIT)
    assert len(calls) == 2
    assert outcome.status == "retrying" and outcome.job.attempts == 1 and outcome.job.due_at == clock.now + 30
    assert "TransientJobError: still down" in outcome.job.diagnostics[-1].message


def test_permanent_errors_are_terminal_at_once(cstore: MemoryStore, job) -> None:
    def handler(claim: JobClaim) -> None:
        raise PermanentJobError("source larger than the model's safe context budget")

    outcome = run_one_job(cstore, handler)
    assert outcome.status == "failed" and outcome.job.state == "failed" and outcome.job.attempts == 1
    assert cstore.failed_jobs().jobs[0].diagnostics[-1].event == "permanent"


def test_ordinary_exceptions_retry_on_schedule_until_the_third_is_terminal(
    cstore: MemoryStore, job, clock: Clock
) -> None:
    def broken(claim: JobClaim) -> None:
        raise RuntimeError("model file unreadable")

    statuses = []
    for _ in range(3):
        statuses.append(run_one_job(cstore, broken).status)
        clock.now += 300
    assert statuses == ["retrying", "retrying", "failed"]
    assert [d.message for d in cstore.get_job(job.id).diagnostics] == ["RuntimeError: model file unreadable"] * 3


def test_a_session_going_live_during_the_job_releases_it_uncounted(
    cstore: MemoryStore, job, workspace: Path
) -> None:
    leases = []

    def handler(claim: JobClaim) -> dict:
        leases.append(cstore.acquire_lease(job.session_id, workspace))  # someone resumes the Session meanwhile
        return {"ok": True}

    outcome = run_one_job(cstore, handler)
    assert outcome.status == "released"
    after = cstore.get_job(job.id)
    assert (after.state, after.attempts, after.result) == ("pending", 0, None)
    assert "SessionLiveError" in after.diagnostics[-1].message
    leases[0].release()


def test_a_job_cancelled_while_running_is_lost_and_stays_cancelled(cstore: MemoryStore, job) -> None:
    def handler(claim: JobClaim) -> dict:
        cstore.cancel_job(claim.id)
        return {"ok": True}

    outcome = run_one_job(cstore, handler)
    assert outcome.status == "lost"
    after = cstore.get_job(job.id)
    assert (after.state, after.attempts, after.result) == ("cancelled", 0, None)


def test_an_interrupted_worker_releases_the_job_without_consuming_an_attempt(cstore: MemoryStore, job) -> None:
    def handler(claim: JobClaim) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_one_job(cstore, handler)
    after = cstore.get_job(job.id)
    assert (after.state, after.attempts, after.diagnostics[-1].event) == ("pending", 0, "released")


def commits(store: MemoryStore) -> list[str]:
    """Record each transaction SQLite commits on the store's connection from now on."""
    seen: list[str] = []
    store.db.conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda e: e["sql"] == "COMMIT" and seen.append(e["sql"]))
    return seen


def test_a_worker_going_on_completes_and_claims_the_next_job_in_one_commit(
    cstore: MemoryStore, job, workspace: Path, clock: Clock
) -> None:
    second = cstore.enqueue_job("noop", job.session_id, {"work": 2}).job
    first = run_one_job(cstore, lambda claim: {"n": 1}, kinds="noop", claim_next=lambda: True)
    assert (first.status, first.job.id, first.job.state) == ("done", job.id, "done")
    held = first.next_claim
    assert held.id == second.id and cstore.get_job(second.id).state == "claimed"
    assert cstore.claim_job("noop") is None  # the next job is this worker's: nobody else may take it
    seen = commits(cstore)
    last = run_one_job(cstore, lambda claim: {"n": claim.job.source["work"]}, kinds="noop", claim=held,
                       claim_next=lambda: True)
    assert seen == ["COMMIT"]  # its completion, which also looked for a next job and found none
    assert (last.status, last.job.id, last.job.result, last.next_claim) == ("done", second.id, {"n": 2}, None)
    assert [j.state for j in cstore.list_jobs(limit=10).jobs] == ["done", "done"]


def test_a_worker_stopping_claims_nothing_more(cstore: MemoryStore, job) -> None:
    second = cstore.enqueue_job("noop", job.session_id, {"work": 2}).job
    outcome = run_one_job(cstore, lambda claim: None, kinds="noop", claim_next=lambda: False)
    assert outcome.next_claim is None
    assert (cstore.get_job(second.id).state, cstore.get_job(second.id).diagnostics) == ("pending", ())


def test_a_refused_completion_claims_nothing(cstore: MemoryStore, job, workspace: Path) -> None:
    second = cstore.enqueue_job("noop", job.session_id, {"work": 2}).job
    leases = []

    def handler(claim: JobClaim) -> dict:
        leases.append(cstore.acquire_lease(job.session_id, workspace))  # the Session goes live meanwhile
        return {"ok": True}

    outcome = run_one_job(cstore, handler, kinds="noop", claim_next=lambda: True)
    assert (outcome.status, outcome.next_claim) == ("released", None)
    assert [cstore.get_job(j.id).state for j in (job, second)] == ["pending", "pending"]
    assert cstore.get_job(second.id).diagnostics == ()
    leases[0].release()


def test_a_claim_that_ended_or_belongs_to_another_store_is_refused_before_any_work(
    cstore: MemoryStore, job, db_path: Path, settings, tmp_path: Path, kinds
) -> None:
    ended = cstore.claim_job("noop")
    ended.release("given back")
    ran: list[JobClaim] = []
    with pytest.raises(InvalidInputError, match="already ended"):
        run_one_job(cstore, ran.append, claim=ended)
    other = MemoryStore.open_path(tmp_path / "other.sqlite3", settings, kinds=kinds)
    held = cstore.claim_job("noop")
    with pytest.raises(InvalidInputError, match="another store"):
        run_one_job(other, ran.append, claim=held)
    other.close()
    assert ran == [] and cstore.get_job(job.id).state == "claimed"  # still held, untouched
    held.release("done with the test")
