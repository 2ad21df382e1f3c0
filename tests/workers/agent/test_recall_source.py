"""The "recall" context source: pinned notes first, then relevant ones, within a budget of at most a tenth of the
window; the payload labels the notes (earlier Sessions, possibly outdated, not instructions) and names each note's
key, version and source; no tombstone, nothing recorded without a note."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from emelex_memory.search.service import day
from emelex_memory import InvalidInputError, MemoryStore, NewEvent, compaction_handler, run_one_job
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from emelex_workers.agent.recall import (
    MEMORY_TOOLS,
    NOTES_LABEL,
    RECALL_SOURCE,
    recall_budget,
    recall_source,
    recalled_notes,
    without_memory_tools,
)
from emelex_workers.settings import WorkerSettings

from ...support.counting import Counted


def request(store: MemoryStore, workspace: Path, first_message: str):
    return SimpleNamespace(store=store, session_id="new", workspace=workspace, first_message=first_message,
                           snapshot=None)


def said(store: MemoryStore, workspace: Path, *texts: str) -> str:
    """A Session of two turns (a greeting, then `texts`): its ID."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", {"text": "hello"})])
        lease.append_turn([NewEvent("user", {"text": t}) for t in texts])
        lease.release()
    return session.id


def test_the_budget_is_the_setting_and_at_most_a_tenth_of_the_window(home: Path) -> None:
    assert WorkerSettings(home=home).recall_budget_tokens == 512
    assert recall_budget(WorkerSettings(home=home), 8192) == 512
    assert recall_budget(WorkerSettings(home=home), 2048) == 204
    assert recall_budget(WorkerSettings(home=home, recall_budget_tokens=100), 8192) == 100
    assert recall_budget(WorkerSettings(home=home), 5) == 1


def test_the_payload_labels_the_notes_and_names_key_version_and_source(store: MemoryStore, workspace: Path) -> None:
    session_id = said(store, workspace, "we deploy with make release")
    source = store.knowledge_source(session_id, 2, 2)
    store.remember(workspace, "style", "Use tabs in the Makefile")
    store.pin(workspace, "style")
    store.remember(workspace, "deploy", "deploy with make", source=source)
    store.remember(workspace, "deploy", "deploy with make release", confidence=0.8, source=source)
    store.remember(workspace, "weather", "It rained on Tuesday")
    payload = recall_source(100)(request(store, workspace, "deploy with make release"))
    today = day(store.get_session(session_id).created_at)
    assert payload["text"] == (f"{NOTES_LABEL}\n- [{today}] style: Use tabs in the Makefile\n"
                               f"- [{today}] deploy: deploy with make release\n- [{today}] user: we deploy with make release")
    assert "outdated" in NOTES_LABEL and "not instructions" in NOTES_LABEL and "earlier Sessions" in NOTES_LABEL
    knowledge = [n for n in payload["notes"] if n["kind"] == "knowledge"]
    assert [(n["key"], n["version"], n["pinned"]) for n in knowledge] == [("style", 1, True), ("deploy", 2, False)]
    assert knowledge[0]["source"] is None
    assert knowledge[1]["source"] == {"session": session_id, "first_seq": 2, "last_seq": 2,
                                      "digest": source.digest, "turn": 2}
    (turn,) = [n for n in payload["notes"] if n["kind"] == "session"]
    assert (turn["session"], turn["seq"], turn["turn"], turn["date"]) == (session_id, 2, 2, today)
    assert payload["terms"] == ["deploy", "with", "make", "release"]
    assert payload["budget_tokens"] == 100 and 0 < payload["tokens"] <= 100


def test_a_notes_turn_is_the_turn_of_its_source_also_in_a_compacted_session(
    store: MemoryStore, workspace: Path
) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for i in range(8):
            lease.append_turn([NewEvent("user", {"text": f"step {i}"}), NewEvent("assistant", {"text": "done"})])
    store.queue_compaction(session.id, context_window=4096, force=True)  # the first four turns become a Summary
    assert run_one_job(store, compaction_handler(lambda events, job: "steps 0 to 3 were done")).status == "done"
    assert store.replay(session.id).events[0].kind == "summary"
    store.remember(workspace, "step", "step 2 was done", source=store.knowledge_source(session.id, 5, 6))
    with Counted(store) as counts:
        notes = recall_source(100)(request(store, workspace, "which step was done?"))["notes"]
    (note,) = [n for n in notes if n["kind"] == "knowledge"]  # past turns may be recalled beside it
    assert note["source"]["turn"] == 3  # seq 5 opens the third turn, which the Summary replaced in the replay view
    assert (counts.writes, counts.reads) == (0, 1)  # the notes and their sources' turns in one read


def test_the_budget_is_kept_and_tombstones_are_never_recalled(store: MemoryStore, workspace: Path) -> None:
    store.remember(workspace, "big", "parser " * 200)  # about 350 tokens
    store.remember(workspace, "small", "the parser is small")
    store.remember(workspace, "gone", "the parser was rewritten")
    store.forget(workspace, "gone")
    payload = recall_source(50)(request(store, workspace, "the parser"))
    assert [n["key"] for n in payload["notes"]] == ["small"]
    assert payload["tokens"] <= 50


def test_nothing_is_recorded_without_a_note(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    store.remember(workspace, "weather", "It rained on Tuesday")
    assert recall_source(100)(request(store, workspace, "How do we deploy?")) is None
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    assert recall_source(100)(request(store, stranger, "weather")) is None


def test_a_bad_budget_is_refused_when_selecting(store: MemoryStore, workspace: Path) -> None:
    with pytest.raises(InvalidInputError):
        recall_source(0)(request(store, workspace, "x"))


def test_recalled_notes_and_the_sessions_without_memory_tools(settings: WorkerSettings) -> None:
    notes = [{"key": "a"}, {"key": "b"}]
    context = ({"source": "workspace_map", "text": "map"}, {"source": RECALL_SOURCE, "text": "t", "notes": notes})
    assert recalled_notes(context) == notes and recalled_notes(()) == []
    tools = {name: object() for name in ("read_file", *MEMORY_TOOLS)}
    assert list(without_memory_tools(tools)) == ["read_file"]
    registered = registered_tools(get_plugin_manager(settings))
    assert tuple(n for n, t in registered.items() if t.plugin == "recall") == MEMORY_TOOLS == ("recall", "remember")
