"""Native tool calling of the served-model binding, against scripted servers on 127.0.0.1 that stream tool calls as
llama-server, vLLM and Ollama do (tests/support/tool_server.py): the probe that finds out whether a server calls tools
natively, a round's calls read back whatever the format (parallel ones included), and the round in the agent's union
form; and the grammar a llama.cpp server is sent when a round's quotes hold quotes or backslashes."""

from __future__ import annotations

import json
import threading

import pytest

from emelex_memory import ModelServerReplyError
from emelex_workers.agent.protocol import parse_round
from emelex_workers.host.gbnf import gbnf_literal
from emelex_workers.host.manager import bind_model, get_plugin_manager
from emelex_workers.settings import WorkerSettings
from tests.support.served import ScriptedServer, add_served
from tests.support.tool_server import FLAVOURS, ToolServer, text, text_then_calls, tool_calls

pytest.importorskip("httpx")

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "maxLength": 256}}, "required": ["path"],
    "additionalProperties": False}}}


@pytest.fixture
def settings(home) -> WorkerSettings:
    return WorkerSettings(home=home, plugins_autoload=False, served_read_timeout_s=5.0, served_retries=0)


def bound(settings: WorkerSettings, server: ScriptedServer):
    model = add_served(settings, f"m{id(server)}", server.url, server.model_id)
    return bind_model(get_plugin_manager(settings), model, settings)[1]


def round_of(binding, **more) -> tuple[str, str]:
    """One native round: its raw union text, and what it streamed."""
    streamed: list[str] = []
    raw = binding.stream_tool_round([{"role": "user", "content": "go"}], tools=[READ], tool_choice="auto",
                                    calls_per_batch=4, max_tokens=256, stop=threading.Event(),
                                    on_text=streamed.append, **more)
    return raw, "".join(streamed)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_probe_finds_out_whether_a_server_calls_tools_natively(settings, flavour) -> None:
    with ToolServer(flavour) as native, ToolServer(flavour, native=False) as plain:
        yes, no = bound(settings, native).tool_calling(), bound(settings, plain).tool_calling()
    assert yes.native and not no.native
    if flavour == "ollama":  # Ollama lists what a model can do: no generation needed
        assert (yes.detail, no.detail) == ("Ollama lists tools among the model's capabilities",
                                           "Ollama lists no tools in the model's capabilities")
        assert native.count("/v1/chat/completions") == plain.count("/v1/chat/completions") == 0
    else:
        assert yes.detail == "the server streamed a tool call for the probe"
        refusal = "tools param requires --jinja flag" if flavour == "llama-server" else '"auto" tool choice requires'
        assert no.detail.startswith("the server refused tools (HTTP ") and refusal in no.detail
        assert plain.count("/v1/chat/completions") == 1  # refused once: never retried


def test_a_server_that_answers_the_probe_in_text_does_not_call_tools_natively(settings) -> None:
    with ScriptedServer() as server:  # it ignores `tools` and says hello
        calling = bound(settings, server).tool_calling()
    assert (calling.native, calling.detail) == (False, "the server answered the probe in text")


def test_a_server_that_breaks_off_its_reply_to_tools_does_not_call_them_natively(settings) -> None:
    with ScriptedServer() as server:  # as llama-cpp-python's "chatml-function-calling" format does
        server.fail("/v1/chat/completions", ("drop", 1))
        calling = bound(settings, server).tool_calling()
    assert not calling.native and calling.detail.startswith("the server's reply to tools broke off (")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_round_of_calls_is_read_back_in_the_union_form_whatever_the_format(settings, flavour) -> None:
    with ToolServer(flavour, [tool_calls(("read_file", {"path": "a.txt"}), ("read_file", {"path": "b/c.md"})),
                              text_then_calls("Let me look.", ("read_file", {"path": "d.txt"})),
                              text("Both files say hello. The second one says it twice.")]) as server:
        binding = bound(settings, server)
        parallel, shown = round_of(binding)
        preamble, shown_too = round_of(binding)
        answer, said = round_of(binding)
    assert parse_round(parallel).calls == parse_round(shown).calls  # what streamed is the round
    assert [(c.tool, c.arguments) for c in parse_round(parallel).calls] == [("read_file", {"path": "a.txt"}),
                                                                             ("read_file", {"path": "b/c.md"})]
    assert [c.arguments for c in parse_round(preamble).calls] == [{"path": "d.txt"}]
    assert shown_too.startswith('{"answer":"Let me look."}{"tool_calls"')  # shown, then closed, then the calls
    assert answer == said and json.loads(said)["answer"] == \
        "Both files say hello. The second one says it twice."
    sent = server.chats[0]
    assert sent["tools"] == [READ] and sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is True
    assert "response_format" not in sent and "grammar" not in sent


