"""Session and job IDs by unique prefix, as git takes commits."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from emelex_memory import (
    AmbiguousIdError,
    JobNotFoundError,
    MemoryStore,
    SessionNotFoundError,
    register_job_kind,
)
from emelex_memory.id_prefix import MAX_ID_CANDIDATES

register_job_kind("noop")


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch):
    """Make `uuid.uuid4()` return the given IDs, in order, so that tests can build ambiguous prefixes."""
    queue: list[str] = []
    real = uuid.uuid4
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(queue.pop(0)) if queue else real())
    return queue


def _sessions(store: MemoryStore, workspace: Path, ids: list[str], fixed_ids: list[str]) -> None:
    fixed_ids.extend(ids)
    for _ in ids:
        store.create_session(workspace)


A = "abcd1111-0000-4000-8000-000000000000"
B = "abcd2222-0000-4000-8000-000000000000"
C = "abce0000-0000-4000-8000-000000000000"


def test_a_unique_prefix_resolves_to_the_full_id(store: MemoryStore, workspace: Path, fixed_ids: list[str]) -> None:
    _sessions(store, workspace, [A, B, C], fixed_ids)
    assert store.resolve_session_id(A) == A
    assert store.resolve_session_id("abcd1") == A
    assert store.resolve_session_id("ABCD2") == B  # IDs are lowercase hex: any case matches
    assert store.resolve_session_id("abce") == C


def test_an_ambiguous_prefix_lists_the_candidates(store: MemoryStore, workspace: Path, fixed_ids: list[str]) -> None:
    _sessions(store, workspace, [A, B], fixed_ids)
    with pytest.raises(AmbiguousIdError, match=f"'abcd' is ambiguous: it matches {A}, {B}; give more characters"):
        store.resolve_session_id("abcd")


def test_at_most_ten_candidates_are_listed(store: MemoryStore, workspace: Path, fixed_ids: list[str]) -> None:
    ids = [f"feed{i:04x}-0000-4000-8000-000000000000" for i in range(MAX_ID_CANDIDATES + 2)]
    _sessions(store, workspace, ids, fixed_ids)
    with pytest.raises(AmbiguousIdError) as raised:
        store.resolve_session_id("feed")
    message = str(raised.value)
    assert all(i in message for i in ids[:MAX_ID_CANDIDATES]) and ids[MAX_ID_CANDIDATES] not in message
    assert ", ...;" in message and message.count("\n") == 0


def test_a_short_or_unknown_prefix_is_refused(store: MemoryStore, workspace: Path, fixed_ids: list[str]) -> None:
    _sessions(store, workspace, [A], fixed_ids)
    with pytest.raises(AmbiguousIdError, match="'abc' is too short: give at least 4 characters"):
        store.resolve_session_id("abc")
    with pytest.raises(SessionNotFoundError, match="no Session 'abcf'"):
        store.resolve_session_id("abcf")
    with pytest.raises(SessionNotFoundError):
        store.resolve_session_id("x" * 64)


def test_job_ids_resolve_the_same_way(store: MemoryStore, workspace: Path, fixed_ids: list[str]) -> None:
    _sessions(store, workspace, [A], fixed_ids)
    fixed_ids.extend([B, C])
    first = store.enqueue_job("noop", A, {"n": 1}).job
    second = store.enqueue_job("noop", A, {"n": 2}).job
    assert (first.id, second.id) == (B, C)
    assert store.resolve_job_id("abcd") == B and store.resolve_job_id("ABCE0") == C
    with pytest.raises(JobNotFoundError, match="no job 'abcf'; list them with `emelex memory jobs list`"):
        store.resolve_job_id("abcf")


def test_resolution_is_one_range_read_of_the_unique_index(store: MemoryStore) -> None:
    with store._read() as conn:
        for table in ("sessions", "jobs"):
            plan = " ".join(r[3] for r in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT uuid FROM {table} WHERE uuid >= ? AND uuid < ? ORDER BY uuid LIMIT 11",
                ("abcd", "abce")))
            assert f"USING COVERING INDEX sqlite_autoindex_{table}_1 (uuid>? AND uuid<?)" in plan, plan
