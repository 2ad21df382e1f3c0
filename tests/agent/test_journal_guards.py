"""The core enforces the journal's discipline for every host built on it: no plain append and no
`finish_session` while an agent turn is open, and no call completes as having run unless it started."""

from __future__ import annotations

import pytest

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.agent import journal as j
from emelex_memory.errors import JournalStateError, OpenJournalError
from ..support.agent_engine import leased_session
from ..support import table_rows


def test_a_plain_append_is_refused_while_an_agent_turn_is_open(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "do it")
    before = table_rows(db_path)
    with pytest.raises(OpenJournalError, match="open agent turn"):
        lease.append_turn([NewEvent("assistant", {"text": "slipped in"})])
    assert table_rows(db_path) == before
    j.close_failed(store, lease, "error", "closed")
    lease.append_turn([NewEvent("user", {"text": "after the turn closed"})])  # allowed again


def test_finish_session_is_refused_while_an_agent_turn_is_open(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "do it")
    before = table_rows(db_path)
    with pytest.raises(OpenJournalError, match="cannot be finished"):
        store.finish_session(lease)
    assert table_rows(db_path) == before  # nothing queued, the lease still held
    assert store.list_jobs().jobs == []
    lease.release()


def test_a_call_that_never_started_cannot_complete_as_run(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "do it")
    j.plan_batch(store, lease, 1, "{}", [("c1", "effect", {"path": "a"}), ("c2", "effect", {"path": "b"})])
    before = table_rows(db_path)
    with pytest.raises(JournalStateError, match="never started"):
        j.complete_call(store, lease, "c1", {"call_id": "c1", "tool": "effect", "outcome": "ok", "output": "done"})
    assert table_rows(db_path) == before
    j.complete_call(store, lease, "c1", {"call_id": "c1", "tool": "effect", "outcome": "denied",
                                         "output": "the user denied this call"})  # never ran: allowed
    j.start_call(store, lease, "c2")
    j.complete_call(store, lease, "c2", {"call_id": "c2", "tool": "effect", "outcome": "ok", "output": "done"})
    assert [c.state for c in j.read_journal(store, session.id).calls] == ["completed", "completed"]
