"""The durable work queue in one process, with an injected clock: states, retry schedule, authority, listing."""

from __future__ import annotations

from pathlib import Path

import pytest
import tenacity

from emelex_memory import (
    RETRY_SCHEDULE,
    InvalidInputError,
    JobNotFoundError,
    JobStateError,
    MemoryStore,
    SessionLiveError,
    Settings,
    UnknownJobKindError,
    WorkerLeaseLostError,
)
from emelex_memory.job_kinds import BUILT_IN_KINDS, DEFAULT_KINDS, builtin_kinds, registered_kinds
from emelex_memory.queue.jobs import MAX_DIAGNOSTIC_CHARS, MAX_DIAGNOSTICS, MAX_DIAGNOSTICS_BYTES, MAX_JOB_ROW_BYTES
from emelex_memory.core.retry import bounded_retrying

from ..support import Clock, kinds_fixture, table_rows

KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)


@pytest.fixture
def session_id(cstore: MemoryStore, workspace: Path) -> str:
    return cstore.create_session(workspace).id


def _enqueue(store: MemoryStore, session_id: str, n: int = 0):
    return store.enqueue_job("noop", session_id, {"n": n}).job


# -- the retry schedule ----------------------------------------------------------------


def test_retry_schedule_is_thirty_seconds_doubling_to_a_five_minute_cap_third_failure_terminal() -> None:
    assert [RETRY_SCHEDULE.delay(n) for n in range(1, 8)] == [30, 60, 120, 240, 300, 300, 300]
    assert [RETRY_SCHEDULE.is_terminal(n) for n in range(1, 5)] == [False, False, True, True]
    with pytest.raises(InvalidInputError):
        RETRY_SCHEDULE.delay(0)


def test_bounded_in_process_retries_stop_after_their_attempts() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise TimeoutError("flaky")
        return "ok"

    assert bounded_retrying(TimeoutError, attempts=3, wait=tenacity.wait_none())(flaky) == "ok"
    assert len(calls) == 2
    with pytest.raises(InvalidInputError):
        bounded_retrying(TimeoutError, attempts=0, wait=tenacity.wait_none())


# -- enqueue and claim ----------------------------------------------------------------------


def test_enqueue_is_idempotent_per_kind_session_and_source(cstore: MemoryStore, session_id: str) -> None:
    first = cstore.enqueue_job("noop", session_id, {"digest": "abc", "count": 3})
    again = cstore.enqueue_job("noop", session_id, {"count": 3, "digest": "abc"})
    other = cstore.enqueue_job("noop", session_id, {"digest": "abd", "count": 3})
    assert first.created and not again.created and other.created
    assert again.job == first.job and other.job.id != first.job.id
    assert (first.job.state, first.job.attempts) == ("pending", 0)
    assert first.job.source == {"count": 3, "digest": "abc"}
    keyed = cstore.enqueue_job("noop", session_id, {"whatever": 1}, source_key="abc-key")
    assert not cstore.enqueue_job("noop", session_id, {"whatever": 2}, source_key="abc-key").created
    assert keyed.job.source_key == "abc-key"


def test_bad_enqueue_input_is_refused_and_changes_nothing(cstore: MemoryStore, session_id: str, db_path: Path) -> None:
    _enqueue(cstore, session_id)
    before = table_rows(db_path)
    with pytest.raises(UnknownJobKindError):
        cstore.enqueue_job("nosuchkind", session_id, {})
    with pytest.raises(InvalidInputError):
        cstore.enqueue_job("noop", session_id, ["not", "a", "mapping"])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        cstore.enqueue_job("noop", session_id, {"x": "y" * 20_000})
    with pytest.raises(InvalidInputError):
        cstore.enqueue_job("noop", session_id, {"x": 1}, source_key="")
    with pytest.raises(InvalidInputError):
        cstore.enqueue_job("noop", session_id, {"x": float("nan")})
    with pytest.raises(InvalidInputError):
        cstore.enqueue_job("noop", session_id, {"x": 1}, due_at=float("inf"))
    with pytest.raises(Exception, match="no Session"):
        cstore.enqueue_job("noop", "no-such-session", {"x": 1})
    assert table_rows(db_path) == before


