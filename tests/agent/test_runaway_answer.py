"""A runaway repetition inside a string of a round (an answer, a tool's argument) ends the round there (through the
round's stop event), the user's own stop still interrupts, and a round that fails to parse blames the token limit
only when it used every token."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_workers.agent import protocol
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.errors import RoundOutputError
from emelex_workers.agent.protocol import ProposedCall, open_string, runaway_at
from emelex_workers.agent.session import AgentSession
from emelex_workers.plugin_api import GenerationInterrupted

from ..support.agent import LABEL_SCHEMA, PIECE, ScriptedBinding, answer, calls

LOOP = "The port is 8080. " * 12


PEEK = ToolAuthority("peek", "Look at a label.", LABEL_SCHEMA, "never", "agenttest", "0.1.0")


def snapshot(round_tokens: int = 256, tools=()) -> SessionSnapshot:
    return SessionSnapshot("scripted@sha256:" + "0" * 64, "0" * 64, protocol.PROTOCOL_VERSION, "1" * 64, 4096, 0.0,
                           42, round_tokens, 4, 2, "You are a test agent.", tools)


@pytest.mark.parametrize("text, kept", [
    ("The port is 8080. The port is 8080. The port is 8080. The", "The port is 8080. "),
    ("ha" * 15, "haha"),
    ("The output of the output of the output of the output of t", "The output of the"),
    ("config.ini sets port to 8080 for the server. config.ini sets port to 8080 for the server. ",
     "config.ini sets port to 8080 for the server. "),
    ("1. notes.txt is here\n2. notes.txt is here\n3. notes.txt is here\n", "1. notes.txt is here\n"),
])
def test_a_repeated_unit_or_line_is_a_runaway_and_the_first_copy_is_kept(text: str, kept: str) -> None:
    assert text[:runaway_at(text)] == kept


@pytest.mark.parametrize("text", [
    "The files are a.txt, b.txt and c.txt.", "-" * 29, "a\nb\na\nb\n", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
    "notes.txt has 3 lines.\nREADME.md has 3 lines.\n", "ok ok", "size: 10\nsize: 20\n",
])
def test_ordinary_answers_are_no_runaway(text: str) -> None:
    assert runaway_at(text) is None


def test_the_open_string_is_decoded_with_where_each_character_starts_and_what_closes_it() -> None:
    inside = open_string('{"answer": "a\\nb\\u00')
    assert (inside.text, inside.offsets, inside.closers) == ("a\nb", (12, 13, 15, 16), "}")
    inside = open_string('{"tool_calls":[{"name":"w","arguments":{"content":"x y')
    assert inside.text == "x y" and inside.closers == "}}]}"
    assert open_string('{"answer": "done"}') is None and open_string('{"tool_calls": [') is None


def test_an_answer_that_loops_is_ended_at_the_repetition() -> None:
    binding = ScriptedBinding([answer(LOOP)])
    seen: list[str] = []
    out = AgentSession(binding, snapshot(), {}).generate_round(stop=threading.Event(), on_token=seen.append)
    assert out.answer == "The port is 8080." and out.stopped == "repetition" and out.calls == ()
    assert len("".join(seen)) < len(LOOP) // 2  # generation stopped, not merely trimmed afterwards
    assert out.raw == '{"answer":"The port is 8080."}'


def test_a_tool_argument_that_loops_is_ended_at_the_repetition_and_closed() -> None:
    label = "ab" + "xyz " * 15
    binding = ScriptedBinding([calls(("peek", {"label": label}))])
    seen: list[str] = []
    out = AgentSession(binding, snapshot(tools=(PEEK,)), {}).generate_round(stop=threading.Event(),
                                                                           on_token=seen.append)
    assert out.calls == (ProposedCall("peek", {"label": "abxyz"}),) and out.stopped == "repetition"
    assert len("".join(seen)) < len(json.dumps(calls(("peek", {"label": label})), separators=(",", ":")))
    assert out.raw == '{"tool_calls":[{"name":"peek","arguments":{"label":"abxyz"}}]}'


def test_the_users_stop_still_interrupts_a_looping_answer() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(GenerationInterrupted):
        AgentSession(ScriptedBinding([answer(LOOP)]), snapshot(), {}).generate_round(stop=stop)


def test_a_turn_records_the_answer_before_its_repetition(store, workspace) -> None:
    binding = ScriptedBinding([answer(LOOP)])
    made = build_snapshot(binding, {}, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.")

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, {}, made)
        result = await agent.turn("port?")
        await agent.close()
        return agent.session_id, result

    session, result = asyncio.run(main())
    assert result.outcome == "answer" and result.answer == "The port is 8080."
    texts = [e.payload["text"] for e in store.replay(session).events if e.kind == "assistant"]
    assert texts == ["The port is 8080."]


@pytest.mark.parametrize("round_tokens, blamed", [(4, True), (256, False)])
def test_a_cut_round_blames_the_token_limit_only_when_it_used_every_token(round_tokens: int, blamed: bool) -> None:
    raw = '{"answer": "cut'  # 15 characters: 4 scripted tokens
    assert -(-len(raw) // PIECE) == 4
    with pytest.raises(RoundOutputError) as info:
        AgentSession(ScriptedBinding([raw]), snapshot(round_tokens), {}).generate_round(stop=threading.Event())
    assert ("cut by the token limit: all 4 tokens" in str(info.value)) is blamed
    assert ("stops unfinished at char 15, before the token limit" in str(info.value)) is not blamed