def test_an_answer_cut_by_the_token_limit_stays_unclosed(settings) -> None:
    server = ToolServer("llama-server", [text("A long answer")])
    server._chunks = lambda reply, chunks=server._chunks: [  # noqa: E731 - the server says it hit its limit
        {**c, "choices": [{**c["choices"][0], "finish_reason": "length"}]} if c.get("choices") and
        c["choices"][0].get("finish_reason") else c for c in chunks(reply)]
    with server:
        raw, _ = round_of(bound(settings, server))
    assert raw == '{"answer":"A long answer'


def test_a_reply_that_is_no_tool_call_is_refused_with_a_typed_error(settings) -> None:
    with ToolServer("vllm") as server:
        server._reply = lambda body: [{"choices": [{"index": 0, "delta": {"tool_calls": "read_file"}}]}]
        with pytest.raises(ModelServerReplyError, match="streamed tool_calls that are not a list"):
            round_of(bound(settings, server))


@pytest.mark.parametrize("flavour", ["llama-server", "llama-cpp-python"])
def test_a_llama_cpp_server_gets_a_grammar_whose_literals_are_escaped(settings, flavour) -> None:
    quotes = ['quote.txt: version = "2.7.1"', "quote.txt: path = C:\\tmp", "plain"]
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": quotes}}, "required": ["answer"]}

    class Llama(ToolServer):
        def _routes(self, method, path, body):
            if flavour == "llama-cpp-python" and path == "/props":
                return None
            if flavour == "llama-cpp-python" and (method, path) == ("POST", "/extras/tokenize"):
                return {"tokens": [1]}
            return super()._routes(method, path, body)

        def _choose(self, body):
            constrained = "grammar" in body or "response_format" in body
            if constrained and "zq7" not in json.dumps(body):
                self.chats.append(body)
                return ("text", json.dumps({"answer": quotes[0]}), ())
            return super()._choose(body)

    with Llama("llama-server") as server:
        binding = bound(settings, server)
        out = binding.stream_chat([{"role": "user", "content": "x"}], max_tokens=64, json_schema=schema,
                                  stop=threading.Event())
        plain = binding.stream_chat([{"role": "user", "content": "x"}], max_tokens=64,
                                    json_schema={**schema, "properties": {"answer": {"type": "string",
                                                                                     "enum": ["plain"]}}},
                                    stop=threading.Event())
    assert json.loads(out) == {"answer": quotes[0]} and json.loads(plain) == {"answer": quotes[0]}
    escaped, unescaped = server.chats
    assert "response_format" not in escaped and "json_schema" not in escaped
    assert all(gbnf_literal(json.dumps(q, ensure_ascii=False)) in escaped["grammar"] for q in quotes)
    assert "grammar" not in unescaped  # nothing its own converter mis-escapes: the server's way



@pytest.mark.parametrize("status", [400, 500])
def test_a_grammar_or_schema_a_server_refuses_is_one_line_naming_it(settings, status) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["a"]}}, "required": ["answer"]}
    refusal = json.dumps({"error": {"code": status, "message": "JSON schema conversion failed: unsupported pattern",
                                    "type": "server_error"}}).encode()
    with ScriptedServer(reply=json.dumps({"answer": "a"})) as server:
        binding = bound(settings, server)
        binding.constraint()  # the server constrains output: its probe answered
        server.fail("/v1/chat/completions", ("reply", status, refusal, {}))
        with pytest.raises(ModelServerReplyError) as refused:
            binding.stream_chat([{"role": "user", "content": "x"}], max_tokens=8, json_schema=schema,
                                stop=threading.Event())
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"the server at {server.url} could not use the output grammar "
                                                      "of this request: ")
    assert "JSON schema conversion failed: unsupported pattern" in message