def test_claims_take_the_oldest_due_job_first_and_never_a_future_one(
    cstore: MemoryStore, session_id: str, clock: Clock
) -> None:
    late = cstore.enqueue_job("noop", session_id, {"n": "late"}, due_at=clock.now + 100).job
    a = _enqueue(cstore, session_id, 1)
    clock.now += 1
    b = _enqueue(cstore, session_id, 2)
    assert cstore.claim_job("noop").job.id == a.id
    assert cstore.claim_job("noop").job.id == b.id
    assert cstore.claim_job("noop") is None
    clock.now += 100
    assert cstore.claim_job("noop").job.id == late.id


def test_a_job_whose_session_is_live_is_never_claimed(
    cstore: MemoryStore, session_id: str, workspace: Path, clock: Clock
) -> None:
    job = _enqueue(cstore, session_id)
    lease = cstore.acquire_lease(session_id, workspace)
    assert cstore.claim_job() is None
    assert cstore.get_job(job.id).state == "pending"
    clock.now += Settings().session_lease_ttl_s + 1  # the lease expired: no longer live
    claim = cstore.claim_job()
    assert claim is not None and claim.job.id == job.id
    lease.close()


def test_claim_kinds_must_be_registered(cstore: MemoryStore, session_id: str) -> None:
    _enqueue(cstore, session_id)
    with pytest.raises(UnknownJobKindError):
        cstore.claim_job("nosuchkind")
    with pytest.raises(InvalidInputError):
        cstore.claim_job([])
    assert cstore.claim_job(["noop"]) is not None


# -- outcomes, retries and terminal transitions -----------------------------------------------


def test_backoff_schedule_and_third_failure_terminal(cstore: MemoryStore, session_id: str, clock: Clock) -> None:
    job = _enqueue(cstore, session_id)
    start = clock.now
    after = cstore.claim_job().fail("model crashed")
    assert (after.state, after.attempts, after.due_at) == ("pending", 1, start + 30)
    clock.now = start + 29.9
    assert cstore.claim_job() is None  # not due yet
    clock.now = start + 30
    after = cstore.claim_job().fail("model crashed again")
    assert (after.state, after.attempts, after.due_at) == ("pending", 2, start + 30 + 60)
    clock.now = start + 89.9
    assert cstore.claim_job() is None
    clock.now = start + 90
    after = cstore.claim_job().fail("third time")
    assert (after.state, after.attempts, after.finished_at) == ("failed", 3, start + 90)
    clock.now += 10_000
    assert cstore.claim_job() is None
    assert [d.event for d in after.diagnostics] == ["failure", "failure", "failure"]
    assert [d.attempts for d in after.diagnostics] == [1, 2, 3]
    assert cstore.failed_jobs().jobs == [cstore.get_job(job.id)]


def test_permanent_failure_is_terminal_at_once(cstore: MemoryStore, session_id: str) -> None:
    job = _enqueue(cstore, session_id)
    after = cstore.claim_job().fail("source larger than the model's safe context budget", permanent=True)
    assert (after.state, after.attempts) == ("failed", 1)
    assert after.diagnostics[-1].event == "permanent"
    assert cstore.claim_job() is None
    assert [j.id for j in cstore.failed_jobs().jobs] == [job.id]


def test_an_expired_worker_lease_is_a_counted_failure_rescued_by_the_next_claim(
    cstore: MemoryStore, session_id: str, clock: Clock
) -> None:
    job = _enqueue(cstore, session_id)
    stale = cstore.claim_job(ttl_s=10)
    clock.now += 11
    assert cstore.claim_job() is None  # the rescue ran: the job is pending again, but not due for 30 s
    rescued = cstore.get_job(job.id)
    assert (rescued.state, rescued.attempts, rescued.due_at) == ("pending", 1, clock.now + 30)
    assert rescued.diagnostics[-1].event == "expired" and "expired" in rescued.diagnostics[-1].message
    with pytest.raises(WorkerLeaseLostError):  # the stale worker's late write is refused
        stale.complete()
    assert cstore.get_job(job.id) == rescued
    clock.now += 30
    fresh = cstore.claim_job()
    assert fresh.job.id == job.id
    with pytest.raises(WorkerLeaseLostError):
        stale.fail("late failure report")
    assert fresh.complete({"ok": True}).state == "done"


def test_three_expired_leases_make_the_job_terminal(cstore: MemoryStore, session_id: str, clock: Clock) -> None:
    job = _enqueue(cstore, session_id)
    for _ in range(3):
        assert cstore.claim_job(ttl_s=5) is not None
        clock.now += 1000
        assert cstore.rescue_expired_jobs() == 1
        clock.now += 300  # past the retry deadline
    assert (cstore.get_job(job.id).state, cstore.get_job(job.id).attempts) == ("failed", 3)


