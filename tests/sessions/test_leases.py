"""Sessions, workspace identity and SessionLease semantics (single process)."""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import time
from itertools import accumulate
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    InvalidInputError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    MemoryStore,
    NewEvent,
    ReplayRequiredError,
    SessionNotFoundError,
    Settings,
    StaleCursorError,
    WorkspaceMissingError,
    WorkspaceReplacedError,
)

from ..support import Clock, table_rows


def _turn(text: str = "hi") -> list[NewEvent]:
    return [NewEvent("user", {"text": text}), NewEvent("assistant", {"text": text.upper()})]


def _ready(store: MemoryStore, workspace: Path):
    session = store.create_session(workspace, title="t")
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    return session, lease


def test_session_binds_canonical_workspace_identity(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    link = tmp_path / "via-link"
    os.symlink(workspace, link)
    session = store.create_session(link, title="x")
    st = os.stat(workspace)
    assert session.workspace.path == str(workspace.resolve())
    assert (session.workspace.device, session.workspace.inode) == (st.st_dev, st.st_ino)
    assert store.get_session(session.id) == session


def test_create_session_in_missing_workspace_writes_nothing(store: MemoryStore, tmp_path: Path) -> None:
    before = table_rows(store.path)
    with pytest.raises(WorkspaceMissingError):
        store.create_session(tmp_path / "nope")
    assert table_rows(store.path) == before


def test_validate_workspace_accepts_rename_and_refuses_replacement(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    assert session.validate_workspace(workspace) == workspace.resolve()
    renamed = workspace.with_name("renamed")
    workspace.rename(renamed)
    assert session.validate_workspace(renamed) == renamed.resolve()
    workspace.mkdir()
    with pytest.raises(WorkspaceReplacedError):
        session.validate_workspace(workspace)
    shutil.rmtree(renamed)
    with pytest.raises(WorkspaceMissingError):
        session.validate_workspace(renamed)


def test_lease_from_renamed_workspace_updates_stored_path(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    renamed = workspace.with_name("moved")
    workspace.rename(renamed)
    lease = store.acquire_lease(session.id, renamed)
    lease.replay()
    lease.append_turn(_turn())
    assert store.get_session(session.id).workspace.path == str(renamed.resolve())


def test_replaced_workspace_is_refused_for_lease_and_nothing_changes(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    workspace.rename(workspace.with_name("old"))
    workspace.mkdir()
    before = table_rows(store.path)
    with pytest.raises(WorkspaceReplacedError):
        store.acquire_lease(session.id, workspace)
    assert table_rows(store.path) == before


def test_workspace_replaced_under_a_lease_blocks_append(store: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(store, workspace)
    lease.append_turn(_turn())
    workspace.rename(workspace.with_name("old"))
    workspace.mkdir()
    before = table_rows(store.path)
    with pytest.raises(WorkspaceReplacedError):
        lease.append_turn(_turn())
    assert table_rows(store.path) == before


def test_one_live_lease_per_session(store: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(store, workspace)
    with pytest.raises(LeaseHeldError, match="wait for it"):
        store.acquire_lease(session.id, workspace)
    lease.release()
    second = store.acquire_lease(session.id, workspace)
    assert second.token != lease.token


def test_unknown_session(store: MemoryStore, workspace: Path) -> None:
    with pytest.raises(SessionNotFoundError):
        store.acquire_lease("no-such-session", workspace)
    with pytest.raises(SessionNotFoundError):
        store.get_session("no-such-session")


def test_append_requires_replay_first(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    with pytest.raises(ReplayRequiredError):
        lease.append_turn(_turn())
    lease.replay()
    assert lease.append_turn(_turn()).turn == 1


def test_new_lease_must_replay_existing_history(store: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(store, workspace)
    for i in range(3):
        lease.append_turn(_turn(str(i)))
    lease.release()
    lease2 = store.acquire_lease(session.id, workspace)
    page = lease2.replay(limit=2)
    assert not page.done and lease2.cursor == 2
    with pytest.raises(ReplayRequiredError):
        lease2.append_turn(_turn())
    events = list(lease2.replay_all())
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert lease2.append_turn(_turn()).first_seq == 7


def test_turns_get_consecutive_ids_positions_and_seqs(store: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(store, workspace)
    a = lease.append_turn(_turn("a"))
    b = lease.append_turn([NewEvent("user", "x"), NewEvent("tool_call", [1, 2]), NewEvent("tool_result", None)])
    assert (a.turn, a.first_seq, a.last_seq) == (1, 1, 2)
    assert (b.turn, b.first_seq, b.last_seq) == (2, 3, 5)
    events = store.replay(session.id).events
    assert [(e.turn, e.position, e.seq) for e in events] == [(1, 0, 1), (1, 1, 2), (2, 0, 3), (2, 1, 4), (2, 2, 5)]
    assert [e.payload for e in events] == [{"text": "a"}, {"text": "A"}, "x", [1, 2], None]
    assert a.event_ids + b.event_ids == tuple(e.id for e in events)
    assert [e.byte_end for e in events] == list(accumulate(e.size for e in events))
    first = events[0]
    assert first._asdict()["seq"] == first.seq == first[1] and len(first) == len(first._fields) == 10
    assert first._replace(kind="note").kind == "note" and type(first._replace(kind="note")) is type(first)
    assert repr(first).startswith(f"Event(id={first.id}, seq=1, turn=1,") and pickle.loads(pickle.dumps(first)) == first
    s = store.get_session(session.id)
    assert (s.last_seq, s.last_turn, s.event_bytes) == (5, 2, events[-1].byte_end)
    assert s.updated_at == events[-1].created_at  # the newest event's commit time


def test_stale_cursor_is_refused_and_nothing_changes(store: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(store, workspace)
    lease.append_turn(_turn())
    before = table_rows(store.path)
    with pytest.raises(StaleCursorError, match="replay from your cursor"):
        lease.append_turn(_turn(), expected_seq=0)
    assert table_rows(store.path) == before
    assert lease.append_turn(_turn(), expected_seq=2).first_seq == 3


def test_expired_lease_is_refused_and_can_be_taken_over(cstore: MemoryStore, workspace: Path, clock: Clock) -> None:
    session, lease = _ready(cstore, workspace)
    lease.append_turn(_turn())
    clock.now += cstore.settings.session_lease_ttl_s + 1
    before = table_rows(cstore.path)
    with pytest.raises(LeaseExpiredError):
        lease.append_turn(_turn())
    with pytest.raises(LeaseExpiredError):
        lease.renew()
    assert table_rows(cstore.path) == before
    other = cstore.acquire_lease(session.id, workspace)
    with pytest.raises(LeaseLostError):
        lease.append_turn(_turn())
    other.replay()
    assert other.append_turn(_turn()).first_seq == 3


def test_renew_extends_expiry(cstore: MemoryStore, workspace: Path, clock: Clock) -> None:
    session, lease = _ready(cstore, workspace)
    ttl = cstore.settings.session_lease_ttl_s
    clock.now += ttl - 1
    assert lease.renew() == clock.now + ttl
    clock.now += ttl - 1
    assert lease.append_turn(_turn()).turn == 1
    with pytest.raises(InvalidInputError):
        lease.renew(ttl_s=-5)


def test_release_and_fail_are_durable_and_final(store: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(store, workspace)
    lease.fail("model crashed")
    with store.db.read() as conn:
        assert conn.execute("SELECT state, failure FROM session_leases").fetchall() == [("failed", "model crashed")]
    with pytest.raises(LeaseLostError):
        lease.append_turn(_turn())
    with pytest.raises(LeaseLostError):
        lease.release()
    with pytest.raises(InvalidInputError):
        store.acquire_lease(session.id, workspace).fail("  ")


def test_context_exit_releases(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn(_turn())
    assert store.acquire_lease(session.id, workspace).session_id == session.id


def test_garbage_collected_lease_releases(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    store.acquire_lease(session.id, workspace)  # dropped at once
    gc.collect()
    store.acquire_lease(session.id, workspace)


def test_drop_while_database_is_busy_returns_at_once_and_expiry_recovers(
    cstore: MemoryStore, workspace: Path, clock: Clock
) -> None:
    session, lease = _ready(cstore, workspace)
    blocker = apsw.Connection(str(cstore.path))
    blocker.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    lease.close()  # zero-wait: must not block on the writer
    took = time.monotonic() - started
    blocker.execute("ROLLBACK")
    # An observation, not a speed target: a drop that waited on the writer would take the whole busy timeout.
    assert took < cstore.settings.busy_timeout_ms / 1000 / 2, f"the drop waited {took:.2f} s on the writer"
    blocker.close()
    with pytest.raises(LeaseHeldError):
        cstore.acquire_lease(session.id, workspace)
    clock.now += cstore.settings.session_lease_ttl_s + 1
    cstore.acquire_lease(session.id, workspace)


def test_list_sessions_pages_with_stable_cursor(store: MemoryStore, workspace: Path) -> None:
    made = [store.create_session(workspace, title=f"s{i}") for i in range(7)]
    seen, cursor = [], None
    while True:
        page = store.list_sessions(cursor=cursor, limit=3)
        seen += [s.id for s in page.sessions]
        store.create_session(workspace, title="added while paging")  # newer: must not disturb the cursor
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [s.id for s in reversed(made)]


def test_list_sessions_of_one_workspace_pages_through_its_sessions_only(store: MemoryStore, workspace: Path,
                                                                        tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    mine = []
    for i in range(5):
        mine.append(store.create_session(workspace, title=f"mine {i}"))
        store.create_session(other, title=f"theirs {i}")
    seen, cursor = [], None
    while True:
        page = store.list_sessions(workspace=workspace, cursor=cursor, limit=2)
        seen += [s.id for s in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [s.id for s in reversed(mine)]
    unknown = tmp_path / "never-used"
    unknown.mkdir()
    assert store.list_sessions(workspace=unknown).sessions == []


def test_collection_limits_are_checked(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    with pytest.raises(InvalidInputError):
        store.list_sessions(limit=0)
    with pytest.raises(InvalidInputError):
        store.list_sessions(limit=store.settings.max_page_items + 1)
    with pytest.raises(InvalidInputError):
        store.list_sessions(cursor="garbage")
    with pytest.raises(InvalidInputError):
        store.replay(session.id, max_bytes=store.settings.max_event_bytes - 1)
    with pytest.raises(InvalidInputError):
        store.replay(session.id, -1)


def test_replay_pages_are_bounded_by_bytes(db_path: Path, tmp_path: Path, workspace: Path) -> None:
    settings = Settings(home=tmp_path / "h", max_event_bytes=1024, page_bytes=1024 * 1024)
    with MemoryStore.open_path(db_path, settings) as store:
        session, lease = _ready(store, workspace)
        for _ in range(10):
            lease.append_turn([NewEvent("user", "x" * 1000)])
        sizes, after = [], 0
        while True:
            page = store.replay(session.id, after, max_bytes=2500)
            assert sum(e.size for e in page.events) <= 2500
            sizes.append(len(page.events))
            after = page.next_cursor
            if page.done:
                break
        assert sizes == [2, 2, 2, 2, 2]


def test_session_pages_respect_their_byte_bound(store: MemoryStore, workspace: Path) -> None:
    for i in range(6):
        store.create_session(workspace, title="t" * 500)
    with pytest.raises(InvalidInputError):
        store.list_sessions(max_bytes=100)  # could not hold one Session
    seen, cursor = 0, None
    while True:
        page = store.list_sessions(cursor=cursor, max_bytes=8192)
        assert 1 <= len(page.sessions) <= 8192 // 700
        seen += len(page.sessions)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == 6


def test_a_busy_drop_leaves_explicit_release_possible(cstore: MemoryStore, workspace: Path) -> None:
    session, lease = _ready(cstore, workspace)
    blocker = apsw.Connection(str(cstore.path))
    blocker.execute("BEGIN IMMEDIATE")
    lease.close()
    blocker.execute("ROLLBACK")
    blocker.close()
    lease.release()  # still held in the database, so the durable release works
    cstore.acquire_lease(session.id, workspace)
