"""Leaving a `with` block releases durably, even while other processes keep the database busy (issue 10, item 5).

Real processes ("hammers") take the write lock of the same database again and again, holding it a few
milliseconds each time, while this process leaves lease and claim blocks many times, normally and by
`KeyboardInterrupt`. Every release must land: a lease left behind would lock the Session for a whole TTL, and a
claim left behind would cost its job a counted attempt once rescued.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from emelex_memory import (
    CommitOutcomeUnknownError,
    LeaseExpiredError,
    LeaseLostError,
    MemoryStore,
    NewEvent,
    Settings,
    run_one_job,
)
from emelex_memory.job_kinds import builtin_kinds

from ..support import Clock, kinds_fixture, table_rows
from ..support.vfs_faults import Fault, FaultyVFS

KINDS = builtin_kinds()
KINDS.register("exiting")

kinds = kinds_fixture(KINDS)
HAMMERS = 2

_HAMMER = textwrap.dedent("""
    import os, sys, time
    import apsw

    db, stop = sys.argv[1:3]
    deadline = time.monotonic() + 300  # a hammer outlives no test run, even one whose parent died
    conn = apsw.Connection(db, flags=apsw.SQLITE_OPEN_READWRITE)
    conn.set_busy_handler(lambda tries: time.sleep(0.0003) or True)  # wait for the other hammer, however long
    first = True
    while first or not os.path.exists(stop) and time.monotonic() < deadline:
        conn.execute("BEGIN IMMEDIATE")  # the write lock, held a few milliseconds
        time.sleep(0.004)
        conn.execute("COMMIT")
        if first:
            print("holding", flush=True)
            first = False
        time.sleep(0.001)
""")


@pytest.fixture
def hammers(db_path: Path, store: MemoryStore, tmp_path: Path) -> Iterator[None]:
    """`HAMMERS` processes contending for the write lock of `store`'s database until the test ends."""
    stop = tmp_path / "stop-hammering"
    procs = [
        subprocess.Popen([sys.executable, "-c", _HAMMER, str(db_path), str(stop)], stdout=subprocess.PIPE, text=True)
        for _ in range(HAMMERS)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline() == "holding\n"
        yield
    finally:
        stop.touch()
        for proc in procs:
            assert proc.wait(timeout=60) == 0


def _lease_states(store: MemoryStore) -> list[str]:
    with store.db.read() as conn:
        return [row[0] for row in conn.execute("SELECT state FROM session_leases")]


def test_leaving_lease_blocks_releases_every_time_while_other_processes_hold_the_write_lock(
    store: MemoryStore, workspace: Path, hammers: None
) -> None:
    session = store.create_session(workspace)
    for i in range(30):
        if i % 2:
            with pytest.raises(KeyboardInterrupt):
                with store.acquire_lease(session.id, workspace) as lease:
                    raise KeyboardInterrupt  # an interrupted holder
        else:
            with store.acquire_lease(session.id, workspace) as lease:
                lease.replay()
                lease.append_turn([NewEvent("user", {"text": f"turn {i}"})])
        # the release landed: otherwise the next acquire_lease raises LeaseHeldError for a whole TTL
    assert _lease_states(store) == ["released"]


def test_an_interrupted_worker_never_loses_an_attempt_while_other_processes_hold_the_write_lock(
    store: MemoryStore, workspace: Path, hammers: None
) -> None:
    session = store.create_session(workspace)
    jobs = [store.enqueue_job("exiting", session.id, {"n": n}).job for n in range(10)]

    def interrupted(claim):
        raise KeyboardInterrupt

    for _ in jobs:
        with pytest.raises(KeyboardInterrupt):
            run_one_job(store, interrupted, kinds="exiting")
    for job in jobs:
        now = store.get_job(job.id)
        assert (now.state, now.attempts) == ("pending", 0)
        assert now.diagnostics[-1].event == "released" and "KeyboardInterrupt" in now.diagnostics[-1].message


# -- what leaving a block does in the corner cases ------------------------------------------------------------------


def test_release_of_an_expired_lease_raises_and_leaves_the_row_to_maintain(
    cstore: MemoryStore, workspace: Path, clock: Clock, db_path: Path
) -> None:
    session = cstore.create_session(workspace)
    lease = cstore.acquire_lease(session.id, workspace)
    clock.now += cstore.settings.session_lease_ttl_s + 1
    before = table_rows(db_path)
    with pytest.raises(LeaseExpiredError):
        lease.release()
    assert table_rows(db_path) == before  # still 'active' (and expired), for maintain's stale-lease sweep
    with pytest.raises(LeaseLostError):
        lease.release()  # it has ended
    cstore.acquire_lease(session.id, workspace)  # the Session is free


def test_leaving_a_block_with_a_lost_or_expired_lease_is_no_error(
    cstore: MemoryStore, workspace: Path, clock: Clock
) -> None:
    session = cstore.create_session(workspace)
    with cstore.acquire_lease(session.id, workspace):
        clock.now += cstore.settings.session_lease_ttl_s + 1
    with cstore.acquire_lease(session.id, workspace):
        clock.now += cstore.settings.session_lease_ttl_s + 1
        cstore.acquire_lease(session.id, workspace)  # replaced by another holder
    cstore.enqueue_job("exiting", session.id, {"n": 1})
    with cstore.claim_job("exiting") as claim:
        cstore.cancel_job(claim.id)
    assert cstore.get_job(claim.id).state == "cancelled"


def test_a_failing_release_never_replaces_the_exception_leaving_the_block(
    faulty_vfs: FaultyVFS, db_path: Path, settings: Settings, workspace: Path
) -> None:
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session = store.create_session(workspace)
        worked = store.create_session(workspace)  # its jobs, claimable whatever became of the lease on `session`
        for n in range(2):
            store.enqueue_job("exiting", worked.id, {"n": n})
        with pytest.raises(ValueError):
            with store.acquire_lease(session.id, workspace):
                faulty_vfs.arm(Fault("xWrite", "wal", 0, times=0))  # every write fails from here on
                raise ValueError("the block's own error")
        faulty_vfs.disarm()
        with pytest.raises(ValueError):
            with store.claim_job("exiting"):
                faulty_vfs.arm(Fault("xWrite", "wal", 0, times=0))
                raise ValueError("the block's own error")
        faulty_vfs.disarm()
        assert faulty_vfs.fired
        with pytest.raises(CommitOutcomeUnknownError):  # with no exception leaving the block, it is reported
            with store.claim_job("exiting"):
                faulty_vfs.arm(Fault("xWrite", "wal", 0, times=0))
        faulty_vfs.disarm()