def test_a_completion_after_the_worker_lease_expired_commits_nothing(
    cstore: MemoryStore, session_id: str, clock: Clock, db_path: Path
) -> None:
    _enqueue(cstore, session_id)
    claim = cstore.claim_job(ttl_s=10)
    clock.now += 10
    before = table_rows(db_path)
    with pytest.raises(WorkerLeaseLostError):
        claim.complete({"ok": True})
    with pytest.raises(WorkerLeaseLostError):
        claim.renew()
    assert table_rows(db_path) == before


def test_cancellation_releases_authority_without_consuming_an_attempt(
    cstore: MemoryStore, session_id: str, db_path: Path
) -> None:
    job = _enqueue(cstore, session_id)
    claim = cstore.claim_job()
    cancelled = cstore.cancel_job(job.id)
    assert (cancelled.state, cancelled.attempts) == ("cancelled", 0)
    assert cancelled.diagnostics[-1].event == "cancelled"
    before = table_rows(db_path)
    with pytest.raises(WorkerLeaseLostError):
        claim.complete({"late": True})
    with pytest.raises(WorkerLeaseLostError):
        claim.release()
    with pytest.raises(JobStateError):
        cstore.cancel_job(job.id)
    assert table_rows(db_path) == before
    assert cstore.claim_job() is None
    assert [j.id for j in cstore.failed_jobs().jobs] == [job.id]


def test_a_session_going_live_after_the_claim_wins_and_the_release_consumes_nothing(
    cstore: MemoryStore, session_id: str, workspace: Path, db_path: Path
) -> None:
    job = _enqueue(cstore, session_id)
    claim = cstore.claim_job()
    lease = cstore.acquire_lease(session_id, workspace)
    before = table_rows(db_path)
    with pytest.raises(SessionLiveError):
        claim.complete({"ok": True})
    assert table_rows(db_path) == before
    released = claim.release("Session became live")
    assert (released.state, released.attempts, released.due_at) == ("pending", 0, job.due_at)
    assert released.diagnostics[-1].event == "released"
    assert cstore.claim_job() is None  # still live
    lease.release()
    assert cstore.claim_job().job.id == job.id


def test_claim_outcomes_are_single_use(cstore: MemoryStore, session_id: str) -> None:
    _enqueue(cstore, session_id)
    claim = cstore.claim_job()
    assert claim.complete().state == "done"
    with pytest.raises(WorkerLeaseLostError):
        claim.fail("again")
    with pytest.raises(WorkerLeaseLostError):
        claim.release()
    _enqueue(cstore, session_id, 1)
    other = cstore.claim_job()
    with pytest.raises(InvalidInputError):
        other.fail("  ")
    with pytest.raises(InvalidInputError):
        other.renew(ttl_s=0)
    assert cstore.get_job(other.id).state == "claimed"


def test_leaving_a_claim_block_without_an_outcome_releases_it_uncounted(cstore: MemoryStore, session_id: str) -> None:
    job = _enqueue(cstore, session_id)
    with cstore.claim_job() as claim:
        assert cstore.get_job(job.id).state == "claimed"
    assert claim.ended
    after = cstore.get_job(job.id)
    assert (after.state, after.attempts, after.diagnostics[-1].event) == ("pending", 0, "released")


# -- operator retry and listing -----------------------------------------------------------------


def test_retry_failed_job_resets_without_changing_identity_or_source(
    cstore: MemoryStore, session_id: str, clock: Clock, db_path: Path
) -> None:
    job = cstore.enqueue_job("noop", session_id, {"digest": "d1", "count": 7}).job
    cstore.claim_job().fail("broken", permanent=True)
    pending = _enqueue(cstore, session_id, 99)
    before = table_rows(db_path)
    with pytest.raises(JobStateError):
        cstore.retry_failed_job(pending.id)
    with pytest.raises(JobNotFoundError):
        cstore.retry_failed_job("no-such-job")
    assert table_rows(db_path) == before
    clock.now += 5
    reset = cstore.retry_failed_job(job.id)
    assert (reset.id, reset.kind, reset.session_id, reset.source, reset.source_key, reset.created_at) == (
        job.id, job.kind, job.session_id, job.source, job.source_key, job.created_at
    )
    assert (reset.state, reset.attempts, reset.due_at, reset.finished_at) == ("pending", 0, clock.now, None)
    assert [d.event for d in reset.diagnostics] == ["permanent", "reset"]
    cstore.cancel_job(pending.id)
    claimed = cstore.claim_job()
    assert claimed.job.id == job.id
    assert claimed.complete().state == "done"
    with pytest.raises(JobStateError):
        cstore.retry_failed_job(job.id)


