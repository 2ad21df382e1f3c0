"""An append re-checks everything in the store even when its lease has appended before: a lease that wrote a turn
remembers the head it left and inserts its next turn in one statement that re-checks that head, the lease and the
workspace row; whatever changed since is refused with its typed error, nothing written, and a head changed behind
the lease's back is read from the store, never taken from the lease's memory."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    LeaseExpiredError,
    LeaseLostError,
    MemoryStore,
    NewEvent,
    StaleCursorError,
    WorkspaceReplacedError,
)
from emelex_memory.agent import journal
from emelex_memory.errors import OpenJournalError

from ..support import Clock, table_rows


def _turn(text: str) -> list[NewEvent]:
    return [NewEvent("user", {"text": text}), NewEvent("assistant", {"text": text.upper()})]


def _armed(store: MemoryStore, workspace: Path):
    """A Session whose replayed lease has appended two turns (seqs 1-4)."""
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    lease.append_turn(_turn("one"))
    lease.append_turn(_turn("two"))
    return session, lease


def _sql(db: Path, sql: str) -> None:
    """Change the database behind the store's back, as another process could."""
    conn = apsw.Connection(str(db))
    try:
        with conn:
            conn.execute(sql)
    finally:
        conn.close()


def _expire(store: MemoryStore, clock: Clock) -> None:
    clock.now += store.settings.session_lease_ttl_s + 1


def _take_over(store: MemoryStore, clock: Clock, session, workspace: Path) -> None:
    _expire(store, clock)
    store.acquire_lease(session.id, workspace)


CHANGES = {
    "expired": (LeaseExpiredError, lambda store, clock, session, lease, ws: _expire(store, clock)),
    "taken over": (LeaseLostError, lambda store, clock, session, lease, ws: _take_over(store, clock, session, ws)),
    "another token": (LeaseLostError, lambda store, clock, session, lease, ws: _sql(
        store.path, "UPDATE session_leases SET token_hash = randomblob(32)")),
    "released": (LeaseLostError, lambda store, clock, session, lease, ws: _sql(
        store.path, "UPDATE session_leases SET state = 'released', ended_at = 0")),
    "workspace row changed": (WorkspaceReplacedError, lambda store, clock, session, lease, ws: _sql(
        store.path, "UPDATE sessions SET workspace_epoch = workspace_epoch + 1")),
    "newest event gone": (StaleCursorError, lambda store, clock, session, lease, ws: _sql(
        store.path, "DELETE FROM events WHERE seq = 4")),
    "agent turn open": (OpenJournalError, lambda store, clock, session, lease, ws: journal.open_turn(
        store, lease, "do it")),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_an_armed_lease_is_refused_whatever_changed_and_nothing_is_written(
    cstore: MemoryStore, clock: Clock, workspace: Path, change: str
) -> None:
    session, lease = _armed(cstore, workspace)
    error, make = CHANGES[change]
    make(cstore, clock, session, lease, workspace)
    before = table_rows(cstore.path)
    with pytest.raises(error):
        lease.append_turn(_turn("three"))
    assert table_rows(cstore.path) == before


def test_a_moved_workspace_row_is_refused(cstore: MemoryStore, clock: Clock, workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = cstore.create_session(other)
    session, lease = _armed(cstore, workspace)
    _sql(cstore.path, "UPDATE sessions SET workspace_id = (SELECT workspace_id FROM sessions WHERE uuid = "
         f"'{elsewhere.id}') WHERE uuid = '{session.id}'")
    before = table_rows(cstore.path)
    with pytest.raises(WorkspaceReplacedError):
        lease.append_turn(_turn("three"))
    assert table_rows(cstore.path) == before


@pytest.mark.parametrize("column", ["turn", "byte_end", "media_end"])
def test_the_next_turn_follows_the_stored_head_not_the_one_the_lease_remembers(
    store: MemoryStore, workspace: Path, column: str
) -> None:
    session, lease = _armed(store, workspace)
    _sql(store.path, f"UPDATE events SET {column} = {column} + 7 WHERE seq = 4")
    with store.db.read() as conn:
        turn, byte_end, media_end = conn.execute("SELECT turn, byte_end, media_end FROM events WHERE seq = 4").fetchone()
    appended = lease.append_turn(_turn("three"))
    with store.db.read() as conn:
        rows = conn.execute("SELECT turn, size, byte_end, media_end FROM events WHERE seq > 4 ORDER BY seq").fetchall()
    assert appended.turn == turn + 1
    assert [r[0] for r in rows] == [turn + 1, turn + 1]
    assert [r[2] for r in rows] == [byte_end + rows[0][1], byte_end + rows[0][1] + rows[1][1]]
    assert [r[3] for r in rows] == [media_end, media_end]


def test_turns_appended_by_one_statement_keep_their_order(store: MemoryStore, workspace: Path) -> None:
    session, lease = _armed(store, workspace)
    texts = [f"event {i}" for i in range(20)]
    appended = lease.append_turn([NewEvent("note", {"text": t}) for t in texts])
    with store.db.read() as conn:
        rows = conn.execute(
            "SELECT id, seq, position, payload FROM events WHERE seq > 4 ORDER BY id").fetchall()
    assert [r[0] for r in rows] == list(appended.event_ids)
    assert [r[1] for r in rows] == list(range(5, 25))
    assert [r[2] for r in rows] == list(range(20))
    assert [r[3] for r in rows] == [f'{{"text":"event {i}"}}' for i in range(20)]
