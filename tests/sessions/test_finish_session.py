"""`finish_session` queues distillation and releases the lease in one transaction: both or neither."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import CommitOutcomeUnknownError, EmelexError, LeaseLostError, MemoryStore, NewEvent

from ..support import table_rows
from ..support.vfs_faults import Fault, installed

METHOD = {"sync": "xSync", "write": "xWrite"}


def leased(store: MemoryStore, workspace: Path):
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace, ttl_s=600)
    lease.replay()
    lease.append_turn([NewEvent("user", {"text": "remember: make test"})])
    return lease


def lease_state(db: Path) -> str:
    [row] = table_rows(db)["session_leases"]
    return row[3]


def test_a_failure_between_queueing_and_release_leaves_neither(cstore, workspace, db_path, monkeypatch):
    lease = leased(cstore, workspace)
    before = table_rows(db_path)
    queue = MemoryStore.queue_distillation

    def queue_then_fail(self, session_id):
        queue(self, session_id)
        raise RuntimeError("injected between queueing and release")

    monkeypatch.setattr(MemoryStore, "queue_distillation", queue_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        cstore.finish_session(lease)
    assert table_rows(db_path) == before  # no job, the lease still active
    monkeypatch.undo()
    enqueued = cstore.finish_session(lease)  # the lease object was not marked ended: finishing again works
    assert enqueued.created and len(table_rows(db_path)["jobs"]) == 1 and lease_state(db_path) == "released"


@pytest.mark.parametrize("op", ("write", "sync"))
def test_a_failed_commit_of_finish_session_queues_and_releases_both_or_neither(
    db_path, settings, workspace, op
):
    with installed() as vfs:
        store = MemoryStore.open_path(db_path, settings)
        try:
            lease = leased(store, workspace)
            vfs.arm(Fault(METHOD[op], "wal"))
            with pytest.raises((apsw.Error, EmelexError)):
                store.finish_session(lease)
            assert vfs.fired
            rows = table_rows(db_path)
            assert (len(rows["jobs"]) == 1) == (lease_state(db_path) == "released")
            if op == "write":  # the commit never reached the log: nothing happened
                assert rows["jobs"] == [] and lease_state(db_path) == "active"
            if lease_state(db_path) == "active":
                assert store.finish_session(lease).created  # not marked ended by the failed commit
            assert len(table_rows(db_path)["jobs"]) == 1 and lease_state(db_path) == "released"
        finally:
            store.close()


def test_finishing_a_lost_lease_queues_nothing(cstore, workspace, db_path, clock):
    lease = leased(cstore, workspace)
    clock.now += 601
    cstore.acquire_lease(lease.session_id, workspace).release()  # another holder took over after expiry
    before = table_rows(db_path)
    with pytest.raises(LeaseLostError):
        cstore.finish_session(lease)
    assert table_rows(db_path) == before
    assert cstore.queue_distillation(lease.session_id).created  # queueing alone is still possible


def test_finish_session_refuses_a_lease_of_another_store(cstore, db_path, settings, workspace):
    lease = leased(cstore, workspace)
    with MemoryStore.open_path(db_path, settings) as other:
        with pytest.raises(EmelexError, match="store that acquired it"):
            other.finish_session(lease)
    assert table_rows(db_path)["jobs"] == [] and lease_state(db_path) == "active"
    lease.release()


@pytest.mark.parametrize("durable", [False, True], ids=["not-durable", "durable"])
def test_after_an_unknown_commit_outcome_finishing_again_queues_exactly_once(
    faulty_vfs, db_path, settings, workspace, durable
):
    """The README's idiom: `finish_session` inside the lease's `with` block. Whether the failed commit landed (a
    checkpoint fsync failing after it) or not (the WAL fsync failing), calling it again completes what is missing."""
    store = MemoryStore.open_path(db_path, settings)
    try:
        if durable:
            store.db.conn.execute("PRAGMA wal_autocheckpoint=1").fetchall()  # checkpoint (and fail) after the commit
        with pytest.raises(CommitOutcomeUnknownError, match=r"call finish_session\(lease\) again") as caught:
            with leased(store, workspace) as lease:
                faulty_vfs.arm(Fault("xSync", "db" if durable else "wal"))
                store.finish_session(lease)
        faulty_vfs.disarm()
        assert "\n" not in str(caught.value)
        assert lease_state(db_path) == "released"  # by the commit, or by leaving the block
        assert len(table_rows(db_path)["jobs"]) == int(durable)
        again = store.finish_session(lease)
        assert again.created is not durable and again.job.session_id == lease.session_id
        assert len(table_rows(db_path)["jobs"]) == 1
    finally:
        store.close()