def test_diagnostics_are_capped_in_length_and_count(cstore: MemoryStore, session_id: str, clock: Clock) -> None:
    job = _enqueue(cstore, session_id)
    for i in range(8):
        claim = cstore.claim_job()
        if claim is None:
            cstore.retry_failed_job(job.id)
            claim = cstore.claim_job()
        claim.fail(f"{i} " + "\x01" * 5000)
        clock.now += 1000
    diags = cstore.get_job(job.id).diagnostics
    assert len(diags) == MAX_DIAGNOSTICS
    assert all(len(d.message) <= MAX_DIAGNOSTIC_CHARS and d.message.isprintable() for d in diags)
    assert diags[-1].message.startswith("7 ")
    for _ in range(3):  # messages that escape to twice their length still keep the stored list bounded
        claim = cstore.claim_job()
        if claim is None:
            cstore.retry_failed_job(job.id)
            claim = cstore.claim_job()
        claim.fail('"\\' * 2000)
        clock.now += 1000
    with cstore.db.read() as conn:
        stored = conn.execute("SELECT diagnostics FROM jobs").fetchone()[0]
    assert len(stored) <= MAX_DIAGNOSTICS_BYTES
    assert cstore.get_job(job.id).diagnostics[-1].message == '"\\' * (MAX_DIAGNOSTIC_CHARS // 2)


def test_failed_jobs_and_list_page_with_a_cursor(cstore: MemoryStore, session_id: str) -> None:
    ids = []
    for n in range(5):
        ids.append(_enqueue(cstore, session_id, n).id)
        cstore.claim_job().fail(f"boom {n}", permanent=True)
    _enqueue(cstore, session_id, 100)
    seen, cursor = [], None
    while True:
        page = cstore.failed_jobs(cursor=cursor, limit=2)
        assert len(page.jobs) <= 2
        seen += [j.id for j in page.jobs]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids[::-1]
    assert [j.state for j in cstore.list_jobs(state="pending").jobs] == ["pending"]
    assert len(cstore.list_jobs(session_id=session_id, limit=10).jobs) == 6
    assert cstore.list_jobs(kind="compaction").jobs == []
    with pytest.raises(InvalidInputError, match=f"max_bytes must be between {MAX_JOB_ROW_BYTES}"):
        cstore.failed_jobs(max_bytes=MAX_JOB_ROW_BYTES - 1)  # a page must fit the largest job: never one above it
    one = cstore.failed_jobs(max_bytes=MAX_JOB_ROW_BYTES)
    assert len(one.jobs) == 5 and one.next_cursor is None  # small jobs: the bound holds several
    with pytest.raises(InvalidInputError):
        cstore.list_jobs(state="weird")
    with pytest.raises(InvalidInputError):
        cstore.failed_jobs(cursor="not-a-cursor")
    with pytest.raises(InvalidInputError):
        cstore.failed_jobs(limit=0)


def test_deleting_a_session_deletes_its_jobs(cstore: MemoryStore, session_id: str) -> None:
    _enqueue(cstore, session_id)
    with cstore.db.write() as conn:
        conn.execute("DELETE FROM sessions")
    assert cstore.list_jobs().jobs == []


def test_a_kind_registered_on_an_injected_registry_is_that_stores_alone(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    mine = builtin_kinds()
    mine.register("private")
    with MemoryStore.open_path(db_path, settings, kinds=mine) as store:
        assert store.job_kinds is mine
        sid = store.create_session(workspace).id
        assert store.enqueue_job("private", sid, {"n": 1}).created
    with MemoryStore.open_path(db_path, settings) as plain:
        assert plain.job_kinds is DEFAULT_KINDS
        before = table_rows(db_path)
        with pytest.raises(UnknownJobKindError, match="no job kind 'private'"):
            plain.enqueue_job("private", sid, {"n": 2})
        assert table_rows(db_path) == before


def test_no_test_module_registers_a_kind_on_the_process_wide_registry() -> None:
    # every test module is imported before any test runs: a module-level `register_job_kind(...)` shows here
    assert registered_kinds() == tuple(sorted(BUILT_IN_KINDS))
