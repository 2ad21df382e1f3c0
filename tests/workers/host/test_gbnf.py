"""`schema_to_gbnf`, the grammar a served llama.cpp server is sent instead of a schema its converter would mis-escape:
on the real llama.cpp, every round's schema becomes a grammar that parses (literals holding quotes, backslashes, line
ends and non-ASCII letters included), and generation under it gives only values the schema admits."""

from __future__ import annotations

import json

import pytest

from emelex_tools.plugin import tool_specs
from emelex_workers.agent.protocol import union_schema
from emelex_workers.agent.schema import validate
from emelex_workers.agent.tools import RegisteredTool
from emelex_workers.agent.workspace import narrow_path
from emelex_workers.host.gbnf import gbnf_literal, needs_escaped_literals, schema_to_gbnf
from emelex_workers.host.policies import WorkspaceEntries
from emelex_workers.models import default_model_file
from tests.support.models import require_default_model

require_default_model()

import llama_cpp  # noqa: E402

TOOLS = [RegisteredTool(spec, "tools", "test").authority() for spec in tool_specs()]
TRICKY = ['settings.json: "version": "2.7.1",', "C:\\temp\\new \"x\".txt", "café: crème brûlée", "line\nbreak",
          "back\\", "tab\there"]


def narrowed_round() -> dict:
    arguments = {tool.name: tool.input_schema for tool in TOOLS}
    entries = WorkspaceEntries(("a.txt", 'odd "name".txt', "src/app.py"), (".", "src", "my.dir"))
    write = arguments["write_file"]
    arguments["write_file"] = {**write, "properties": {**write["properties"], "path": narrow_path(
        write["properties"]["path"], "new", entries)}}
    read = arguments["read_file"]
    arguments["read_file"] = {**read, "properties": {"path": narrow_path(read["properties"]["path"], "file", entries)}}
    return union_schema(TOOLS, 3, arguments, answers=TRICKY)


SCHEMAS = {
    "a round of the built-in tools, narrowed, with tricky quotes": narrowed_round(),
    "a free answer": union_schema(TOOLS, 2, answer_chars=None),
    "answer only": union_schema((), 1),
    "optional properties only": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
                                                                   "c": {"type": "number"}}},
    "an array without a lower bound": {"type": "object", "properties": {"xs": {"type": "array", "maxItems": 3, "items": {
        "type": "string", "maxLength": 5}}}, "required": ["xs"]},
    "a const": {"const": 'say "hi"'},
}


@pytest.fixture(scope="module")
def vocab():
    llm = llama_cpp.Llama(str(default_model_file()), vocab_only=True, verbose=False)
    yield llm._model.vocab
    llm.close()


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_round_schema_becomes_a_grammar_llama_cpp_parses(vocab, name) -> None:
    text = schema_to_gbnf(SCHEMAS[name])
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
    assert sampler, text
    llama_cpp.llama_sampler_free(sampler)


def test_literals_are_escaped_and_only_those_that_need_it_are_said_to() -> None:
    assert gbnf_literal('a"b\\c\nd\re\tf') == '"a\\"b\\\\c\\nd\\re\\tf"'
    assert needs_escaped_literals(SCHEMAS["a round of the built-in tools, narrowed, with tricky quotes"])
    assert needs_escaped_literals({"const": "café"})  # a converter writing JSON in ASCII writes \u00e9
    assert not needs_escaped_literals(union_schema(TOOLS, 2, answers=["config.ini: port = 8421"]))
    with pytest.raises(ValueError, match="no grammar"):
        schema_to_gbnf({"type": "null"})


def test_generation_under_the_grammar_gives_only_what_the_schema_admits() -> None:
    llm = llama_cpp.Llama(str(default_model_file()), n_ctx=512, verbose=False, n_threads=1)
    try:
        schema = union_schema((), 1, answers=TRICKY)
        grammar = llama_cpp.LlamaGrammar.from_string(schema_to_gbnf(schema), verbose=False)
        out = llm.create_chat_completion([{"role": "user", "content": "Which version is set? Reply as JSON."}],
                                         grammar=grammar, max_tokens=48, temperature=0.0)
        value = json.loads(out["choices"][0]["message"]["content"], strict=False)
        assert validate(value, schema) is None, value
    finally:
        llm.close()
