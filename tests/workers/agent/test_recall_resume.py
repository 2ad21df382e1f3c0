"""Recall on the durable adapter (scripted binding, real store): the first turn records the recalled notes before
the input, the model sees them as one labelled system message, and a resumed Session's model messages are
byte-identical to what it saw before, however Knowledge changed in between: resume replays, never selects again."""

from __future__ import annotations

import asyncio
import json

from emelex_memory.search.service import day
from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.recall import NOTES_LABEL, recall_source
from tests.support.agent import ScriptedBinding, answer


def snapshot_of(binding):
    return build_snapshot(binding, {}, model_reference="test/scripted", model_snapshot_id="s" * 64,
                          system_prompt="Test agent.", context=("recall",))


def test_a_resumed_session_sees_byte_identical_messages_after_knowledge_changed(store: MemoryStore,
                                                                                workspace) -> None:
    store.remember(workspace, "style", "Use tabs in the Makefile")
    store.pin(workspace, "style")
    store.remember(workspace, "deploy", "We deploy with make release")
    store.remember(workspace, "weather", "It rained on Tuesday")
    selections = []
    select = recall_source(100)

    def source(request):
        selections.append(request.first_message)
        return select(request)

    first = ScriptedBinding([answer("with make release")])

    async def before():
        agent = await DurableAgentSession.create(store, workspace, first, {}, snapshot_of(first),
                                                 context_sources={"recall": source})
        result = await agent.turn("How do we deploy?")
        history = json.dumps(agent.agent.messages)
        await agent.close()
        return agent.session_id, result, history

    session_id, result, history = asyncio.run(before())
    (seen,) = first.rounds
    system, notes, user = seen["messages"]
    deploy_day, style_day = (day(store.get_knowledge(workspace, key).head.said_at) for key in ("deploy", "style"))
    assert notes == {"role": "system", "content": f"{NOTES_LABEL}\n- [{style_day}] style: Use tabs in the Makefile\n"
                                                  f"- [{deploy_day}] deploy: We deploy with make release"}
    assert user == {"role": "user", "content": "How do we deploy?"}
    assert [n["key"] for n in result.context[0]["notes"]] == ["style", "deploy"]
    assert [e.kind for e in store.replay(session_id).events][:2] == ["context", "user"]

    store.remember(workspace, "deploy", "We deploy with the pipeline now")  # a new version
    store.unpin(workspace, "style")
    store.forget(workspace, "style")  # a tombstone
    store.remember(workspace, "deploy.pinned", "Deploys need a signed tag")
    store.pin(workspace, "deploy.pinned")  # a new pinned entry
    second = ScriptedBinding([answer("still make release")])

    async def after():
        agent = await DurableAgentSession.resume(store, session_id, workspace, second, {}, snapshot_of(second),
                                                 context_sources={"recall": source})
        replayed = json.dumps(agent.agent.messages)
        context = agent.context
        result = await agent.turn("And then?")
        await agent.close()
        return replayed, context, result

    replayed, context, resumed = asyncio.run(after())
    assert replayed == history  # byte-identical
    (round_,) = second.rounds
    assert json.dumps(round_["messages"][:-1]) == history
    assert round_["messages"][-1] == {"role": "user", "content": "And then?"}
    assert selections == ["How do we deploy?"]  # selected once, at the first turn; never on resume
    assert context == result.context and resumed.context == ()
    assert [e.kind for e in store.replay(session_id).events].count("context") == 1
