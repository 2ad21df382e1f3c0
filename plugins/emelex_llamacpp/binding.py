"""The plugin's `ModelBinding` for GGUF files, and how every prompt of the plugin calls a model.

`generate` is the one way the summarizers and distillers run a model: on a
binding with `complete` (a `LlamaBinding`, also wrapped in the worker's
`MeteredBinding`) it varies the sampling with the job's attempt (greedy first;
each retry samples at temperature 0.7 with seed 42 + attempt, so a retry
never repeats a rejected output byte for byte) and reports whether the
output was cut by the token limit; on any other binding it calls the
protocol's `chat` (greedy, no stop reason).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emelex_memory import InstalledModel
from emelex_memory import content_digest
from emelex_workers.plugin_api import DEFAULT_SEED, RETRY_TEMPERATURE, Completion, GenerationProgress, ModelBinding

from .engine import LlamaEngine
from .probe import ensure_generates

class LlamaBinding:
    """A `ModelBinding` for one GGUF file: the model is loaded on first use, once, and kept for the worker run."""

    def __init__(self, model: InstalledModel, *, max_context: int, threads: int, home: Path | None = None) -> None:
        """Bind `model` without loading it; `max_context` caps the allocated context, `threads` the CPU threads;
        `home` (Emelex Home) remembers a passed llama.cpp probe (see `probe.ensure_generates`)."""
        self.model = model
        self._max_context = max_context
        self._threads = threads
        self._home = home
        self._engine: LlamaEngine | None = None

    def _loaded(self) -> LlamaEngine:
        """The engine, loaded on first use after `probe.ensure_generates` (`LlamaCrashError` when llama.cpp
        crashes generating on this CPU, instead of the process dying silently)."""
        if self._engine is None:
            ensure_generates(self.model.model_file, self._home, model_digest=content_digest(self.model.files))
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
        `GenerationProgress` (exact prompt and sampled token counts, and before them the prompt's evaluation, batch
        by batch) when given."""
        return self.complete(messages, max_tokens=max_tokens, json_schema=json_schema, on_token=on_token).text

    def complete(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
                 attempt: int = 0, repeat_penalty: float = 1.0,
                 on_token: Callable[[GenerationProgress], None] | None = None) -> Completion:
        """One completion, sampled for `attempt` (see the module docstring), with its stop reason; progress as
        for `chat`."""
        temperature = 0.0 if attempt <= 0 else RETRY_TEMPERATURE
        report, prompt = _progress_reports(on_token)
        text, reason = self._loaded().complete(messages, max_tokens=max_tokens, json_schema=json_schema,
                                               temperature=temperature, seed=DEFAULT_SEED + max(0, attempt),
                                               repeat_penalty=repeat_penalty, on_token=report, on_prompt=prompt)
        return Completion(text, reason)

    @property
    def template_digest(self) -> str:
        """SHA-256 hex of the model's chat template (loads the model)."""
        return self._loaded().template_digest

    def stream_chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict,
                    stop: threading.Event, on_text: Callable[[str], None] | None = None,
                    temperature: float = 0.0, seed: int = DEFAULT_SEED,
                    on_progress: Callable[[GenerationProgress], None] | None = None) -> str:
        """The `AgentBinding` method: one constrained completion, interruptible between tokens (see
        `emelex_workers.plugin_api.AgentBinding`); progress (exact counts, the prompt's evaluation first) to
        `on_progress` as `chat` reports it to `on_token`."""
        report, prompt = _progress_reports(on_progress)
        return self._loaded().stream(messages, max_tokens=max_tokens, json_schema=json_schema, stop=stop,
                                     on_text=on_text, temperature=temperature, seed=seed, on_token=report,
                                     on_prompt=prompt)

    def close(self) -> None:
        """Free the model; idempotent."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def _progress_reports(on_progress: Callable[[GenerationProgress], None] | None) -> tuple[Any, Any]:
    """The engine's `on_token` and `on_prompt` callbacks that pass its counts to `on_progress` as
    `GenerationProgress` (None, None without it)."""
    if on_progress is None:
        return None, None

    def report(prompt_tokens: int, sampled: int, text: str) -> None:
        on_progress(GenerationProgress(prompt_tokens, sampled, text))

    def prompt(evaluated: int, prompt_tokens: int) -> None:
        on_progress(GenerationProgress(prompt_tokens, 0, "", evaluated_tokens=evaluated))

    return report, prompt


def generate(model: ModelBinding, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
             attempt: int = 0, repeat_penalty: float = 1.0) -> Completion:
    """Run `model` once: its `complete` where it has one (this plugin's binding, also behind the worker's
    metering wrapper), else the protocol's `chat`."""
    complete = getattr(model, "complete", None)
    if complete is not None:
        return complete(messages, max_tokens=max_tokens, json_schema=json_schema, attempt=attempt,
                        repeat_penalty=repeat_penalty)
    return Completion(model.chat(messages, max_tokens=max_tokens, json_schema=json_schema), "unknown")
