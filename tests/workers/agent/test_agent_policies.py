"""Turn policies: which one a Session runs (the one its snapshot records, or the one an older protocol implies), what
the open policy offers and forces, that no policy widens what a round may propose, and policies that plugins
register; over the scripted binding, the built-in tools and real workspaces in tmp_path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import SnapshotMismatchError
from emelex_workers.agent import protocol
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.policies import BUILTIN, GuidedPolicy, NarrowedPolicy, OpenPolicy, policy_for
from emelex_workers.agent.policies.guided import GuidedPolicyV1, GuidedPolicyV2
from emelex_workers.agent.session import AgentSession
from emelex_workers.agent.tools import RegisteredTool
from emelex_workers.host.policies import TurnPolicy, TurnState
from emelex_tools.plugin import tool_specs
from tests.support.agent import ScriptedBinding, answer, calls
from tests.workers.agent.test_agent_quotes import offered

BUILTIN_TOOLS = {s.name: RegisteredTool(s, "tools", "test") for s in tool_specs()}


def snapshot(**changes) -> SessionSnapshot:
    fields = dict(model_reference="scripted@sha256:" + "0" * 64, model_snapshot_id="0" * 64,
                  protocol=protocol.PROTOCOL_V3, template_digest="1" * 64, context_size=4096, temperature=0.0, seed=42,
                  round_tokens=256, chain_limit=4, calls_per_batch=2, system_prompt="You are a test agent.",
                  tools=tuple(t.authority() for t in BUILTIN_TOOLS.values()))
    return SessionSnapshot(**{**fields, **changes})


class Everything(TurnPolicy):
    """A careless policy: it offers every snapshot tool, enabled or not."""

    name = "everything"

    def offered(self, turn: TurnState):
        return list(turn.snapshot.tools)


def test_no_policy_gets_a_disabled_tool_offered(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    agent = AgentSession(ScriptedBinding([]), snapshot(), BUILTIN_TOOLS, policy=Everything())
    agent.add_user("go")
    assert set(offered(agent.round_schema(tmp_path))) == set(BUILTIN_TOOLS)
    agent.disable_tool("write_file")
    assert set(offered(agent.round_schema(tmp_path))) == set(BUILTIN_TOOLS) - {"write_file"}


def test_a_session_runs_the_policy_its_snapshot_records_or_the_one_its_protocol_implies() -> None:
    legacy = policy_for(snapshot())  # emelex-tools/3, made before policies: the guided rules of version 1
    assert isinstance(legacy, GuidedPolicyV1) and (legacy.version, legacy.grounded, legacy.finds_named) == (1, False,
                                                                                                        False)
    assert policy_for(snapshot(policy={"name": "guided", "version": 3})) is BUILTIN["guided"]
    v2 = policy_for(snapshot(policy={"name": "guided", "version": 2}))
    assert isinstance(v2, GuidedPolicyV2) and (v2.version, v2.finds_named, v2.follows) == (2, True, False)
    for older in (protocol.PROTOCOL_V1, protocol.PROTOCOL_V2):
        assert isinstance(policy_for(snapshot(protocol=older)), NarrowedPolicy)
    assert isinstance(policy_for(snapshot(protocol=protocol.PROTOCOL_V2, policy={"name": "open", "version": 1})),
                      OpenPolicy)
    with pytest.raises(SnapshotMismatchError, match="turn policy 'careful' version 1") as missing:
        policy_for(snapshot(policy={"name": "careful", "version": 1}))
    assert missing.value.field == "policy"
    with pytest.raises(SnapshotMismatchError, match="provides version 3") as newer:
        policy_for(snapshot(policy={"name": "guided", "version": 4}))
    assert newer.value.field == "policy.version"
    assert policy_for(snapshot(policy={"name": "everything", "version": 1}), {"everything": Everything()}).name == \
        "everything"


def test_a_recorded_policy_changes_the_digest_and_an_unrecorded_one_keeps_the_old_json() -> None:
    old = snapshot()
    assert "policy" not in old.to_json()
    recorded = snapshot(policy=GuidedPolicy().describe())
    assert recorded.digest != old.digest and SessionSnapshot.from_json(recorded.to_json()) == recorded
    assert old.differing_field(recorded) == "policy"
    assert recorded.differing_field(snapshot(policy={"name": "guided", "version": 1})) == "policy.version"
    assert snapshot(policy={"name": "guided", "version": 1}).field_value("policy.version") == 1
    with pytest.raises(Exception, match="snapshot policy"):
        snapshot(policy={"name": "Guided!", "version": 1})


def test_the_open_policy_offers_every_enabled_tool_as_its_schema_allows_and_a_free_answer(tmp_path: Path) -> None:
    (tmp_path / "config.ini").write_text("port = 8421\n")
    snap = snapshot(protocol=protocol.PROTOCOL_V2, policy=OpenPolicy().describe())
    agent = AgentSession(ScriptedBinding([]), snap, BUILTIN_TOOLS)
    for request in ("hi", "What port does config.ini set?", "Run the tests"):  # no rule reads the request
        agent.add_user(request)
        schema = agent.round_schema(tmp_path)
        tools = offered(schema)
        assert set(tools) == set(BUILTIN_TOOLS)
        assert all(tools[name] == BUILTIN_TOOLS[name].spec.input_schema for name in tools)  # not narrowed
        assert schema["anyOf"][0]["properties"]["answer"] == {"type": "string"}  # the model's own words
    agent.record(protocol.ProposedCall("read_file", {"path": "config.ini"}),
                 {"call_id": "1", "tool": "read_file", "outcome": "ok", "output": "port = 8421\n"})
    assert not agent.answered()  # a result that holds the answer forces nothing
    assert offered(agent.round_schema(tmp_path))["read_file"] == BUILTIN_TOOLS["read_file"].spec.input_schema
    assert agent.round_schema(tmp_path, "chain_limit")["properties"]["answer"] == {"type": "string"}


def test_an_open_turn_is_forced_to_answer_only_at_its_chain_limit(store: MemoryStore, workspace: Path,
                                                                   settings) -> None:
    (workspace / "a.txt").write_text("a\n")
    peek = calls(("read_file", {"path": "a.txt"}))
    binding = ScriptedBinding([peek, peek, peek, answer("It says a, as the three reads showed.")])
    tools = {name: BUILTIN_TOOLS[name] for name in ("read_file",)}
    snap = build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                          system_prompt="Test agent.", policy=OpenPolicy(), chain_limit=3)
    assert (snap.protocol, snap.policy, snap.round_tokens, snap.calls_per_batch) == \
        (protocol.PROTOCOL_V2, {"name": "open", "version": 1}, OpenPolicy.round_tokens, OpenPolicy.calls_per_batch)

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap)
        result = await agent.turn("What does a.txt say?")
        await agent.close()
        return result

    result = asyncio.run(main())
    # the repeats learned nothing: the narrowed policies force an answer after them, the open one reads on
    assert (result.outcome, result.rounds, result.forced) == ("answer", 4, "chain_limit")
    assert result.answer == "It says a, as the three reads showed."
    assert json.dumps(binding.rounds[3]["schema"]) == json.dumps({"type": "object", "properties": {
        "answer": {"type": "string"}}, "required": ["answer"], "additionalProperties": False})


def test_the_built_in_policies_are_named_and_versioned() -> None:
    assert set(BUILTIN) == {"guided", "open", "narrowed"}
    assert all(policy.name == name and policy.summary for name, policy in BUILTIN.items())
    assert {name: policy.version for name, policy in BUILTIN.items()} == {"guided": 3, "open": 1, "narrowed": 1}


def test_a_call_a_server_constrained_round_did_not_offer_is_refused_by_the_client(store: MemoryStore, workspace: Path,
                                                                                   settings) -> None:
    (workspace / "a.txt").write_text("a\n")
    tools = {"read_file": BUILTIN_TOOLS["read_file"]}
    outcomes = {}
    for remote in (False, True):
        binding = ScriptedBinding([calls(("read_file", {"path": "missing.txt"})), answer("none")])
        binding.remote_constraint = remote  # a server applied the round's grammar: it may not have honoured it
        snap = build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                              system_prompt="Test agent.", protocol=protocol.PROTOCOL_V2)

        async def main():
            agent = await DurableAgentSession.create(store, workspace, binding, tools, snap)
            await agent.turn("Read missing.txt")
            await agent.close()
            return [e.payload for e in store.replay(agent.session_id).events if e.kind == "tool_result"]

        (outcomes[remote],) = asyncio.run(main())
    assert binding.rounds[0]["schema"]["anyOf"][1]["properties"]["tool_calls"]["items"]["anyOf"][0]["properties"][
        "arguments"]["properties"]["path"] == {"type": "string", "enum": ["a.txt"]}  # the narrowed round
    assert outcomes[False]["output"] == "tool 'read_file' failed: WorkspacePathError: path 'missing.txt' does not exist " \
        "in the workspace"  # it ran
    assert outcomes[True] == {**outcomes[True], "outcome": "error",
                              "output": "not offered in this round: arguments.path must be one of a.txt"}
