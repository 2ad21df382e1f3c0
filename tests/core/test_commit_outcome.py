"""A commit whose I/O failed has an unknown outcome, and the API says so (issue 10, item 2).

Two real ways a commit reports a failure: the fsync of the WAL at commit fails, so the transaction's frames sit
in the -wal file beyond what the wal-index records (this connection no longer sees them, its next write
overwrites them, and the next open after a crash recovers them); or the commit is durable and a step after it
fails (the automatic checkpoint's fsync of the database file, made to run after every commit here). Both raise
`CommitOutcomeUnknownError`; the callers then re-read before they retry, so nothing is ever written twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    COMPACTION_KIND,
    CommitOutcomeUnknownError,
    LeaseHeldError,
    MemoryStore,
    NewEvent,
    ReplayRequiredError,
    Settings,
    StaleCursorError,
    compaction_handler,
    run_one_job,
)
from emelex_memory.job_kinds import builtin_kinds

from ..support import Clock, kinds_fixture, table_rows
from ..compaction.test_compaction import WINDOW, add_turns, summarize, tokens
from ..support.vfs_faults import Fault, FaultyVFS

KINDS = builtin_kinds()
KINDS.register("outcome")

kinds = kinds_fixture(KINDS)
WAL_FSYNC = Fault("xSync", "wal", 0)  # the commit's fsync of the WAL: the transaction is not durable (live)
CHECKPOINT_FSYNC = Fault("xSync", "db", 0)  # the checkpoint's fsync after a durable commit


@pytest.fixture
def fstore(faulty_vfs: FaultyVFS, db_path: Path, settings: Settings, clock: Clock):
    """A store whose connection goes through the fault-injecting VFS."""
    s = MemoryStore.open_path(db_path, settings, clock=clock, kinds=KINDS)
    yield s
    s.close()


def _checkpoint_every_commit(store: MemoryStore) -> None:
    store.db.conn.execute("PRAGMA wal_autocheckpoint=1").fetchall()


def _texts(store: MemoryStore, session_id: str) -> list[str]:
    events, after = [], 0
    while True:
        page = store.replay(session_id, after)
        events += page.events
        after = page.next_cursor
        if page.done:
            return [e.payload["text"] for e in events]


def _turn(text: str) -> list[NewEvent]:
    return [NewEvent("user", {"text": text})]


def _leased(store: MemoryStore, workspace: Path):
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    lease.append_turn(_turn("first"))
    return session, lease


# -- append_turn ------------------------------------------------------------------------------------------


def test_a_failed_wal_fsync_at_commit_makes_the_lease_replay_and_a_retry_appends_once(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, workspace: Path, db_path: Path
) -> None:
    session, lease = _leased(fstore, workspace)
    seen = lease.cursor
    faulty_vfs.arm(WAL_FSYNC)
    with pytest.raises(CommitOutcomeUnknownError) as caught:
        lease.append_turn(_turn("second"))
    faulty_vfs.disarm()
    message = str(caught.value)
    assert "may or may not be durable" in message and f"expected_seq={seen}" in message and "\n" not in message
    assert str(db_path) in message
    assert (lease.replayed, lease.cursor) == (False, seen)
    with pytest.raises(ReplayRequiredError):
        lease.append_turn(_turn("second"))
    page = lease.replay()
    assert page.done and page.events == []  # this connection does not see the frames of the failed commit
    lease.append_turn(_turn("second"), expected_seq=seen)
    assert _texts(fstore, session.id) == ["first", "second"]
    lease.release()
    fstore.close()
    with MemoryStore.open_path(db_path, fstore.settings, kinds=KINDS) as again:
        assert _texts(again, session.id) == ["first", "second"]


def test_a_commit_that_landed_before_its_error_is_found_by_the_replay_and_never_appended_twice(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, workspace: Path
) -> None:
    session, lease = _leased(fstore, workspace)
    seen = lease.cursor
    _checkpoint_every_commit(fstore)
    faulty_vfs.arm(CHECKPOINT_FSYNC)
    with pytest.raises(CommitOutcomeUnknownError):
        lease.append_turn(_turn("second"))
    faulty_vfs.disarm()
    assert [e.seq for e in lease.replay().events] == [seen + 1]  # it was committed
    with pytest.raises(StaleCursorError):
        lease.append_turn(_turn("second"), expected_seq=seen)
    assert _texts(fstore, session.id) == ["first", "second"]


_CHILD = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from emelex_memory import CommitOutcomeUnknownError, MemoryStore, NewEvent, Settings
    from tests.support.vfs_faults import Fault, installed

    db, home, session_id, workspace = sys.argv[2:6]
    with installed() as vfs:
        store = MemoryStore.open_path(db, Settings(home=home))
        lease = store.acquire_lease(session_id, workspace, ttl_s=60)
        lease.replay()
        seen = lease.cursor
        vfs.arm(Fault("xSync", "wal", 0))
        try:
            lease.append_turn([NewEvent("user", {"text": "second"})])
            outcome = "appended"
        except CommitOutcomeUnknownError as exc:
            outcome = type(exc).__name__
        print(json.dumps({"outcome": outcome, "seen": seen, "fired": vfs.fired}), flush=True)
        os._exit(0)  # die without closing anything, as a crash would
""")


