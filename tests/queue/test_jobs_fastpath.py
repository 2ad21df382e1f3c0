"""The queue's fast claim -> complete path keeps every guarantee: exact Job snapshots built without re-reading,
rescue folded into the claim statement, CHECK constraints spelled without IN lists, the shared lease renewer and
the sub-millisecond busy handler."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time
from pathlib import Path

import apsw
import pytest

from emelex_memory import Job, JobOutcome, MemoryStore, Settings, run_one_job
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.core.connection import BusyWait, connect
from emelex_memory.queue.service import _COMPLETE, RESCUE_BATCH, _claim_sql
from emelex_memory.queue.renewal import IDLE_NAME, renewing

from ..support import Clock, kinds_fixture, table_rows

KINDS = builtin_kinds()
KINDS.register("noop")
KINDS.register("noted", lambda ctx, result: {"noted": result})

kinds = kinds_fixture(KINDS)


@pytest.fixture
def session_id(cstore: MemoryStore, workspace: Path) -> str:
    return cstore.create_session(workspace).id


def test_the_claimed_and_completed_jobs_equal_what_the_database_holds(
    cstore: MemoryStore, session_id: str, clock: Clock
) -> None:
    cstore.enqueue_job("noted", session_id, {"n": 1, "text": "é"})
    claim = cstore.claim_job("noted", ttl_s=60)
    assert claim.job == cstore.get_job(claim.id)  # built from the claim's RETURNING row, decoded on first use
    clock.now += 5
    claim.renew(60)
    clock.now += 5
    done = claim.complete(7)
    assert done == cstore.get_job(claim.id) == claim.job
    assert (done.state, done.result, done.due_at) == ("done", {"noted": 7}, clock.now - 5 + 60)


def test_a_job_completed_by_the_worker_equals_what_the_database_holds(
    cstore: MemoryStore, session_id: str, clock: Clock
) -> None:
    cstore.enqueue_job("noop", session_id, {"n": 2})
    outcome = run_one_job(cstore, lambda claim: None, kinds="noop")
    assert outcome.status == "done" and outcome.job == cstore.get_job(outcome.job.id)
    assert outcome == JobOutcome(outcome.job, "done", "completed") and type(outcome) is JobOutcome
    assert outcome.job.result is None and outcome.job.lease_holder is None and outcome.job.finished_at == clock.now


def test_one_claim_rescues_an_expired_claim_and_claims_a_due_job(
    cstore: MemoryStore, session_id: str, clock: Clock
) -> None:
    stale_job = cstore.enqueue_job("noop", session_id, {"n": 1}).job
    stale = cstore.claim_job("noop", ttl_s=10)
    waiting = cstore.enqueue_job("noop", session_id, {"n": 2}).job
    clock.now += 11
    claim = cstore.claim_job("noop")  # the guarded claim refuses while the expired claim exists; rescue, claim again
    assert claim is not None and claim.id == waiting.id
    rescued = cstore.get_job(stale_job.id)
    assert (rescued.state, rescued.attempts, rescued.diagnostics[-1].event) == ("pending", 1, "expired")
    assert stale.id == stale_job.id and cstore.rescue_expired_jobs() == 0


def test_more_expired_claims_than_one_rescue_batch_still_let_a_due_job_be_claimed(
    cstore: MemoryStore, session_id: str, clock: Clock
) -> None:
    with cstore.db.write():
        for n in range(RESCUE_BATCH + 2):
            cstore.enqueue_job("noop", session_id, {"n": n})
    for _ in range(RESCUE_BATCH + 1):
        assert cstore.claim_job("noop", ttl_s=10) is not None
    clock.now += 11
    last = cstore.claim_job("noop")
    assert last is not None and last.job.source == {"n": RESCUE_BATCH + 1}
    states = [j.state for j in cstore.list_jobs(limit=200).jobs]
    assert states.count("pending") == RESCUE_BATCH and states.count("claimed") == 2  # one expired claim is left
    assert cstore.rescue_expired_jobs() == 1


def test_an_empty_queue_claims_nothing_and_writes_nothing(cstore: MemoryStore, session_id: str, db_path: Path) -> None:
    before = table_rows(db_path)
    assert cstore.claim_job("noop") is None
    assert table_rows(db_path) == before


@pytest.mark.parametrize(
    "update",
    [
        "state = 'bogus'",
        "state = 'done'",  # no finished_at
        "state = 'failed', finished_at = 1, result = '{}'",  # only done jobs carry a result
        "finished_at = 1",  # a pending job is not finished
    ],
)
def test_the_state_checks_still_refuse_inconsistent_rows(
    cstore: MemoryStore, session_id: str, db_path: Path, update: str
) -> None:
    job = cstore.enqueue_job("noop", session_id, {"n": 1}).job
    before = table_rows(db_path)
    with pytest.raises(apsw.ConstraintError), cstore.db.write() as conn:
        conn.execute(f"UPDATE jobs SET {update} WHERE uuid = ?", (job.id,))
    assert table_rows(db_path) == before


def test_queue_transitions_build_no_temporary_btree_for_their_checks(cstore: MemoryStore) -> None:
    def ephemeral(sql: str) -> int:
        ops = cstore.db.conn.execute("EXPLAIN " + sql, (None,) * sql.count("?")).fetchall()
        return sum(op[1] == "OpenEphemeral" for op in ops)

    assert ephemeral(_claim_sql(1, True)) == 1  # the RETURNING buffer only
    assert ephemeral(_COMPLETE) == 0


def _renewing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("renew-")]


def test_one_shared_thread_renews_every_running_claim_and_none_after_its_block(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    ttl = 0.3
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session = store.create_session(workspace)
        for n in range(2):
            store.enqueue_job("noop", session.id, {"n": n})
        first, second = store.claim_job("noop", ttl_s=ttl), store.claim_job("noop", ttl_s=ttl)
        threads_before = threading.active_count()
        with renewing(first, ttl), renewing(second, ttl):
            assert _renewing_threads()[0].name == f"renew-{first.id},{second.id}"
            time.sleep(2.5 * ttl)
            assert threading.active_count() <= threads_before + 1  # at most the renewer itself was started
            renewed = [store.get_job(c.id).lease_expires_at for c in (first, second)]
            assert all(expiry > c.job.lease_expires_at for expiry, c in zip(renewed, (first, second)))
        assert _renewing_threads() == [] and any(t.name == IDLE_NAME for t in threading.enumerate())
        after = [store.get_job(c.id).lease_expires_at for c in (first, second)]
        time.sleep(ttl)
        assert [store.get_job(c.id).lease_expires_at for c in (first, second)] == after  # no renewal after the block


def _hold_write_lock(path: str, seconds: float, ready) -> None:
    conn = connect(Path(path), busy_timeout_ms=5000)
    with conn:
        conn.execute("UPDATE store_meta SET value = value WHERE key = 'none'")
        ready.set()
        time.sleep(seconds)
    conn.close()


def test_the_busy_handler_waits_for_another_process_and_gives_up_after_its_timeout(
    store: MemoryStore, db_path: Path
) -> None:
    ctx = multiprocessing.get_context("spawn")
    for hold_s, timeout_ms, gets_lock in ((0.3, 10_000, True), (1.0, 200, False)):
        ready = ctx.Event()
        holder = ctx.Process(target=_hold_write_lock, args=(str(db_path), hold_s, ready))
        holder.start()
        assert ready.wait(30)
        conn = connect(db_path, busy_timeout_ms=timeout_ms)
        started = time.monotonic()
        try:
            if gets_lock:
                with conn:  # BEGIN IMMEDIATE waits until the other process commits
                    conn.execute("UPDATE store_meta SET value = value WHERE key = 'none'")
            else:
                with pytest.raises(apsw.BusyError), conn:
                    conn.execute("UPDATE store_meta SET value = value WHERE key = 'none'")
                assert time.monotonic() - started >= timeout_ms / 1000  # it waited out its whole bound first
        finally:
            conn.close()
            holder.join(30)
        assert holder.exitcode == 0


def test_the_busy_handler_counts_its_bound_from_the_first_busy_call() -> None:
    wait = BusyWait(30)
    started = time.monotonic()
    calls = 0
    while wait(calls):
        calls += 1
    assert time.monotonic() - started >= 0.03 and calls > 5  # short first sleeps, then it gives up
    assert wait(0)  # a new lock attempt starts a new bound


def test_jobs_built_from_rows_are_the_same_as_constructed_ones(cstore: MemoryStore, session_id: str) -> None:
    job = cstore.enqueue_job("noop", session_id, {"n": 1, "nested": {"a": [1, 2.5, None]}}).job
    values = [getattr(job, f.name) for f in dataclasses.fields(Job)]
    built = Job(*values)
    assert job == built and repr(job) == repr(built) and dataclasses.asdict(job) == dataclasses.asdict(built)
    assert type(job) is Job and vars(job) == vars(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = "done"  # type: ignore[misc]


def test_a_completion_and_the_next_claim_rewrite_two_pages(cstore: MemoryStore, session_id: str) -> None:
    """A worker going on to its next job commits once, and that commit writes the jobs' table page (the two rows,
    neighbours) and the one page of `jobs_active` holding the claimed entries and the oldest pending ones: counted
    as the WAL frames each commit appends (the hook replaces auto-checkpointing, so the log only grows)."""
    with cstore.db.write():
        for n in range(60):
            cstore.enqueue_job("noop", session_id, {"n": n})
    frames: list[int] = []
    conn = cstore.db.conn
    conn.set_wal_hook(lambda _conn, _name, pages: frames.append(pages) or apsw.SQLITE_OK)
    held = None
    for _ in range(40):
        held = run_one_job(cstore, lambda claim: None, kinds="noop", claim=held, claim_next=lambda: True).next_claim
    conn.set_wal_hook(None)
    conn.wal_autocheckpoint(1000)  # what the hook replaced
    per_commit = [b - a for a, b in zip(frames, frames[1:])]
    assert len(per_commit) == 40  # after the first claim, 40 completions that each claim the next job
    assert sorted(per_commit)[len(per_commit) // 2] == 2, per_commit  # the median: page splits are rare

