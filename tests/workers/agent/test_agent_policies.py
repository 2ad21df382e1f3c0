"""Turn policies: which one a Session runs (the one its snapshot records, or the one an older protocol implies), what
the open policy offers and forces, that no policy widens what a round may propose, and policies that plugins
register; over the scripted binding, the built-in tools and real workspaces in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import SnapshotMismatchError
from emelex_workers.agent import protocol
from emelex_workers.agent.policies import GuidedPolicy, NarrowedPolicy, policy_for
from emelex_workers.agent.session import AgentSession
from emelex_workers.agent.tools import RegisteredTool
from emelex_workers.host.policies import TurnPolicy, TurnState
from emelex_tools.plugin import tool_specs
from tests.support.agent import ScriptedBinding

BUILTIN_TOOLS = {s.name: RegisteredTool(s, "tools", "test") for s in tool_specs()}


def snapshot(**changes) -> SessionSnapshot:
    fields = dict(model_reference="scripted@sha256:" + "0" * 64, model_snapshot_id="0" * 64,
                  protocol=protocol.PROTOCOL_V3, template_digest="1" * 64, context_size=4096, temperature=0.0, seed=42,
                  round_tokens=256, chain_limit=4, calls_per_batch=2, system_prompt="You are a test agent.",
                  tools=tuple(t.authority() for t in BUILTIN_TOOLS.values()))
    return SessionSnapshot(**{**fields, **changes})


def offered(schema: dict) -> dict[str, dict]:
    """The arguments schema of each tool a round offers, by name."""
    batch = schema["anyOf"][1] if "anyOf" in schema else schema if "tool_calls" in schema["properties"] else None
    if batch is None:
        return {}
    return {o["properties"]["name"]["const"]: o["properties"]["arguments"]
            for o in batch["properties"]["tool_calls"]["items"]["anyOf"]}


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
    assert isinstance(policy_for(snapshot()), GuidedPolicy)  # emelex-tools/3, made before policies
    for older in (protocol.PROTOCOL_V1, protocol.PROTOCOL_V2):
        assert isinstance(policy_for(snapshot(protocol=older)), NarrowedPolicy)
    with pytest.raises(SnapshotMismatchError, match="turn policy 'careful' version 1") as missing:
        policy_for(snapshot(policy={"name": "careful", "version": 1}))
    assert missing.value.field == "policy"
    with pytest.raises(SnapshotMismatchError, match="provides version 1") as newer:
        policy_for(snapshot(policy={"name": "guided", "version": 2}))
    assert newer.value.field == "policy.version"
    assert policy_for(snapshot(policy={"name": "everything", "version": 1}), {"everything": Everything()}).name == \
        "everything"


def test_a_recorded_policy_changes_the_digest_and_an_unrecorded_one_keeps_the_old_json() -> None:
    old = snapshot()
    assert "policy" not in old.to_json()
    recorded = snapshot(policy=GuidedPolicy().describe())
    assert recorded.digest != old.digest and SessionSnapshot.from_json(recorded.to_json()) == recorded
    assert old.differing_field(recorded) == "policy"
    assert recorded.differing_field(snapshot(policy={"name": "guided", "version": 2})) == "policy.version"
    assert snapshot(policy={"name": "guided", "version": 2}).field_value("policy.version") == 2
    with pytest.raises(Exception, match="snapshot policy"):
        snapshot(policy={"name": "Guided!", "version": 1})
