"""The built-in llama.cpp plugin: a GGUF model binding, a summarizer and a distiller.

Registered through the `emelex` entry-point group exactly like a third-party
plugin (name "llamacpp"). `llama_cpp` is imported only when a binding first
needs the model, so commands that run no inference never pay for it. The
summarizer and the distiller are extractive by default (`extractive.py`:
output that can only quote the source); the `summary_mode` and
`distill_mode` settings select the abstractive prompts (`prompts.py`) instead.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from emelex_memory import GGUF_MAGIC, InstalledModel, KnowledgeCandidate
from emelex_workers.plugin_api import WorkerSettings
from emelex_workers.hookspecs import hookimpl
from emelex_workers.plugin_api import (
    Distiller,
    DistillRequest,
    ModelCheck,
    Summarizer,
    SummaryRequest,
    model_threads,
)

from . import extractive, prompts
from .binding import LlamaBinding

NAME = "llamacpp"
__all__ = ["NAME", "LlamaBinding", "check_model", "distill", "model_binding", "summarize"]


def _is_gguf(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 4, 0) == GGUF_MAGIC
    finally:
        os.close(fd)


def summarize(request: SummaryRequest) -> str:
    """The Summary, extractive or abstractive by the `summary_mode` setting (default extractive)."""
    mode = request.settings.summary_mode if request.settings is not None else "extractive"
    return (prompts if mode == "abstractive" else extractive).summarize(request)


def distill(request: DistillRequest) -> list[KnowledgeCandidate]:
    """Knowledge candidates, extractive or abstractive by the `distill_mode` setting (default extractive)."""
    mode = request.settings.distill_mode if request.settings is not None else "extractive"
    return (prompts if mode == "abstractive" else extractive).distill(request)


@hookimpl
def model_binding(model: InstalledModel, settings: WorkerSettings, stop: threading.Event) -> LlamaBinding | None:
    """Bind any GGUF model (checked by its magic bytes); pass on anything else (a served model has no file). The
    threads are `model_threads`, or chosen now from the usable, idle cores (`plugin_api.model_threads`); `stop`
    stops the model's loading and its work (see `LlamaEngine`)."""
    if model.kind == "served" or not _is_gguf(model.model_file):
        return None
    return LlamaBinding(model, max_context=settings.model_max_context_tokens, threads=model_threads(settings),
                        home=settings.home_dir, stop=stop)


@hookimpl
def check_model(model: InstalledModel) -> ModelCheck | None:
    """For a GGUF model: generate a few tokens in a child process (`probe.run_probe`, afresh, never the cached pass)
    and say whether llama.cpp runs on this CPU; pass on anything else, or when llama-cpp-python is not installed."""
    import importlib.util

    if not _is_gguf(model.model_file) or importlib.util.find_spec("llama_cpp") is None:
        return None
    from .probe import run_probe

    result = run_probe(model.model_file)
    if not result.ok:
        return ModelCheck("llama.cpp", False, result.problem)
    return ModelCheck("llama.cpp", True, f"generated {result.generated_tokens} tokens with {model.name} on this CPU")


@hookimpl
def register_summarizers(register) -> None:
    """The "llamacpp" summarizer, declaring its worked examples."""
    register(Summarizer(NAME, summarize, examples=prompts.EXAMPLES))


@hookimpl
def register_distillers(register) -> None:
    """The "llamacpp" distiller, declaring its worked examples."""
    register(Distiller(NAME, distill, examples=prompts.EXAMPLES))


@hookimpl
def embedder(settings: WorkerSettings):
    """The "llamacpp" embedder (a local GGUF model, see `embedding.py`) when the `embedder` setting names it."""
    if settings.embedder != NAME:
        return None
    from .embedding import llama_embedder

    return llama_embedder(settings)
