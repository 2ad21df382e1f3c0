"""A failed read surfaces as itself: a typed I/O error at every read call of a replay and of a claim, never a
follow-up `SQLError` from a rollback SQLite had already done (issue 10, item 3)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from emelex_memory import MemoryStore, NewEvent, Settings, StoreIOError
from emelex_memory.job_kinds import builtin_kinds

from ..support import kinds_fixture, table_rows
from ..support.vfs_faults import Fault, FaultyVFS

KINDS = builtin_kinds()
KINDS.register("readfault")

kinds = kinds_fixture(KINDS)
MAX_CALLS = 400  # far more read calls than any of these operations makes


@pytest.fixture
def filled(db_path: Path, settings: Settings, workspace: Path) -> tuple[str, apsw.Connection]:
    """A Session with turns both in the database file and in the WAL, three queued jobs, and a connection held
    open (so closing a store does not checkpoint the WAL away); returns the Session ID and that connection."""
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            for i in range(30):
                lease.append_turn([NewEvent("user", {"text": f"turn {i} " + "x" * 300})])
            lease.release()
    keeper = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READWRITE)
    keeper.execute("SELECT count(*) FROM sessions").fetchall()  # it now holds the WAL open: no close checkpoints
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        with store.acquire_lease(session.id, workspace) as lease:
            for _ in lease.replay_all():
                pass
            for i in range(30):
                lease.append_turn([NewEvent("assistant", {"text": f"answer {i} " + "y" * 300})])
            lease.release()
        for n in range(3):
            store.enqueue_job("readfault", session.id, {"n": n})
    yield session.id, keeper
    keeper.close()


def _every_read_fault(
    db_path: Path, settings: Settings, vfs: FaultyVFS, kind: str, operation: Callable[[MemoryStore], object]
) -> list[str]:
    """Run `operation` on a fresh store (cold page cache) with the `i`-th xRead of `kind` failing, for i = 0, 1, ...
    until it runs without reaching the fault; return the type name of each error it raised."""
    errors = []
    for index in range(MAX_CALLS):
        with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
            vfs.arm(Fault("xRead", kind, index))
            try:
                operation(store)
            except Exception as exc:  # noqa: BLE001 - the test is about which exception comes out
                errors.append(type(exc).__name__)
                assert vfs.fired, f"{exc!r} without the injected fault"
            finally:
                vfs.disarm()
            if not vfs.fired:
                return errors
    pytest.fail(f"{kind} reads never ran out after {MAX_CALLS} calls")


def _replay_everything(store: MemoryStore, session_id: str) -> None:
    after = 0
    while True:
        page = store.replay(session_id, after, limit=7)
        after = page.next_cursor
        if page.done:
            return


@pytest.mark.parametrize("kind", ["db", "wal"])
def test_a_failed_read_during_replay_is_always_a_typed_io_error(
    faulty_vfs: FaultyVFS, db_path: Path, settings: Settings, filled, kind: str
) -> None:
    session_id, _ = filled
    errors = _every_read_fault(db_path, settings, faulty_vfs, kind, lambda s: _replay_everything(s, session_id))
    assert errors, "no read was ever failed"
    assert set(errors) == {"StoreIOError"}


@pytest.mark.parametrize("kind", ["db", "wal"])
def test_a_failed_read_during_a_claim_is_always_a_typed_io_error_and_claims_nothing(
    faulty_vfs: FaultyVFS, db_path: Path, settings: Settings, filled, kind: str
) -> None:
    before = table_rows(db_path)
    claims = []

    def claim(store: MemoryStore) -> None:
        claims.append(store.claim_job("readfault"))

    errors = _every_read_fault(db_path, settings, faulty_vfs, kind, claim)
    assert errors, "no read was ever failed"
    assert set(errors) == {"StoreIOError"}
    claimed = [c for c in claims if c is not None]
    assert len(claimed) == 1  # only the last run, which met no fault
    after = table_rows(db_path)
    changed = [row for row in after["jobs"] if row not in before["jobs"]]
    assert [row[1] for row in changed] == [claimed[0].id]


def test_the_typed_io_error_names_the_database_and_what_to_do(
    faulty_vfs: FaultyVFS, db_path: Path, settings: Settings, filled
) -> None:
    session_id, _ = filled
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        faulty_vfs.arm(Fault("xRead", "db", 0, times=0))
        with pytest.raises(StoreIOError) as caught:
            store.replay(session_id)
        faulty_vfs.disarm()
        message = str(caught.value)
        assert str(db_path) in message and "emelex memory doctor" in message and "\n" not in message
        assert isinstance(caught.value.__cause__, apsw.IOError)
        assert store.replay(session_id).events  # the connection is usable again once the disk is
