"""`store.select_recall`: pinned notes first, then relevant ones, within the budget; never a tombstone nor raw
tool-call JSON; its payload names each note's key, version and source, and replays unchanged whatever changes after,
and each Knowledge note comes with the turn of its source, read in the selection's one read."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory.search.service import day
from emelex_memory import InvalidInputError, MemoryStore, NewEvent

from ..support.counting import Counted
from .test_search_index import say


def keys(selection) -> list[str]:
    return [n["key"] for n in selection.notes if n["kind"] == "knowledge"]


def test_pinned_first_then_relevant_then_nothing_unrelated(store: MemoryStore, workspace: Path) -> None:
    store.remember(workspace, "style", "Use tabs in the Makefile")
    store.pin(workspace, "style")
    store.remember(workspace, "parser", "The parser lives in src/parser.py", confidence=0.9)
    store.remember(workspace, "parser.errors", "The parser never raises on bad input", confidence=0.5)
    for n in range(20):
        store.remember(workspace, f"weather.{n}", f"It rained on day {n} and the wind was strong, how annoying")
    selection = store.select_recall(workspace, "Where is the parser?", 1000)
    assert keys(selection) == ["style", "parser", "parser.errors"]
    assert keys(store.select_recall(workspace, "Hello! How are you on this fine day?", 1000)) == ["style"]


def test_the_budget_is_kept_and_a_note_too_large_is_skipped_for_a_smaller_one(store: MemoryStore,
                                                                              workspace: Path) -> None:
    store.remember(workspace, "big", "parser " * 200)  # about 350 tokens
    store.remember(workspace, "small", "the parser is small")
    selection = store.select_recall(workspace, "parser", 50)
    assert keys(selection) == ["small"]
    assert selection.tokens <= 50 and selection.budget_tokens == 50
    counted = store.select_recall(workspace, "parser", 3, count_tokens=lambda text: 1)
    assert len(counted.notes) == 2 and counted.tokens == 2


def test_tombstones_and_raw_tool_call_json_are_never_selected(store: MemoryStore, workspace: Path) -> None:
    store.remember(workspace, "pinned.json", '{"call_id": "c1", "tool": "read_file", "arguments": {"path": "x"}}')
    store.pin(workspace, "pinned.json")
    store.remember(workspace, "list.json", '[{"tool": "shell", "output": "parser ok"}]')
    store.remember(workspace, "cut.json", '{"tool": "shell", "output": "parser')
    store.remember(workspace, "forgotten", "the parser was rewritten")
    store.forget(workspace, "forgotten")
    store.remember(workspace, "fact", "the parser has {braces} in its grammar")
    assert keys(store.select_recall(workspace, "parser tool shell", 1000)) == ["fact"]


def test_the_payload_names_key_version_and_source_and_replays_unchanged(store: MemoryStore, workspace: Path) -> None:
    sid = say(store, workspace, "we deploy with make release", "noted")
    source = store.knowledge_source(sid, 1, 2)
    store.remember(workspace, "deploy", "deploy with make release", confidence=0.8, source=source)
    store.remember(workspace, "deploy", "deploy with make release; tag first", confidence=0.8, source=source)
    with Counted(store) as counts:
        selection = store.select_recall(workspace, "deploy with make release", 1000)
    assert (counts.writes, counts.reads) == (0, 1)  # one read transaction, the sources' turns included
    assert [t for n, t in zip(selection.notes, selection.source_turns) if n["kind"] == "knowledge"] == [1]
    (note,) = [n for n in selection.payload()["notes"] if n["kind"] == "knowledge"]
    turns = [n for n in selection.payload()["notes"] if n["kind"] == "session"]
    assert note == {
        "kind": "knowledge", "key": "deploy", "version": 2, "content": "deploy with make release; tag first",
        "confidence": 0.8, "pinned": False, "date": day(store.get_session(sid).created_at),
        "source": {"session": sid, "first_seq": 1, "last_seq": 2, "digest": source.digest},
    }
    assert [(t["kind"], t["session"], t["seq"], t["content"]) for t in turns] == [
        ("session", sid, 1, "we deploy with make release")]
    new = store.create_session(workspace).id
    with store.acquire_lease(new, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("recall", selection.payload()), NewEvent("user", {"text": "how do we deploy"})])
        lease.release()
    store.remember(workspace, "deploy", "deploy with the pipeline now")
    store.forget(workspace, "deploy")
    (recorded, _) = store.replay(new).events
    assert (recorded.kind, recorded.payload) == ("recall", selection.payload())
    assert store.search(workspace, "tag", kinds="sessions").hits == []  # a recall event is not indexed again


def test_no_known_workspace_or_no_words_still_gives_a_selection(store: MemoryStore, workspace: Path,
                                                                tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    assert store.select_recall(stranger, "anything", 100).notes == ()
    store.remember(workspace, "pinned", "always here")
    store.pin(workspace, "pinned")
    store.remember(workspace, "other", "only when asked")
    for query in ("", "***", "x" * 10_000, "\x00"):
        assert keys(store.select_recall(workspace, query, 100)) == ["pinned"]


@pytest.mark.parametrize("budget", [0, -1, 1_000_001, 2.5, True, None])
def test_a_bad_budget_is_refused(store: MemoryStore, workspace: Path, budget) -> None:
    with pytest.raises(InvalidInputError):
        store.select_recall(workspace, "x", budget)


def test_a_query_that_is_not_text_is_refused(store: MemoryStore, workspace: Path) -> None:
    with pytest.raises(InvalidInputError):
        store.select_recall(workspace, b"x", 10)