def test_after_a_crash_the_next_open_recovers_the_turn_once_and_a_replayed_retry_does_not_duplicate_it(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session, lease = _leased(store, workspace)
        lease.release()
    root = str(Path(__file__).resolve().parents[2])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, root, str(db_path), str(settings.home), session.id, str(workspace)],
        capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout)
    assert report["outcome"] == "CommitOutcomeUnknownError" and report["fired"] == 1
    later = Clock(time.time() + 3600)  # the dead child's lease has expired by then
    with MemoryStore.open_path(db_path, settings, clock=later, kinds=KINDS) as store:
        assert _texts(store, session.id) == ["first", "second"]  # recovered from the WAL, exactly once
        lease = store.acquire_lease(session.id, workspace)
        lease.replay()
        with pytest.raises(StaleCursorError):  # the caller's retry, from the cursor it had: refused
            lease.append_turn(_turn("second"), expected_seq=report["seen"])
        assert _texts(store, session.id) == ["first", "second"]
        lease.release()


def test_a_full_disk_at_commit_keeps_the_free_space_remedy(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, workspace: Path
) -> None:
    session, lease = _leased(fstore, workspace)
    faulty_vfs.arm(Fault("xWrite", "wal", 0, apsw.FullError))  # the commit writes the turn's frames: disk full
    with pytest.raises(CommitOutcomeUnknownError) as caught:
        lease.append_turn(_turn("second"))
    faulty_vfs.disarm()
    message = str(caught.value)
    assert "\n" not in message and "may or may not be durable: first free space on the disk holding it" in message
    assert message.index("free space") < message.index("replay this lease")  # the cause first, then the re-read


def test_an_unknown_lease_acquisition_says_how_long_the_session_may_stay_leased(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, workspace: Path, clock: Clock
) -> None:
    session = fstore.create_session(workspace)
    _checkpoint_every_commit(fstore)
    faulty_vfs.arm(CHECKPOINT_FSYNC)  # the lease commits, then the checkpoint fails: its token is lost
    with pytest.raises(CommitOutcomeUnknownError, match="stays leased until it expires \\(at most 30s\\)"):
        fstore.acquire_lease(session.id, workspace, ttl_s=30)
    faulty_vfs.disarm()
    with pytest.raises(LeaseHeldError):  # as the message says: it was durable ...
        fstore.acquire_lease(session.id, workspace, ttl_s=30)
    clock.now += 31
    fstore.acquire_lease(session.id, workspace).release()  # ... and free again once it expired


# -- put_asset --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [WAL_FSYNC, CHECKPOINT_FSYNC], ids=["not-durable", "durable"])
def test_put_asset_says_its_outcome_is_unknown_and_a_retry_is_idempotent(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, db_path: Path, fault: Fault
) -> None:
    fstore.put_asset(b"warm up", "image/png")
    _checkpoint_every_commit(fstore)
    faulty_vfs.arm(fault)
    with pytest.raises(CommitOutcomeUnknownError) as caught:
        fstore.put_asset(b"the bytes", "image/png")
    faulty_vfs.disarm()
    assert "idempotent" in str(caught.value)
    ref = fstore.put_asset(b"the bytes", "image/png")
    assert fstore.read_asset(ref) == b"the bytes"
    assert [info.ref for info in fstore.list_assets().assets].count(ref) == 1


# -- job completion and the worker ----------------------------------------------------------------------------


@pytest.fixture
def job_session(fstore: MemoryStore, workspace: Path) -> str:
    return fstore.create_session(workspace).id


