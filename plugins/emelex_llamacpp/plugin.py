"""The built-in llama.cpp plugin: a GGUF model binding, a summarizer and a distiller.

Registered through the `emelex` entry-point group exactly like a third-party
plugin (name "llamacpp"). `llama_cpp` is imported only when a binding first
needs the model, so commands that run no inference never pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from emelex_memory import InstalledModel, Settings
from emelex_memory.models import GGUF_MAGIC
from emelex_workers.hookspecs import hookimpl
from emelex_workers.plugin_api import Distiller, GenerationProgress, Summarizer

from .engine import LlamaEngine
from .prompts import distill, summarize

NAME = "llamacpp"


class LlamaBinding:
    """A `ModelBinding` for one GGUF file: the model is loaded on first use, once, and kept for the worker run."""

    def __init__(self, model: InstalledModel, *, max_context: int, threads: int) -> None:
        """Bind `model` without loading it; `max_context` caps the allocated context, `threads` the CPU threads."""
        self.model = model
        self._max_context = max_context
        self._threads = threads
        self._engine: LlamaEngine | None = None

    def _loaded(self) -> LlamaEngine:
        if self._engine is None:
            self._engine = LlamaEngine(self.model.model_file, max_ctx=self._max_context, n_threads=self._threads)
        return self._engine

    @property
    def loaded(self) -> bool:
        """True once the weights are in memory."""
        return self._engine is not None

    @property
    def context_window(self) -> int:
        """The allocated context in tokens: the model's trained context, capped by `model_max_context_tokens`."""
        return self._loaded().context_window

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under the model's own tokenizer."""
        return self._loaded().count_tokens(text)

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
             on_token: Callable[[GenerationProgress], None] | None = None) -> str:
        """One greedy completion, grammar-constrained to `json_schema` when given; streamed to `on_token` as
        `GenerationProgress` (exact prompt and sampled token counts) when given."""
        report = None if on_token is None else (
            lambda prompt, sampled, text: on_token(GenerationProgress(prompt, sampled, text)))
        return self._loaded().chat(messages, max_tokens=max_tokens, json_schema=json_schema, on_token=report)

    def close(self) -> None:
        """Free the model; idempotent."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def _is_gguf(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 4, 0) == GGUF_MAGIC
    finally:
        os.close(fd)


@hookimpl
def model_binding(model: InstalledModel, settings: Settings) -> LlamaBinding | None:
    """Bind any GGUF model (checked by its magic bytes); pass on anything else."""
    if not _is_gguf(model.model_file):
        return None
    return LlamaBinding(model, max_context=settings.model_max_context_tokens, threads=settings.model_threads)


@hookimpl
def register_summarizers(register) -> None:
    """The "llamacpp" summarizer."""
    register(Summarizer(NAME, summarize))


@hookimpl
def register_distillers(register) -> None:
    """The "llamacpp" distiller."""
    register(Distiller(NAME, distill))
