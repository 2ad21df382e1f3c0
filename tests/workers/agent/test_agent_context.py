"""Context notes: recorded once, before a Session's first round, with its input; replayed, never re-gathered."""

from __future__ import annotations

import asyncio
import json

import pytest

from emelex_memory.agent import journal
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import InvalidInputError, SnapshotMismatchError
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from tests.support import agent as agent_support
from tests.support import table_rows
from tests.support.agent import ScriptedBinding, answer, calls


@pytest.fixture
def tools(settings, tmp_path, monkeypatch):
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(tmp_path / "effects.log")}))
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    return {name: tool for name, tool in registered_tools(pm).items() if name == "peek"}


def snap(binding, tools, context=("map", "notes")):
    return build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                          system_prompt="Test agent.", context=context)


class Sources:
    """Two sources that count their calls and say what they were asked; `text` changes what they return."""

    def __init__(self):
        self.asked: list = []
        self.text = "v1"

    def map(self, request):
        self.asked.append(("map", request.session_id, request.first_message, request.workspace))
        return {"text": f"Workspace map {self.text}", "entries": ["a.txt"]}

    def notes(self, request):
        self.asked.append(("notes", request.session_id, request.first_message, request.workspace))
        return {"text": f"Notes {self.text}"}

    def mapping(self):
        return {"map": self.map, "notes": self.notes}


def run(coro):
    return asyncio.run(coro)


def events(store, sid):
    return [(e.kind, e.payload, e.turn) for e in store.replay(sid).events]


def test_the_first_turn_records_each_note_before_its_input_in_one_turn(store, workspace, tools):
    sources = Sources()
    binding = ScriptedBinding([answer("one"), answer("two")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools),
                                                 context_sources=sources.mapping())
        first = await agent.turn("hello")
        second = await agent.turn("again")
        await agent.close()
        return agent, first, second

    agent, first, second = run(main())
    sid = agent.session_id
    recorded = events(store, sid)
    assert [k for k, _, _ in recorded[:3]] == ["context", "context", "user"]
    assert recorded[0][1] == {"text": "Workspace map v1", "entries": ["a.txt"], "source": "map"}
    assert recorded[1][1] == {"text": "Notes v1", "source": "notes"}
    assert len({turn for _, _, turn in recorded[:3]}) == 1  # one transaction: one turn
    assert [a[:3] for a in sources.asked] == [("map", sid, "hello"), ("notes", sid, "hello")]  # once, not again
    assert first.context == (recorded[0][1], recorded[1][1]) and second.context == ()
    assert agent.context == first.context
    shown = binding.rounds[0]["messages"]
    assert shown[1:4] == [{"role": "system", "content": "Workspace map v1"}, {"role": "system", "content": "Notes v1"},
                          {"role": "user", "content": "hello"}]
    # the journal's open-turn row pointed at the user event, not at a note
    turn_failed_free = [k for k, _, _ in recorded]
    assert turn_failed_free.count("user") == 2 and "turn_failed" not in turn_failed_free


def test_resume_replays_the_notes_byte_identically_and_never_asks_a_source_again(store, workspace, tools):
    sources = Sources()
    binding = ScriptedBinding([calls(("peek", {"label": "x"})), answer("one")])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools),
                                                 context_sources=sources.mapping())
        await agent.turn("hello")
        await agent.close()
        return agent.session_id, list(agent.agent.messages)

    sid, live = run(first())
    sources.text = "v2"  # what a source would say now differs
    sources.asked.clear()
    second = ScriptedBinding([answer("two")])

    async def again():
        agent = await DurableAgentSession.resume(store, sid, workspace, second, tools, snap(second, tools),
                                                 context_sources=sources.mapping())
        replayed = list(agent.agent.messages)
        context = agent.context
        await agent.turn("again")
        await agent.close()
        return replayed, context

    replayed, context = run(again())
    assert json.dumps(replayed) == json.dumps(live)
    assert [p["text"] for p in context] == ["Workspace map v1", "Notes v1"]
    assert sources.asked == []
    assert "v2" not in json.dumps(second.rounds[0]["messages"])


def test_a_resume_of_a_session_without_events_records_the_notes_at_its_first_turn(store, workspace, tools):
    sources = Sources()
    binding = ScriptedBinding([answer("one")])

    async def create_only():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools),
                                                 context_sources=sources.mapping())
        await agent.close()
        return agent.session_id

    sid = run(create_only())
    assert events(store, sid) == [] and sources.asked == []
    with pytest.raises(SnapshotMismatchError, match="context source 'map'"):
        run(DurableAgentSession.resume(store, sid, workspace, binding, tools, snap(binding, tools)))

    async def resume():
        agent = await DurableAgentSession.resume(store, sid, workspace, binding, tools, snap(binding, tools),
                                                 context_sources=sources.mapping())
        await agent.turn("hello")
        await agent.close()

    run(resume())
    assert [k for k, _, _ in events(store, sid)][:3] == ["context", "context", "user"]


def test_a_missing_source_refuses_create_and_creates_nothing(store, workspace, tools, db_path):
    binding = ScriptedBinding([])
    before = table_rows(db_path)
    with pytest.raises(SnapshotMismatchError, match="context source 'notes'") as raised:
        run(DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools),
                                       context_sources={"map": Sources().map}))
    assert raised.value.field == "context"
    assert table_rows(db_path) == before


@pytest.mark.parametrize("failure", ["raises", "no text"])
def test_a_failing_source_writes_nothing_and_leaves_the_adapter_usable(store, workspace, tools, failure):
    sources = Sources()
    attempts = []

    def bad(request):
        attempts.append(request.first_message)
        if len(attempts) == 1:
            if failure == "raises":
                raise RuntimeError("the source broke")
            return {"entries": []}
        return {"text": "fine now"}

    binding = ScriptedBinding([answer("one")])
    expected = RuntimeError if failure == "raises" else InvalidInputError

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools),
                                                 context_sources={"map": sources.map, "notes": bad})
        with pytest.raises(expected):
            await agent.turn("hello")
        assert events(store, agent.session_id) == []
        assert journal.read_journal(store, agent.session_id) is None
        assert not agent.poisoned
        result = await agent.turn("hello again")
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert result.outcome == "answer" and attempts == ["hello", "hello again"]
    assert [p["text"] for p in result.context] == ["Workspace map v1", "fine now"]


def test_a_source_that_returns_none_records_nothing(store, workspace, tools):
    binding = ScriptedBinding([answer("one")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools, ("map",)),
                                                 context_sources={"map": lambda request: None})
        result = await agent.turn("hello")
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert result.context == () and [k for k, _, _ in events(store, agent.session_id)][0] == "user"


def test_the_snapshot_records_its_context_and_an_empty_one_keeps_the_old_json(tools):
    binding = ScriptedBinding([])
    plain = snap(binding, tools, ())
    assert "context" not in plain.to_json()  # a snapshot made before the field existed keeps its digest
    with_context = snap(binding, tools, ("map", "notes"))
    assert with_context.to_json()["context"] == ["map", "notes"]
    assert SessionSnapshot.from_json(json.loads(with_context.canonical_json())) == with_context
    assert SessionSnapshot.from_json(json.loads(plain.canonical_json())) == plain
    assert with_context.differing_field(plain) == "context"
    for bad in (("Map",), ("map", "map"), ("",), "map"):
        with pytest.raises(InvalidInputError, match="context"):
            snap(binding, tools, bad)
