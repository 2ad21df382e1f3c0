"""The tool-call protocol: the union schema over the enabled tools, parsing rounds, the gate, replayed history."""

from __future__ import annotations

import json
import threading

import pytest

from emelex_memory import Event
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_workers.agent import protocol
from emelex_workers.agent.errors import RoundOutputError, UnknownToolError
from emelex_workers.agent.protocol import ProposedCall, gate, history_messages, parse_round, union_schema
from emelex_workers.agent.schema import check_schema, validate
from emelex_workers.agent.session import AgentSession

from ...support.agent import LABEL_SCHEMA, ScriptedBinding, answer, calls

TOOLS = tuple(ToolAuthority(name, f"{name} things.", LABEL_SCHEMA, approval, "agenttest", "0.1.0")
              for name, approval in (("effect", "always"), ("peek", "never")))


def snapshot(tools=TOOLS) -> SessionSnapshot:
    return SessionSnapshot("scripted@sha256:" + "0" * 64, "0" * 64, protocol.PROTOCOL_VERSION, "1" * 64, 4096, 0.0, 42,
                           256, 4, 2, "You are a test agent.", tools)


def event(seq: int, kind: str, payload) -> Event:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return Event((seq, seq, seq, 0, kind, text, len(text), 0, 0.0, None))


def call_names(schema: dict) -> set[str]:
    batch = schema["anyOf"][1]["properties"]["tool_calls"]
    return {option["properties"]["name"]["const"] for option in batch["items"]["anyOf"]}


def test_the_union_schema_offers_an_answer_or_bounded_calls_to_each_tool() -> None:
    schema = union_schema(TOOLS, 3)
    assert check_schema({"type": "object", "properties": {"x": schema}}) is None  # within the enforced subset
    assert call_names(schema) == {"effect", "peek"}
    assert schema["anyOf"][1]["properties"]["tool_calls"]["maxItems"] == 3
    assert validate({"answer": "hi"}, schema) is None
    assert validate({"tool_calls": [{"name": "peek", "arguments": {"label": "a"}}]}, schema) is None
    assert validate({"tool_calls": [{"name": "peek", "arguments": {"label": "a" * 65}}]}, schema) is not None
    assert validate({"tool_calls": [{"name": "nope", "arguments": {"label": "a"}}]}, schema) is not None
    assert validate({"tool_calls": []}, schema) is not None
    assert union_schema((), 1)["properties"]["answer"]["maxLength"] == protocol.MAX_ANSWER_CHARS


def test_parse_round_reads_both_forms_and_refuses_anything_else() -> None:
    assert parse_round('{"answer": "hi"}').answer == "hi"
    out = parse_round(json.dumps(calls(("effect", {"label": "a"}), ("peek", {"label": "b"}))))
    assert out.answer is None and out.calls == (ProposedCall("effect", {"label": "a"}), ProposedCall("peek", {"label": "b"}))
    for raw in ['{"answer": "cut', '{"answer": 3}', '{"tool_calls": []}', '[]', '{"answer": "a", "x": 1}',
                '{"tool_calls": [{"name": "effect"}]}', "x" * 5000]:
        with pytest.raises(RoundOutputError) as info:
            parse_round(raw)
        assert len(str(info.value)) < 500


def test_the_gate_refuses_unknown_disabled_and_invalid_calls() -> None:
    snap = snapshot()
    everything = frozenset({"effect", "peek"})
    assert gate(ProposedCall("effect", {"label": "a"}), snap, everything) is None
    assert "no tool named" in gate(ProposedCall("rm_rf", {}), snap, everything)
    assert "disabled" in gate(ProposedCall("effect", {"label": "a"}), snap, frozenset({"peek"}))
    assert "invalid arguments" in gate(ProposedCall("effect", {"label": 7}), snap, everything)
    assert "unknown field" in gate(ProposedCall("effect", {"label": "a", "x": 1}), snap, everything)
    assert "missing" in gate(ProposedCall("effect", {}), snap, everything)


def test_a_disabled_tool_is_absent_from_the_grammar_and_rejected_by_the_gate() -> None:
    binding = ScriptedBinding([calls(("effect", {"label": "a"}))])
    agent = AgentSession(binding, snapshot(), {})
    agent.disable_tool("effect")
    out = agent.generate_round(stop=threading.Event())
    assert call_names(binding.rounds[0]["schema"]) == {"peek"}
    assert "disabled now" in binding.rounds[0]["messages"][-1]["content"]
    assert "disabled" in agent.gate(out.calls[0])
    agent.enable_tool("effect")
    assert agent.gate(out.calls[0]) is None
    with pytest.raises(UnknownToolError):
        agent.disable_tool("not_a_snapshot_tool")
    assert agent.enabled_tools == {"effect", "peek"}


def test_history_renders_a_summary_calls_results_and_failures_as_plain_text() -> None:
    events = [
        event(1, "summary", {"text": "The user likes tea."}),
        event(2, "user", {"text": "label it"}),
        event(3, "tool_calls", {"round": 1, "calls": [{"call_id": "c1", "tool": "effect", "arguments": {"label": "a"}},
                                                      {"call_id": "c2", "tool": "peek", "arguments": {"label": "b"}}]}),
        event(4, "tool_result", {"call_id": "c1", "tool": "effect", "outcome": "ok", "output": "did a"}),
        event(5, "tool_result", {"call_id": "c2", "tool": "peek", "outcome": "unknown_effect",
                                 "output": "this call may have run"}),
        event(6, "assistant", {"text": "done"}),
        event(7, "audit", {"event": "answer", "rounds": 2, "calls": 2, "model": "m"}),
        event(8, "user", {"text": "again"}),
        event(9, "turn_failed", {"reason": "interrupted", "diagnostic": "stopped by the user"}),
    ]
    agent = AgentSession(ScriptedBinding([]), snapshot(), {})
    agent.disable_tool("effect")
    agent.load_history(events)
    roles = [m["role"] for m in agent.messages]
    assert roles == ["system", "system", "user", "assistant", "user", "assistant", "user", "system"]
    text = "\n".join(m["content"] for m in agent.messages)
    assert "The user likes tea." in agent.messages[1]["content"]
    assert json.loads(agent.messages[3]["content"])["tool_calls"][0]["name"] == "effect"  # a disabled tool still renders
    assert 'Result of effect {"label": "a"} (ok): did a' in agent.messages[4]["content"]
    assert "unknown_effect" in agent.messages[4]["content"]
    assert json.loads(agent.messages[5]["content"]) == {"answer": "done"}
    assert "interrupted" in agent.messages[7]["content"] and "audit" not in text
    assert all(isinstance(m["content"], str) for m in agent.messages)
    assert history_messages(snapshot(), [])[0]["content"].startswith("You are a test agent.")


def test_generation_stops_between_tokens_when_the_stop_event_is_set() -> None:
    from emelex_workers.plugin_api import GenerationInterrupted

    stop = threading.Event()
    agent = AgentSession(ScriptedBinding([answer("a long answer " * 5)]), snapshot(), {})
    seen: list[str] = []

    def on_token(piece: str) -> None:
        seen.append(piece)
        if len(seen) == 2:
            stop.set()

    with pytest.raises(GenerationInterrupted):
        agent.generate_round(stop=stop, on_token=on_token)
    assert len(seen) == 2
