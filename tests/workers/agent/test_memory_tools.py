"""The built-in memory tools on a durable Session (scripted binding, real store): `recall` runs without approval and
cites what it finds in the workspace's Knowledge and other Sessions; `remember` asks first, writes one entry whose
provenance is the calling turn, and refuses what distillation's guard refuses (typed error, nothing changed)."""

from __future__ import annotations

import datetime as dt

import asyncio
import json

import pytest

from emelex_memory import InvalidKnowledgeError, KnowledgePinnedError, MemoryStore, NewEvent
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from emelex_tools.memory import remember_in_turn
from tests.support import table_rows
from tests.support.agent import ScriptedBinding, answer, calls


@pytest.fixture
def tools(settings):
    """The memory tools as the built-in "recall" plugin registers them."""
    found = registered_tools(get_plugin_manager(settings))
    assert (found["recall"].plugin, found["recall"].spec.approval) == ("recall", "never")
    assert (found["remember"].plugin, found["remember"].spec.approval) == ("recall", "always")
    return {name: found[name] for name in ("recall", "remember")}


async def approve_all(call, tool):
    return "approve"


def chat_turn(store: MemoryStore, workspace, tools, text: str, *script, approve=approve_all, first: str = ""):
    """One turn of a new Session over `script` (after a turn `first` answered by the script's first output, when
    given); the Session ID, the turn's result and the tool results."""
    binding = ScriptedBinding(list(script))
    snapshot = build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                              system_prompt="Test agent.")

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot)
        if first:
            await agent.turn(first)
        result = await agent.turn(text, approve=approve)
        await agent.close()
        return agent.session_id, result

    session_id, result = asyncio.run(main())
    results = [e.payload for e in store.replay(session_id).events if e.kind == "tool_result"]
    return session_id, result, results


def earlier_session(store: MemoryStore, workspace, *texts: str) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", {"text": t}) for t in texts])
        lease.release()
    return session.id


def test_recall_cites_knowledge_and_other_sessions_without_asking(store: MemoryStore, workspace, tools) -> None:
    store.remember(workspace, "deploy", "We deploy with make release")
    earlier = earlier_session(store, workspace, "the release needs a signed tag")
    asked = []
    _, result, (found,) = chat_turn(store, workspace, tools, "how do we release?",
                                    calls(("recall", {"query": "release"})), answer("with make release"),
                                    approve=lambda call, tool: asked.append(call) or "deny")
    assert result.outcome == "answer" and asked == []
    assert found["outcome"] == "ok"
    lines = sorted(found["output"].splitlines())  # one ranking: either may come first
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    assert lines[0] == f"knowledge deploy (version 1, {today}): We deploy with make [release]"
    assert lines[1] == f"session {earlier[:8]} seq 1 turn 1 (user, {today}): the [release] needs a signed tag"
    assert len(lines) == 2  # the calling Session's own "how do we release?" is left out


def test_recall_never_finds_a_tombstone_and_a_query_without_words_is_an_error(store: MemoryStore, workspace,
                                                                              tools) -> None:
    store.remember(workspace, "old", "the release used a shell script")
    store.forget(workspace, "old")
    _, _, (none, bad) = chat_turn(store, workspace, tools, "hi", calls(("recall", {"query": "script"})),
                                  calls(("recall", {"query": "***"})), answer("ok"))
    assert none == {**none, "outcome": "ok", "output": "nothing in this workspace's memory matches 'script'"}
    assert bad["outcome"] == "error" and "no word to search for" in bad["output"]


def test_remember_writes_one_entry_with_the_turns_provenance(store: MemoryStore, workspace, tools) -> None:
    text = "Remember this: our releases are signed with the team key."
    arguments = {"key": "release.signing", "content": "releases are signed with the team key", "confidence": 0.9}
    session_id, result, (done,) = chat_turn(store, workspace, tools, text, answer("hello"),
                                            calls(("remember", arguments)), answer("noted"), first="hi")
    assert result.outcome == "answer" and done["outcome"] == "ok"
    assert done["output"] == "remembered release.signing (version 1)"
    entry = store.get_knowledge(workspace, "release.signing")
    assert (entry.content, entry.confidence, entry.head.origin) == (arguments["content"], 0.9, "user")
    user_seq = [e.seq for e in store.replay(session_id).events if e.kind == "user"][1]
    assert user_seq > 1
    source = entry.head.source
    assert (source.session_id, source.first_seq) == (session_id, user_seq)
    assert source.last_seq == user_seq  # the turn so far: its user input (the batch is published after the call)
    assert source == store.knowledge_source(session_id, user_seq, source.last_seq)


def test_remember_is_denied_without_approval(store: MemoryStore, workspace, tools) -> None:
    _, _, (denied,) = chat_turn(store, workspace, tools, "releases are signed with the team key",
                                calls(("remember", {"key": "k", "content": "releases are signed with the team key"})),
                                answer("ok"), approve=lambda call, tool: "deny")
    assert denied["outcome"] == "denied"
    assert store.recall(workspace).entries == []


@pytest.mark.parametrize("content, confidence, reason", [
    ('{"tool": "run_command", "output": "ok"}', 1.0, "tool-call JSON"),
    ("releases", 1.0, "fewer than two content words"),
    ("the moon is made of green cheese", 1.0, "do not support"),
    ("releases are signed with the team key", 1.5, "not a number from 0 to 1"),
])
def test_remember_refuses_what_distillation_refuses_and_changes_nothing(store: MemoryStore, workspace, tools,
                                                                        db_path, content, confidence,
                                                                        reason) -> None:
    _, _, (refused,) = chat_turn(
        store, workspace, tools, "our releases are signed with the team key",
        calls(("remember", {"key": "release", "content": content, "confidence": confidence})), answer("ok"))
    assert refused["outcome"] == "error" and reason in refused["output"]
    assert store.recall(workspace).entries == []
    said = earlier_session(store, workspace, "our releases are signed with the team key")
    before = table_rows(db_path)
    with pytest.raises(InvalidKnowledgeError, match=reason):
        remember_in_turn(store, workspace, said, 1, "release", content, confidence)
    assert table_rows(db_path) == before


def test_remember_never_changes_a_pinned_entry(store: MemoryStore, workspace, tools, db_path) -> None:
    store.remember(workspace, "release", "releases are tagged by hand")
    store.pin(workspace, "release")
    _, _, (refused,) = chat_turn(
        store, workspace, tools, "our releases are signed with the team key",
        calls(("remember", {"key": "release", "content": "releases are signed with the team key"})), answer("ok"))
    assert refused["outcome"] == "error" and "is pinned" in refused["output"]
    said = earlier_session(store, workspace, "our releases are signed with the team key")
    before = table_rows(db_path)
    with pytest.raises(KnowledgePinnedError):
        remember_in_turn(store, workspace, said, 1, "release", "releases are signed with the team key")
    assert table_rows(db_path) == before
    assert store.get_knowledge(workspace, "release").content == "releases are tagged by hand"


def test_the_memory_tools_refuse_an_invocation_without_a_session(tmp_path) -> None:
    from emelex_tools.memory import run_recall, run_remember
    from emelex_workers.plugin_api import ToolInvocation

    for run, args in ((run_recall, {"query": "x"}), (run_remember, {"key": "k", "content": "c"})):
        output = run(ToolInvocation("c1", run.__name__[4:], args, tmp_path))
        assert output.is_error and "needs a durable agent Session" in json.dumps(output.text)
