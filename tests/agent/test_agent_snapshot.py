"""Execution snapshots: canonical digests, the differing field, creation only for an empty Session, fail-closed."""

from __future__ import annotations

import json

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent.journal import record_snapshot, require_snapshot, stored_snapshot
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import (
    InvalidInputError,
    SessionNotEmptyError,
    SnapshotMismatchError,
    SnapshotMissingError,
)
from emelex_memory.sessions.transcript import NewEvent
from ..support.agent_engine import SCHEMA, authority, leased_session, snapshot
from ..support import table_rows


def test_digest_is_stable_under_key_order_and_tool_order():
    reordered_schema = json.loads(json.dumps({"required": ["path"], "properties": SCHEMA["properties"], "type": "object"}))
    a = snapshot()
    b = snapshot(tools=(authority("read_file", input_schema=reordered_schema), authority("effect")))
    assert list(reordered_schema) != list(SCHEMA)
    assert a.canonical_json() == b.canonical_json()
    assert a.digest == b.digest
    assert a.differing_field(b) is None


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"model_reference": "other/model"}, "model_reference"),
        ({"model_snapshot_id": "c" * 64}, "model_snapshot_id"),
        ({"protocol": "emelex-tools/2"}, "protocol"),
        ({"template_digest": "d" * 64}, "template_digest"),
        ({"context_size": 4096}, "context_size"),
        ({"temperature": 0.3}, "temperature"),
        ({"seed": 8}, "seed"),
        ({"round_tokens": 128}, "round_tokens"),
        ({"chain_limit": 5}, "chain_limit"),
        ({"calls_per_batch": 3}, "calls_per_batch"),
        ({"system_prompt": "You are another test."}, "system_prompt"),
        ({"tools": (authority("effect"),)}, "tools[read_file]"),
        ({"tools": (authority("effect"), authority("read_file"), authority("zap"))}, "tools[zap]"),
        ({"tools": (authority("effect", description="x"), authority("read_file"))}, "tools[effect].description"),
        ({"tools": (authority("effect", approval="always"), authority("read_file"))}, "tools[effect].approval"),
        ({"tools": (authority("effect", plugin="p2"), authority("read_file"))}, "tools[effect].plugin"),
        ({"tools": (authority("effect", plugin_version="1.1"), authority("read_file"))},
         "tools[effect].plugin_version"),
        ({"tools": (authority("effect", input_schema={**SCHEMA, "properties": {"path": {"type": "integer", "maxLength": 64}}}),
                    authority("read_file"))}, "tools[effect].input_schema.properties.path.type"),
    ],
)
def test_any_field_changes_the_digest_and_is_named(changes, field):
    a, b = snapshot(), snapshot(**changes)
    assert a.digest != b.digest
    assert a.differing_field(b) == field


def test_round_trips_through_json():
    a = snapshot()
    assert SessionSnapshot.from_json(json.loads(a.canonical_json())) == a


def test_invalid_snapshots_are_refused():
    with pytest.raises(InvalidInputError):
        snapshot(tools=(authority("effect"), authority("effect")))
    with pytest.raises(InvalidInputError):
        authority(approval="sometimes")
    with pytest.raises(InvalidInputError):
        snapshot(temperature=float("nan"))
    with pytest.raises(InvalidInputError):
        snapshot(chain_limit=0)


def test_snapshot_is_stored_outside_the_transcript(store: MemoryStore, workspace):
    session, lease = leased_session(store, workspace)
    assert stored_snapshot(store, session.id) == snapshot()
    assert store.get_session(session.id).last_seq == 0  # no transcript event holds it


def test_snapshot_only_for_an_empty_session(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    with pytest.raises(SessionNotEmptyError):
        record_snapshot(store, lease, snapshot(seed=1))  # already has one
    other = store.create_session(workspace)
    with store.acquire_lease(other.id, workspace) as second:
        list(second.replay_all())
        second.append_turn([NewEvent("user", {"text": "hi"})])
        before = table_rows(db_path)
        with pytest.raises(SessionNotEmptyError):
            record_snapshot(store, second, snapshot())
        assert table_rows(db_path) == before


def test_resume_requires_the_identical_snapshot_and_names_the_field(store: MemoryStore, workspace, db_path):
    session, lease = leased_session(store, workspace)
    require_snapshot(store, lease, snapshot())  # identical: fine
    before = table_rows(db_path)
    with pytest.raises(SnapshotMismatchError, match=r"tools\[effect\]\.description") as info:
        require_snapshot(store, lease, snapshot(tools=(authority("effect", description="new"), authority("read_file"))))
    assert info.value.field == "tools[effect].description"
    assert table_rows(db_path) == before


def test_history_without_a_snapshot_fails_closed(store: MemoryStore, workspace, db_path):
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([NewEvent("user", {"text": "plain library history"})])
        before = table_rows(db_path)
        with pytest.raises(SnapshotMissingError):
            require_snapshot(store, lease, snapshot())
        assert table_rows(db_path) == before


def test_an_empty_session_without_a_snapshot_gets_one_on_resume(store: MemoryStore, workspace):
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        require_snapshot(store, lease, snapshot())
    assert stored_snapshot(store, session.id) == snapshot()


def test_snapshots_are_immutable(store: MemoryStore, workspace):
    import apsw
    session, lease = leased_session(store, workspace)
    with pytest.raises(apsw.ConstraintError):
        with store.db.write() as conn:
            conn.execute("UPDATE session_snapshots SET digest = ?", ("0" * 64,))
    assert stored_snapshot(store, session.id) == snapshot()