def test_an_unknown_completion_that_is_durable_is_returned_by_every_later_transition(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, job_session: str, db_path: Path
) -> None:
    job = fstore.enqueue_job("outcome", job_session, {"n": 1}).job
    claim = fstore.claim_job("outcome")
    _checkpoint_every_commit(fstore)
    faulty_vfs.arm(CHECKPOINT_FSYNC)
    with pytest.raises(CommitOutcomeUnknownError) as caught:
        claim.complete({"ok": 1})
    faulty_vfs.disarm()
    assert claim.outcome_unknown and "re-reads the job" in str(caught.value)
    before = table_rows(db_path)
    for transition in (lambda: claim.fail("retry?"), lambda: claim.release(), lambda: claim.complete({"ok": 2})):
        claim.ended = False  # each transition below is tried on the unsettled claim
        done = transition()
        assert (done.id, done.state, done.result, done.attempts) == (job.id, "done", {"ok": 1}, 0)
        assert claim.ended
    assert table_rows(db_path) == before  # none of them wrote anything


def test_an_unknown_completion_that_is_not_durable_is_completed_by_the_retry(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, job_session: str
) -> None:
    fstore.enqueue_job("outcome", job_session, {"n": 1})
    claim = fstore.claim_job("outcome")
    faulty_vfs.arm(WAL_FSYNC)
    with pytest.raises(CommitOutcomeUnknownError):
        claim.complete({"ok": 1})
    faulty_vfs.disarm()
    assert fstore.get_job(claim.id).state == "claimed"
    done = claim.complete({"ok": 1})
    assert (done.state, done.result) == ("done", {"ok": 1})
    assert fstore.get_job(claim.id).state == "done"


@pytest.mark.parametrize(
    ("fault", "status", "attempts"), [(CHECKPOINT_FSYNC, "done", 0), (WAL_FSYNC, "retrying", 1)],
    ids=["durable", "not-durable"],
)
def test_the_worker_reports_a_durable_compaction_as_done_with_one_summary_and_counts_only_a_lost_one(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, workspace: Path, fault: Fault, status: str, attempts: int
) -> None:
    session = fstore.create_session(workspace)
    add_turns(fstore, session.id, workspace, 10)
    queued = fstore.queue_compaction(session.id, context_window=WINDOW, count_tokens=tokens)
    assert queued.job is not None
    _checkpoint_every_commit(fstore)

    def handler(claim):
        result = compaction_handler(summarize)(claim)
        faulty_vfs.arm(fault)  # the completion's commit is the next write
        return result

    outcome = run_one_job(fstore, handler, kinds=COMPACTION_KIND)
    faulty_vfs.disarm()
    assert faulty_vfs.fired == 1
    assert (outcome.status, outcome.job.attempts) == (status, attempts), outcome.detail
    with fstore.db.read() as conn:
        summaries = conn.execute("SELECT count(*) FROM events WHERE kind = 'summary'").fetchone()[0]
    assert summaries == (1 if status == "done" else 0)
    if status == "retrying":
        assert "CommitOutcomeUnknownError" in outcome.job.diagnostics[-1].message


@pytest.mark.parametrize(("fault", "durable"), [(CHECKPOINT_FSYNC, True), (WAL_FSYNC, False)],
                         ids=["durable", "not-durable"])
def test_an_unknown_complete_and_claim_settles_the_job_once_and_leaves_the_next_to_its_lease(
    fstore: MemoryStore, faulty_vfs: FaultyVFS, job_session: str, clock: Clock, fault: Fault, durable: bool
) -> None:
    first = fstore.enqueue_job("outcome", job_session, {"n": 1}).job
    second = fstore.enqueue_job("outcome", job_session, {"n": 2}).job
    claim = fstore.claim_job("outcome", ttl_s=5)
    _checkpoint_every_commit(fstore)
    faulty_vfs.arm(fault)
    with pytest.raises(CommitOutcomeUnknownError):
        fstore.complete_and_claim(claim, {"ok": 1}, kinds="outcome", ttl_s=5)
    faulty_vfs.disarm()
    done = claim.fail("the completion's outcome was unknown")  # re-reads the job first
    assert (done.id, done.state, done.attempts) == ((first.id, "done", 0) if durable else (first.id, "pending", 1))
    assert fstore.get_job(second.id).state == ("claimed" if durable else "pending")
    clock.now += 6  # past the lease of a next claim that became durable with the completion: nobody holds it
    assert fstore.rescue_expired_jobs() == (1 if durable else 0)
    after = fstore.get_job(second.id)
    assert (after.state, after.attempts) == (("pending", 1) if durable else ("pending", 0))
