"""Protocol "emelex-tools/2": the system message's worked example (a tool round, then an answer), an older Session
keeping its own "emelex-tools/1" rendering, and a round that fails to parse saying honestly why."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from emelex_memory import Event
from emelex_memory.agent import journal
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_workers.agent import protocol
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.errors import RoundOutputError
from emelex_workers.agent.protocol import history_messages, parse_round, system_message, union_schema
from emelex_workers.agent.schema import validate
from emelex_workers.cli.chat import _resumed_snapshot

from ..support.agent import ScriptedBinding, answer

PATH = {"type": "string", "maxLength": 256, "description": "relative to the workspace"}
READ = ToolAuthority("read_file", "Read a text file in the workspace.",
                     {"type": "object", "properties": {"path": PATH}, "required": ["path"],
                      "additionalProperties": False}, "never", "tools", "1.0")
LABEL = ToolAuthority("peek", "Look at a label.",
                      {"type": "object", "properties": {"label": {"type": "string", "maxLength": 64}},
                       "required": ["label"], "additionalProperties": False}, "never", "agenttest", "0.1.0")

V1_TEXT = (
    "You are a test agent.\n\n"
    'Reply with JSON only, in one of two forms: {"answer": "<your reply to the user>"} when you can answer, or '
    '{"tool_calls": [{"name": "<tool>", "arguments": {...}}]} to call 1 to 2 tools; their results come back in the '
    "next message.\nTools:\n"
    '- peek: Look at a label. Arguments: {"additionalProperties":false,"properties":{"label":{"maxLength":64,'
    '"type":"string"}},"required":["label"],"type":"object"}'
)


def snapshot(protocol_version: str = protocol.PROTOCOL_VERSION, tools=(READ, LABEL)) -> SessionSnapshot:
    return SessionSnapshot("scripted@sha256:" + "0" * 64, "0" * 64, protocol_version, "1" * 64, 4096, 0.0, 42, 256,
                           4, 2, "You are a test agent.", tools)


def example_rounds(text: str) -> list[str]:
    """The assistant lines of the system message's example, as the model would write them."""
    return [line.removeprefix("assistant: ") for line in text.splitlines() if line.startswith("assistant: ")]


def test_the_protocol_is_version_3_and_renders_every_earlier_one() -> None:
    assert protocol.PROTOCOL_VERSION == "emelex-tools/3"
    assert protocol.PROTOCOLS == ("emelex-tools/1", "emelex-tools/2", "emelex-tools/3", "openai-tools/1")


def test_the_system_message_shows_a_worked_tool_round_and_an_answer_valid_under_the_grammar() -> None:
    snap = snapshot()
    text = system_message(snap)
    call_round, answer_round = example_rounds(text)
    schema = union_schema(snap.tools, snap.calls_per_batch)
    assert validate(json.loads(call_round), schema) is None and validate(json.loads(answer_round), schema) is None
    assert parse_round(call_round).calls == (protocol.ProposedCall("read_file", {"path": "config.ini"}),)
    assert "8080" in parse_round(answer_round).answer
    assert 'user: Result of read_file {"path": "config.ini"} (ok): [server]\nport = 8080' in text  # as results are
    assert call_round.startswith('{"tool_calls":[{"name":"read_file"')  # the order the grammar generates
    assert "- read_file: Read a text file in the workspace. Arguments: path (string, relative to the workspace)" in text


def test_without_the_example_tool_the_example_is_an_answer_alone() -> None:
    snap = snapshot(tools=(LABEL,))
    (answer_round,) = example_rounds(system_message(snap))
    assert validate(json.loads(answer_round), union_schema(snap.tools, 2)) is None
    assert "tool_calls\":[{" not in system_message(snap).split("Example:")[1]


