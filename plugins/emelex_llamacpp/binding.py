"""The plugin's `ModelBinding` for GGUF files, and how every prompt of the plugin calls a model.

`generate` is the one way the summarizers and distillers run a model: on a
binding with `complete` (a `LlamaBinding`, also wrapped in the worker's
`MeteredBinding`) it varies the sampling with the job's attempt (greedy first;
each retry samples at temperature 0.7 with seed 42 + attempt, so a retry
never repeats a rejected output byte for byte) and reports whether the
output was cut by the token limit; on any other binding it calls the
protocol's `chat` (greedy, no stop reason).

A binding keeps one `LlamaEngine` for its life, so every round and job
evaluates only what its prompt does not share with the one before. Across
processes, a Session's evaluated context is a saved state: `save_session_state`
stores it (an asset, through `MemoryStore.save_model_state`) and
`load_session_state` offers it to the next process's engine, keyed by
`state_fields`: the exact model snapshot, the chat template's digest and the
context settings. The asset starts with `STATE_MAGIC` and a JSON line holding
those fields and the evaluated tokens; it is loaded only when every field
matches this binding's, its tokens hash to the digest the store recorded, and
the Session's next prompt starts with them. Anything else is evaluated afresh,
and a state that cannot be read or does not say what its row says is reported
with a `ModelStateWarning`, never raised.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emelex_memory import InstalledModel
from emelex_memory import content_digest
from emelex_workers.plugin_api import (
    DEFAULT_SEED,
    RETRY_TEMPERATURE,
    Completion,
    GenerationInterrupted,
    GenerationProgress,
    ModelBinding,
)

from .engine import LlamaEngine
from .probe import ensure_generates

if TYPE_CHECKING:
    from emelex_memory import MemoryStore, SessionLease

STATE_MAGIC = b"emelex llama.cpp state 1\n"
MAX_STATE_BYTES = 128 * 1024 * 1024  # an asset's cap: a longer context is saved only up to what fits
BENCH_TEXT = ("A local model reads the whole conversation before it answers, so every token of history costs time "
              "on each turn unless the evaluated context is kept. ")


class ModelStateWarning(UserWarning):
    """A Session's saved model state was not used (unreadable, damaged, or not what its record says) or could not
    be saved: the Session is evaluated afresh, which is only slower. Nothing to do unless it repeats; then run
    `emelex memory doctor` (assets) and `emelex memory maintain`."""


def token_digest(tokens: list[int]) -> str:
    """SHA-256 hex of `tokens` as comma-separated decimals: the prefix digest a saved state is recorded with."""
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


class LlamaBinding:
    """A `ModelBinding` for one GGUF file: the model is loaded on first use, once, and kept for the worker run."""

    def __init__(self, model: InstalledModel, *, max_context: int, threads: int, home: Path | None = None,
                 stop: threading.Event | None = None) -> None:
        """Bind `model` without loading it; `max_context` caps the allocated context, `threads` the CPU threads;
        `home` (Emelex Home) remembers a passed llama.cpp probe (see `probe.ensure_generates`); once `stop` is set,
        the probe, the model's loading, a prompt's evaluation and generation stop (`GenerationInterrupted`, see
        `LlamaEngine`)."""
        self.model = model
        self._stop = stop
        self._max_context = max_context
        self._threads = threads
        self._home = home
        self._engine: LlamaEngine | None = None
        self.state_outcome: str | None = None  # what became of the last offered saved state

    def _loaded(self) -> LlamaEngine:
        """The engine, loaded on first use after `probe.ensure_generates` (`LlamaCrashError` when llama.cpp
        crashes generating on this CPU, instead of the process dying silently)."""
        if self._engine is None:
            ensure_generates(self.model.model_file, self._home, model_digest=content_digest(self.model.files),
                             stop=self._stop)
            self._engine = LlamaEngine(self.model.model_file, max_ctx=self._max_context, n_threads=self._threads,
                                       stop=self._stop)
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

    @property
    def parameter_count(self) -> int:
        """How many parameters the model has (loads the model): `emelex chat` runs a model under 1B with the guided
        turn policy unless told otherwise."""
        return self._loaded().parameter_count

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

    def state_fields(self) -> dict[str, Any]:
        """Everything a saved state must have been evaluated with to be used here: the exact model snapshot, the
        chat template's digest and the context settings (`LlamaEngine.context_settings`). Loads the model."""
        engine = self._loaded()
        return {"model_snapshot": self.model.snapshot_id, "template_digest": engine.template_digest,
                "context": engine.context_settings()}

    def state_key(self) -> str:
        """SHA-256 hex of the canonical JSON of `state_fields`: the key a saved state is stored under."""
        return hashlib.sha256(_canonical(self.state_fields())).hexdigest()

    def save_session_state(self, store: MemoryStore, lease: SessionLease) -> str:
        """Optional `AgentBinding` method, called by the agent adapter on its model thread after the last turn,
        before the lease is released: save the evaluated context of the lease's Session (up to its last prompt, at
        most `MAX_STATE_BYTES`; see `LlamaEngine.export_state`) under `state_key`. Returns what was done, one
        clause; never raises for a state that cannot be saved (a `ModelStateWarning` says why)."""
        if self._engine is None:
            return "no state saved: the model was not used"
        try:
            exported = self._engine.export_state(MAX_STATE_BYTES - 64 * 1024)
            if exported is None:
                return "no state saved: nothing evaluated fits"
            tokens, data = exported
            header = _canonical({"fields": self.state_fields(), "tokens": tokens})
            store.save_model_state(lease, state_key=self.state_key(), prefix_tokens=len(tokens),
                                   prefix_digest=token_digest(tokens), data=b"".join((STATE_MAGIC, header, b"\n",
                                                                                      data)))
        except Exception as exc:  # noqa: BLE001 - saving is an optimisation: whatever stops it, say so and go on
            warnings.warn(ModelStateWarning(f"the model state of Session {lease.session_id} was not saved "
                                            f"({type(exc).__name__}: {exc}); its next resume evaluates it afresh"),
                          stacklevel=2)
            return f"no state saved: {type(exc).__name__}"
        return f"saved the state of {len(tokens)} evaluated tokens ({len(data) / 1e6:.1f} MB)"

    def load_session_state(self, store: MemoryStore, session_id: str) -> str:
        """Optional `AgentBinding` method, called by the agent adapter on its model thread when it resumes a Session
        (its lease held, so `maintain` keeps the state): find the state saved under `state_key`, check it (every
        field of its header equal to `state_fields`, its tokens those the store recorded) and offer it to the
        engine, which loads it at the first round whose prompt starts with its tokens (`state_outcome` then says
        what happened). Returns what was done, one clause; a state that cannot be read or fails a check (or a model
        that cannot be loaded: the first round says why) is ignored with a `ModelStateWarning`, never raised; a
        loading stopped by the binding's stop event raises `GenerationInterrupted`."""
        started = time.monotonic()
        try:
            saved = store.model_state(session_id, self.state_key())
            if saved is None:
                return "no saved state for this model and context"
            raw = store.read_asset(saved.asset)
            if not raw.startswith(STATE_MAGIC) or b"\n" not in raw[len(STATE_MAGIC):]:
                raise ValueError("it is not a llama.cpp state written by Emelex")
            end = raw.index(b"\n", len(STATE_MAGIC))
            header = json.loads(raw[len(STATE_MAGIC):end])
            tokens = header["tokens"]
            if header["fields"] != self.state_fields():
                raise ValueError("its model, template or context settings differ from its key")
            if len(tokens) != saved.prefix_tokens or token_digest(tokens) != saved.prefix_digest:
                raise ValueError("its tokens are not the ones recorded with it")
        except GenerationInterrupted:
            raise  # the model's loading was stopped: no fault of the state's
        except Exception as exc:  # noqa: BLE001 - a damaged state is ignored: the Session is evaluated afresh
            self.state_outcome = f"ignored: {exc}"
            warnings.warn(ModelStateWarning(f"the saved model state of Session {session_id} was ignored ({exc}); "
                                            "it is evaluated afresh"), stacklevel=2)
            return self.state_outcome

        def outcome(loaded: bool, why: str) -> None:
            self.state_outcome = f"{'loaded' if loaded else 'not loaded'}: {why}"

        self._loaded().offer_state(tokens, raw[end + 1:], outcome)
        return f"offered a saved state of {len(tokens)} tokens (read in {time.monotonic() - started:.2f} s)"

    @property
    def last_reuse(self) -> Any:
        """The last completion's `PromptReuse` (prompt tokens, and how many were evaluated), or None."""
        return None if self._engine is None else self._engine.last_reuse

    def measure_threads(self, threads: int, *, prompt_tokens: int = 256, max_tokens: int = 32) -> dict[str, float]:
        """Speed at `threads` threads on this machine now: evaluate a fixed text of `prompt_tokens` tokens from an
        empty context, then generate `max_tokens` tokens greedily (the end of text ignored); return
        `{"threads", "prompt_tps", "generate_tps", "seconds"}`. Leaves the binding at its own thread count."""
        engine = self._loaded()
        try:
            engine.set_threads(threads)
            return engine.measure(BENCH_TEXT, prompt_tokens=prompt_tokens, max_tokens=max_tokens) | {
                "threads": threads}
        finally:
            engine.set_threads(engine.threads)

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
