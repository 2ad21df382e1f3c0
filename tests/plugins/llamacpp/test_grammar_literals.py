"""Grammars with literals holding quotes and backslashes, on the real llama.cpp: a quoted line or a file name in an
enum must constrain generation, never yield a grammar llama.cpp cannot parse (which would leave sampling free)."""

from __future__ import annotations

import json
import threading

import pytest

from emelex_workers.settings import WorkerSettings
from emelex_workers.models import ModelManager
from tests.support.models import require_default_model

require_default_model()

from emelex_llamacpp.binding import LlamaBinding  # noqa: E402
from emelex_llamacpp.engine import grammar_literal  # noqa: E402

TRICKY = ['settings.json: "version": "2.7.1",', 'C:\\temp\\new "x".txt', 'a\\"b', 'line\nbreak', 'back\\']


def test_a_literal_escapes_quotes_backslashes_and_line_ends() -> None:
    assert grammar_literal('a"b\\c\nd\re') == '"a\\"b\\\\c\\nd\\re"'


@pytest.fixture
def binding(settings: WorkerSettings):
    with ModelManager(settings) as manager:
        model = manager.ensure_default(link=True)[0]
    opened = LlamaBinding(model, max_context=1024, threads=1, home=settings.home_dir)
    yield opened
    opened.close()


def test_an_enum_of_tricky_strings_constrains_generation_to_one_of_them(binding) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": TRICKY}},
              "required": ["answer"], "additionalProperties": False}
    messages = [{"role": "user", "content": "Which version is set? Reply as JSON."}]
    raw = binding.stream_chat(messages, max_tokens=48, json_schema=schema, stop=threading.Event())
    assert json.loads(raw)["answer"] in TRICKY, raw