def test_a_version_1_snapshot_keeps_the_version_1_system_message() -> None:
    assert system_message(snapshot(protocol.PROTOCOL_V1, tools=(LABEL,))) == V1_TEXT
    assert system_message(snapshot(protocol.PROTOCOL_V1, tools=())) == (
        'You are a test agent.\n\nReply with JSON only: {"answer": "<your reply to the user>"}.')
    assert "Example:" not in system_message(snapshot(protocol.PROTOCOL_V1))
    assert system_message(snapshot()) != system_message(snapshot(protocol.PROTOCOL_V1))


def test_a_result_is_named_by_its_calls_arguments_and_version_1_keeps_the_call_id() -> None:
    events = [Event((1, 1, 1, 0, "tool_calls", json.dumps({"round": 1, "calls": [
                  {"call_id": "c1", "tool": "peek", "arguments": {"label": "a"}}]}), 0, 0, 0.0, None)),
              Event((2, 2, 1, 0, "tool_result", json.dumps({"call_id": "c1", "tool": "peek", "outcome": "ok",
                                                            "output": "peeked a"}), 0, 0, 0.0, None))]
    assert history_messages(snapshot(), events)[-1]["content"] == 'Result of peek {"label": "a"} (ok): peeked a'
    v1 = history_messages(snapshot(protocol.PROTOCOL_V1), events)
    assert v1[-1]["content"] == "Result of peek (c1, ok): peeked a"


def test_a_raw_newline_inside_a_string_reads_as_a_newline() -> None:
    assert parse_round('{"answer": "two\nlines"}').answer == "two\nlines"
    out = parse_round('{"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "x\n\ty"}}]}')
    assert out.calls[0].arguments["content"] == "x\n\ty"


@pytest.mark.parametrize("raw, limit, why", [
    ('{"answer": "cut', 12, "cut by the token limit: all 12 tokens of the round were used"),
    ('{"answer": "cut', None, "its JSON stops unfinished at char 15, before the token limit"),
    ('{"answer": "hi"', None, "its JSON stops unfinished at char 15"),
    ('{"answer": "hi"} and more', None, "text follows the complete JSON object at char 17"),
    ('{"answer": "hi" "x"}', 256, "invalid JSON at char 16: Expecting ',' delimiter"),
    ('{"answer": "a\\q"}', None, "invalid JSON at char 13: Invalid \\escape"),
])
def test_a_round_that_is_not_json_says_what_is_wrong_and_where(raw: str, limit: int | None, why: str) -> None:
    with pytest.raises(RoundOutputError) as info:
        parse_round(raw, token_limit=limit)
    assert why in str(info.value)
    if limit is None or "cut by" not in why:
        assert "cut by the token limit" not in str(info.value)


def test_a_resumed_version_1_session_resumes_with_its_own_snapshot_and_renders_version_1(store, workspace) -> None:
    binding = ScriptedBinding([answer("first"), answer("second")])
    old = build_snapshot(binding, {}, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.",
                         protocol=protocol.PROTOCOL_V1)

    async def made() -> str:
        agent = await DurableAgentSession.create(store, workspace, binding, {}, old)
        assert (await agent.turn("hello")).outcome == "answer"
        await agent.close()
        return agent.session_id

    async def resumed(session: str) -> tuple[SessionSnapshot, str]:
        stored = journal.stored_snapshot(store, session)
        again = _resumed_snapshot(stored, binding, {}, SimpleNamespace(reference="t/m"))
        agent = await DurableAgentSession.resume(store, session, workspace, binding, {}, again)
        result = await agent.turn("again")
        await agent.close()
        return again, result.answer

    session = asyncio.run(made())
    again, text = asyncio.run(resumed(session))
    assert again == old and again.protocol == "emelex-tools/1" and text == "second"
    seen = binding.rounds[-1]["messages"]
    assert seen[0]["content"] == 'T.\n\nReply with JSON only: {"answer": "<your reply to the user>"}.'
    assert [m["content"] for m in seen[1:]] == ["hello", '{"answer":"first"}', "again"]
    with pytest.raises(ValueError):
        build_snapshot(binding, {}, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.",
                       protocol="emelex-tools/0")
