"""Stopping the llama.cpp engine on the embedded default model, deterministically, in process: a stop set before the
first batch of a long prompt aborts that batch inside llama.cpp (its abort callback), a stop between tokens ends the
stream, a stop while the model loads aborts the load (its progress callback), a stop during llama.cpp's probe kills
the probe child. After each, the engine (or a new one) answers exactly as a fresh engine does, and llama.cpp logs
nothing about the batch it dropped."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from emelex_workers.models import default_model_file
from emelex_workers.plugin_api import GenerationInterrupted
from tests.support.models import require_default_model

require_default_model()

from emelex_llamacpp.engine import LlamaEngine  # noqa: E402 - only where llama_cpp is installed
from emelex_llamacpp.probe import run_probe  # noqa: E402

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 120}}, "required": ["answer"]}
LONG = [{"role": "user", "content": " ".join(f"Note {n}: the cache of batch {n} was checked." for n in range(48))
         + " Which batch came first?"}]
SHORT = [{"role": "user", "content": "Count from one to twenty in words."}]


@pytest.fixture(scope="module")
def model_file() -> Path:
    return default_model_file()


@pytest.fixture(scope="module")
def fresh(model_file: Path) -> dict[str, str]:
    """What a fresh engine answers to each prompt (greedy, 24 tokens)."""
    engine = LlamaEngine(model_file, max_ctx=1024, n_threads=1)
    try:
        return {name: engine.stream(messages, max_tokens=24, json_schema=SCHEMA, stop=threading.Event())
                for name, messages in (("long", LONG), ("short", SHORT))}
    finally:
        engine.close()


class StopAfter(threading.Event):
    """A stop event that reads as set from its `n`-th look on: set part-way through whatever looks at it."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def is_set(self) -> bool:
        self.left -= 1
        return self.left < 0 or super().is_set()


def test_a_stop_before_the_first_batch_aborts_it_inside_llama_cpp_and_the_engine_then_answers_as_a_fresh_one(
    model_file: Path, fresh: dict[str, str], capfd
) -> None:
    engine = LlamaEngine(model_file, max_ctx=1024, n_threads=1)
    stop, reports = threading.Event(), []

    def on_prompt(evaluated: int, total: int) -> None:
        reports.append((evaluated, total))
        stop.set()  # before the first batch: only llama.cpp's abort callback can see it before the batch ends

    with pytest.raises(GenerationInterrupted) as stopped:
        engine.stream(LONG, max_tokens=24, json_schema=SCHEMA, stop=stop, on_prompt=on_prompt)
    total = reports[0][1]
    assert total > 512  # more than one batch: without the abort the whole prompt is evaluated first
    assert str(stopped.value) == f"while evaluating the prompt (0 of {total} tokens)"
    assert engine.stream(LONG, max_tokens=24, json_schema=SCHEMA, stop=threading.Event()) == fresh["long"]
    assert engine.stream(SHORT, max_tokens=24, json_schema=SCHEMA, stop=threading.Event()) == fresh["short"]
    engine.close()
    assert "removing memory module entries" not in capfd.readouterr().err  # the dropped batch is no error of ours


def test_a_stop_between_tokens_ends_the_stream_and_the_next_completion_is_unaffected(
    model_file: Path, fresh: dict[str, str]
) -> None:
    engine = LlamaEngine(model_file, max_ctx=1024, n_threads=1)
    stop, pieces = threading.Event(), []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 4:
            stop.set()

    with pytest.raises(GenerationInterrupted, match=r"^while generating \(after \d+ tokens\)$"):
        engine.stream(SHORT, max_tokens=24, json_schema=SCHEMA, stop=stop, on_text=on_text)
    assert len(pieces) == 4
    assert engine.stream(SHORT, max_tokens=24, json_schema=SCHEMA, stop=threading.Event()) == fresh["short"]
    engine.close()


def test_the_engines_own_stop_aborts_the_model_load_and_a_later_load_works(
    model_file: Path, fresh: dict[str, str]
) -> None:
    stop = StopAfter(3)  # llama.cpp asks through its progress callback, once per loading step
    with pytest.raises(GenerationInterrupted, match="^while loading the model$"):
        LlamaEngine(model_file, max_ctx=1024, n_threads=1, stop=stop)
    assert stop.left < 0
    engine = LlamaEngine(model_file, max_ctx=1024, n_threads=1, stop=threading.Event())
    assert engine.stream(SHORT, max_tokens=24, json_schema=SCHEMA, stop=threading.Event()) == fresh["short"]
    engine.close()


def test_a_stop_during_the_probe_kills_its_child(model_file: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(GenerationInterrupted, match="^while checking that llama.cpp runs on this CPU$"):
        run_probe(model_file, stop=stop)
