"""Session and job IDs by unique prefix, as git takes commits: in the library and through every CLI command."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    AmbiguousIdError,
    JobNotFoundError,
    MemoryStore,
    NewEvent,
    SessionNotFoundError,
    Settings,
)
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.core.id_prefix import MAX_ID_CANDIDATES
from emelex_workers.cli import app

from ..support import kinds_fixture, table_rows

KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)


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
    with store.db.read() as conn:
        for table in ("sessions", "jobs"):
            plan = " ".join(r[3] for r in conn.execute(
                f"EXPLAIN QUERY PLAN SELECT uuid FROM {table} WHERE uuid >= ? AND uuid < ? ORDER BY uuid LIMIT 11",
                ("abcd", "abce")))
            assert f"USING COVERING INDEX sqlite_autoindex_{table}_1 (uuid>? AND uuid<?)" in plan, plan


# -- through the CLI -----------------------------------------------------------------------------------------------


@pytest.fixture
def cli_store(home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, fixed_ids: list[str]):
    """Home (via EMELEX_HOME) with Sessions A and B (ambiguous as "abcd") and C, each with one turn, and a noop job
    on C whose ID is the unique "feed" prefix."""
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(Settings(), kinds=KINDS) as store:
        _sessions(store, workspace, [A, B, C], fixed_ids)
        for sid in (A, B, C):
            with store.acquire_lease(sid, workspace) as lease:
                lease.replay()
                lease.append_turn([NewEvent("user", {"text": f"hello {sid[:4]}"}), NewEvent("assistant", "hi")])
        fixed_ids.append("feed0000-0000-4000-8000-000000000000")
        store.enqueue_job("noop", C, {"n": 1})
    return home


def mem(*args: str):
    return CliRunner().invoke(app, ["memory", *args])


def test_every_command_taking_a_session_accepts_a_unique_prefix(cli_store: Path) -> None:
    shown = json.loads(mem("sessions", "show", "abce", "--json").output)
    assert shown["session"]["id"] == C and shown["outcome"] == "found"
    listed = json.loads(mem("jobs", "list", "--session", "ABCE", "--json").output)
    assert [j["session_id"] for j in listed["jobs"]] == [C]
    plan = ["--context-window", "1000", "--preserve-turns", "0", "--force", "--json"]
    compacted = json.loads(mem("compact", "abcd1", *plan).output)
    assert compacted["job"]["session_id"] == A and compacted["outcome"] == "queued"
    deleted = mem("sessions", "delete", "abcd2", "--yes")
    assert deleted.exit_code == 0 and deleted.output.startswith(f"deleted Session {B}:")


def test_every_command_taking_a_job_accepts_a_unique_prefix(cli_store: Path) -> None:
    cancelled = mem("jobs", "cancel", "feed")
    assert cancelled.exit_code == 0 and cancelled.output == "job feed0000-0000-4000-8000-000000000000 cancelled\n"
    retried = json.loads(mem("jobs", "retry", "FEED0", "--json").output)
    assert retried["outcome"] == "retried" and retried["state"] == "pending"


@pytest.mark.parametrize("args", [
    ["sessions", "show", "abcd"],
    ["sessions", "delete", "abcd", "--yes"],
    ["compact", "abcd", "--context-window", "100", "--force"],
    ["jobs", "list", "--session", "abcd"],
])
def test_an_ambiguous_prefix_is_one_line_listing_the_candidates_and_changes_nothing(cli_store: Path, args) -> None:
    before = table_rows(cli_store / "memory" / "emelex.sqlite3")
    result = mem(*args)
    assert result.exit_code == 1
    assert result.output == f"error: Session ID prefix 'abcd' is ambiguous: it matches {A}, {B}; give more characters\n"
    assert table_rows(cli_store / "memory" / "emelex.sqlite3") == before


def test_a_too_short_prefix_says_how_long_it_must_be(cli_store: Path) -> None:
    for args in (["sessions", "show", "abc"], ["jobs", "cancel", "fee"]):
        result = mem(*args)
        assert result.exit_code == 1 and "is too short: give at least 4 characters" in result.output, args
        assert result.output.count("\n") == 1
