"""Thin llama-cpp-python wrapper running a local GGUF chat model (no downloads).

``llama_cpp`` is imported lazily inside :class:`LlamaEngine`, so importing this
module is cheap. Which file to load is the caller's business (the plugin passes
the validated ``InstalledModel.model_file``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emelex_workers.plugin_api import DEFAULT_SEED, GenerationInterrupted, gbnf_literal

DEFAULT_MAX_CTX = 8192
_LOAD_LOCK = threading.Lock()
_ENGINES: weakref.WeakSet = weakref.WeakSet()  # the live engines, whose stops quiet llama.cpp's log
_QUIET_LOG: list[Any] = []  # the log callback installed by `_quiet_log_while_stopping`, kept referenced
grammar_literal = gbnf_literal  # ``text`` as a GBNF string literal: quotes, backslashes and line ends escaped


@functools.cache
def _converter(module: Any) -> type:
    """llama-cpp-python's ``SchemaConverter`` with `grammar_literal` for its literals (made once)."""
    return type("SchemaConverter", (module.SchemaConverter,),
                {"_format_literal": lambda self, literal: grammar_literal(literal)})


# GGUF scalar value type -> struct format (8 = string, 9 = array: handled apart).
_GGUF_SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))


def gguf_context_length(path: str | Path) -> int | None:
    """Read ``<arch>.context_length`` (n_ctx_train) from a GGUF header, pre-load.

    Pure Python, stops at that key. Returns None if the key is absent or the file
    is not GGUF v2+; never raises for a missing or malformed file.
    """
    def read(f: Any, fmt: str) -> Any:
        return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

    def skip(f: Any, vtype: int) -> None:
        if vtype == 8:
            f.seek(read(f, "Q"), 1)
        elif vtype == 9:
            itype, count = read(f, "I"), read(f, "Q")
            if itype in _GGUF_SCALARS:
                f.seek(struct.calcsize("<" + _GGUF_SCALARS[itype]) * count, 1)
            else:
                for _ in range(count):
                    skip(f, itype)
        else:
            f.seek(struct.calcsize("<" + _GGUF_SCALARS[vtype]), 1)

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF" or read(f, "I") < 2:
                return None
            _n_tensors, n_kv = read(f, "Q"), read(f, "Q")
            for _ in range(n_kv):
                key = f.read(read(f, "Q")).decode("utf-8", "replace")
                vtype = read(f, "I")
                if key.endswith(".context_length") and vtype in (4, 5, 10, 11):
                    return int(read(f, _GGUF_SCALARS[vtype]))
                skip(f, vtype)
    except (OSError, struct.error, KeyError, ValueError):
        return None
    return None


def _reporting_prompt_eval(llm: Any, on_prompt: Callable[[int, int], None]) -> Callable[[Any], None]:
    """A stand-in for ``llm.eval`` for one completion: its first call (the prompt, or what of it the kept prefix
    does not cover) runs the class's ``eval`` on one ``n_batch`` slice at a time, as ``eval`` itself slices it,
    calling ``on_prompt(evaluated, total)`` before the first slice and after each; later calls (one sampled token
    each) pass straight through."""
    evaluate = type(llm).eval
    first = [True]

    def eval_tokens(tokens: Any) -> None:
        if not first[0]:
            return evaluate(llm, tokens)
        first[0] = False
        tokens = list(tokens)
        total = llm.n_tokens + len(tokens)
        on_prompt(llm.n_tokens, total)
        for start in range(0, len(tokens), llm.n_batch):
            evaluate(llm, tokens[start:start + llm.n_batch])
            on_prompt(llm.n_tokens, total)
        return None

    return eval_tokens


def _quiet_log_while_stopping(llama_cpp: Any) -> None:
    """Once per process: pass llama.cpp's log to llama-cpp-python's own callback (which prints errors only, for a
    quiet `Llama`), except while an engine is stopping: an aborted `llama_decode` logs an error for the batch it
    drops ("decode: removing memory module entries ..."), which is no error of the user's."""
    if _QUIET_LOG:
        return
    from llama_cpp._logger import llama_log_callback as forward

    def log(level: int, text: bytes, data: Any) -> None:
        if not any(engine._stopping() for engine in list(_ENGINES)):
            forward(level, text, data)

    _QUIET_LOG.append(llama_cpp.llama_log_callback(log))
    llama_cpp.llama_log_set(_QUIET_LOG[0], ctypes.c_void_p(0))


@dataclass(frozen=True)
class PromptReuse:
    """One completion's prompt: `prompt_tokens` in all, of which `evaluated` were evaluated (the rest was kept in the
    context from the calls before: the longest common prefix, less one token replayed when all of it matched)."""

    prompt_tokens: int
    evaluated: int


def _common_prefix(kept: Any, tokens: list[int]) -> int:
    n = 0
    for a, b in zip(kept, tokens):
        if a != b:
            break
        n += 1
    return n


class LlamaEngine:
    """One loaded GGUF model (CPU only, quiet) with chat and token counting.

    Args:
        model_path: path to a ``.gguf`` file.
        n_ctx: context size to allocate; default (None) is the model's trained
            context (n_ctx_train, read from the GGUF header) capped at ``max_ctx``.
        max_ctx: the cap applied when ``n_ctx`` is None.
        n_threads: threads for both generation and prompt processing.
        seed: fixed sampling seed, passed on every call (reproducible output).
        cpu_extra_buffers: enable llama.cpp "extra" CPU buffer types (AMX and
            weight repacking). Off by default: on VMs whose CPUID advertises AMX
            without usable tile state the AMX kernels kill the process (SIGILL).

    Loaded exactly once, in the constructor. Calls hold a lock (llama.cpp
    contexts are not thread-safe).

    Every completion keeps the evaluated context: the next one evaluates only
    what follows the longest prefix it shares with it (llama-cpp-python's
    `Llama.generate` does that, as long as the context is never reset and
    the `Llama` never re-created, which this class never does).
    `last_reuse` says how much of the last prompt was evaluated. A state
    exported with `export_state` can be offered to a later engine with
    `offer_state`: it is loaded at the next completion whose prompt starts
    with the state's tokens.

    Stopping: once ``stop`` (the engine's) or a call's own ``stop`` event is
    set, llama.cpp stops where it checks: loading stops at its next tensor
    (its progress callback returns False, so it returns no model), and a
    prompt's evaluation or a token's computation at the next node of the
    graph it computes (its abort callback returns True; `llama_decode` then
    returns 2, "aborted"); a stream also stops between two tokens. The call
    raises ``GenerationInterrupted`` saying where it stopped. The callbacks
    only read the events: nothing is raised inside llama.cpp (ctypes would
    swallow it). After an interrupted call the engine is usable: the next
    completion evaluates again what the aborted batch left in the context
    (llama-cpp-python drops the cache past its last complete batch before it
    evaluates, and the engine marks the logits stale).
    """

    def __init__(self, model_path: str | Path, *, n_ctx: int | None = None,
                 max_ctx: int = DEFAULT_MAX_CTX, n_threads: int = 2,
                 seed: int = DEFAULT_SEED, cpu_extra_buffers: bool = False,
                 stop: threading.Event | None = None) -> None:
        """Load the GGUF at ``model_path`` (see the class docstring for the arguments).

        Raises ``FileNotFoundError`` when it is not a file, llama.cpp's
        ``ValueError`` when it cannot be loaded, and ``GenerationInterrupted``
        when ``stop`` was set while it loaded (see "Stopping" in the class
        docstring).
        """
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model not found: {path}")
        if n_ctx is None:
            n_ctx = min(gguf_context_length(path) or max_ctx, max_ctx)
        import llama_cpp  # lazy: keeps importing this module fast

        self._llama_cpp, self._seed, self.model_path = llama_cpp, seed, path
        self._lock, low = threading.Lock(), llama_cpp.llama_cpp
        self._stop, self._call_stop = stop, None
        _quiet_log_while_stopping(low)
        _ENGINES.add(self)
        # llama.cpp calls these from the loading and the computing thread; they only read the stop events, and the
        # engine keeps them referenced for as long as llama.cpp may call them.
        self._on_load = low.llama_progress_callback(lambda _progress, _data: not self._stopping())
        self._on_compute = low.ggml_abort_callback(lambda _data: self._stopping())
        # Llama() has no use_extra_bufts nor progress_callback kwarg: patch its params factory, only for the
        # duration of this (globally locked) load.
        with _LOAD_LOCK:
            orig = low.llama_model_default_params

            def params() -> Any:
                p = orig()
                p.use_extra_bufts = cpu_extra_buffers
                p.progress_callback = self._on_load  # returning False aborts the load: llama.cpp returns no model
                return p

            low.llama_model_default_params = params
            try:
                self._llm: Any = llama_cpp.Llama(
                    model_path=str(path), n_ctx=n_ctx, n_threads=n_threads,
                    n_threads_batch=n_threads, seed=seed, verbose=False)
            except ValueError:
                if self._stopping():
                    raise GenerationInterrupted("while loading the model") from None
                raise
            finally:
                low.llama_model_default_params = orig
        # Checked by ggml between the nodes of every graph llama_decode computes (the prompt's batches and each
        # sampled token): returning True makes llama_decode return 2 ("aborted"), keeping what it computed.
        low.llama_set_abort_callback(self._llm.ctx, self._on_compute, None)
        if self._stopping():  # set after the last loading step: the model is loaded, the caller stops anyway
            raise GenerationInterrupted("once the model was loaded")
        self.threads = int(self._llm.n_threads)  # as loaded; `set_threads` changes what llama.cpp uses
        self.last_reuse: PromptReuse | None = None
        self._last_prompt: list[int] = []
        self._offered: tuple[list[int], bytes, Callable[[bool, str], None]] | None = None

    def _stopping(self) -> bool:
        """True once the engine's or the running call's stop event is set (llama.cpp's callbacks ask this)."""
        return bool((self._stop is not None and self._stop.is_set())
                    or (self._call_stop is not None and self._call_stop.is_set()))

    @contextlib.contextmanager
    def _interruptible(self, stop: threading.Event | None, where: Callable[[], str]) -> Iterator[None]:
        """For one completion (the lock held): let llama.cpp's abort callback see `stop` too, and turn what an
        abort makes llama-cpp-python raise into ``GenerationInterrupted`` saying `where()` it stopped."""
        self._call_stop = stop
        try:
            yield
        except GenerationInterrupted:
            self._model()._requires_eval = True
            raise
        except Exception:
            if not self._stopping():
                raise
            self._model()._requires_eval = True  # the logits are those of an aborted batch: never sample them
            raise GenerationInterrupted(where()) from None
        finally:
            self._call_stop = None

    def grammar(self, json_schema: dict) -> Any:
        """The ``LlamaGrammar`` that constrains generation to ``json_schema``; ValueError when the schema is not one
        the converter supports, or when the grammar it makes does not parse (llama.cpp would then sample without
        any constraint, so it is never used).

        llama-cpp-python's converter escapes a literal's quotes and newlines but not its backslashes, so a
        ``const`` or ``enum`` string holding a quote or a backslash (a quoted line, a file name) became a grammar
        llama.cpp cannot parse; literals are escaped whole here (`grammar_literal`)."""
        module = self._llama_cpp.llama_grammar
        try:
            converter = _converter(module)(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            converter.visit(converter.resolve_refs(json_schema, "schema"), "")
            text = converter.format_grammar()
        except Exception as exc:  # the converter raises AssertionError/KeyError/...
            raise ValueError(f"unsupported json_schema: {exc}") from exc
        sampler = self._llama_cpp.llama_sampler_init_grammar(self._model()._model.vocab, text.encode("utf-8"),
                                                              b"root")
        if not sampler:
            raise ValueError("unsupported json_schema: the grammar made of it does not parse")
        self._llama_cpp.llama_sampler_free(sampler)
        return self._llama_cpp.LlamaGrammar.from_string(text, verbose=False)

    def _model(self) -> Any:
        if self._llm is None:
            raise RuntimeError("LlamaEngine is closed")
        return self._llm

    @property
    def context_window(self) -> int:
        """The context size in tokens (prompt + completion) actually allocated."""
        return int(self._model().n_ctx())

    @property
    def parameter_count(self) -> int:
        """How many parameters the model has, as llama.cpp counts them."""
        return int(self._model()._model.n_params())

    def count_tokens(self, text: str) -> int:
        """Return the number of model tokens in ``text`` (0 for "").

        Raw text only: no BOS (``add_bos=False``); special-token strings like
        ``<|im_start|>`` count as plain text (``special=False``, the larger,
        conservative count). Per-message chat-template overhead is NOT included.
        """
        with self._lock:
            return len(self._model().tokenize(text.encode(), add_bos=False, special=False))

    def chat(self, messages: list[dict], *, max_tokens: int,
             json_schema: dict | None = None, temperature: float = 0.0,
             on_token: Callable[[int, int, str], None] | None = None) -> str:
        """Run one chat completion and return the assistant message text (see ``complete``)."""
        return self.complete(messages, max_tokens=max_tokens, json_schema=json_schema,
                             temperature=temperature, on_token=on_token)[0]

    def complete(self, messages: list[dict], *, max_tokens: int, json_schema: dict | None = None,
                 temperature: float = 0.0, seed: int | None = None, repeat_penalty: float = 1.0,
                 on_token: Callable[[int, int, str], None] | None = None,
                 on_prompt: Callable[[int, int], None] | None = None) -> tuple[str, str]:
        """Run one chat completion; return the assistant text and why it stopped ("stop" or "length").

        ``messages`` are OpenAI-style ``{"role", "content"}`` dicts rendered with
        the GGUF chat template. ``max_tokens`` (>= 1) bounds the completion and
        is silently reduced to the room left in the context window. With
        ``json_schema`` the output is grammar-constrained to the schema
        (maxItems/maxLength enforced, number minimum/maximum not; a schema the
        converter rejects raises ValueError rather than degrading to free JSON).
        Output cut off by ``max_tokens`` (finish reason "length") is invalid
        JSON: parse defensively. ``temperature == 0`` is greedy; ``seed``
        (default: the engine's) seeds sampling; ``repeat_penalty`` > 1
        discourages repeating recent tokens. ValueError if the prompt does not fit.

        With ``on_token`` the completion is streamed and
        ``on_token(prompt_tokens, sampled_tokens, text)`` is called for every
        piece of text as it is generated, then once more with the final counts
        and ``""``. Both counts are exact: the prompt as the model sees it
        (chat template included), and every sampled token (the end-of-text
        token included), counted by a logits processor that leaves the logits
        as they are. The text is the same as without ``on_token``.

        With ``on_token``, ``on_prompt(evaluated, prompt_tokens)`` (when given)
        is called while the prompt is evaluated: before its first batch and
        after each batch of ``n_batch`` tokens (a prefix kept from the previous
        call counts as evaluated). llama-cpp-python has no such callback: the
        prompt is evaluated here, batch by batch, exactly as ``Llama.eval``
        would (the same ``n_batch`` slices, so the same output).
        """
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        grammar = None if json_schema is None else self.grammar(json_schema)
        options = dict(messages=messages, max_tokens=max_tokens, temperature=temperature,
                       seed=self._seed if seed is None else seed, grammar=grammar, repeat_penalty=repeat_penalty)
        with self._lock, self._generating():
            if on_token is None:
                with self._interruptible(None, lambda: "while the model ran"):
                    choice = self._model().create_chat_completion(**options, stream=False)["choices"][0]
                return choice["message"]["content"] or "", choice.get("finish_reason") or "stop"
            return self._stream(options, on_token, on_prompt)

    def _stream(self, options: dict[str, Any], on_token: Callable[[int, int, str], None] | None,
                on_prompt: Callable[[int, int], None] | None, stop: threading.Event | None = None,
                on_text: Callable[[str], None] | None = None) -> tuple[str, str]:
        """`complete` with ``on_token``: stream the completion, reporting exact counts (see `complete`); with
        ``stop`` and ``on_text``, as `stream` does. Stopped (see the class docstring), it raises
        ``GenerationInterrupted`` saying whether it was evaluating the prompt (how far) or generating."""
        seen: list[int] = []  # the context length at each sampling step: the first is the prompt
        evaluated = [0, 0]  # the prompt's tokens evaluated so far, of all

        def count(input_ids: Any, scores: Any) -> Any:
            seen.append(len(input_ids))
            return scores

        def prompt_progress(done: int, total: int) -> None:
            evaluated[:] = done, total
            if on_prompt is not None:
                on_prompt(done, total)

        def where() -> str:
            if seen:
                return f"while generating (after {len(seen)} tokens)"
            return f"while evaluating the prompt ({evaluated[0]} of {evaluated[1]} tokens)"

        llm = self._model()
        llm.eval = _reporting_prompt_eval(llm, prompt_progress)  # an instance attribute: Llama.generate calls it
        try:
            with self._interruptible(stop, where):
                chunks = llm.create_chat_completion(
                    **options, stream=True, logits_processor=self._llama_cpp.LogitsProcessorList([count]))
                pieces, reason = [], "stop"
                try:
                    for chunk in chunks:
                        if self._stopping():
                            raise GenerationInterrupted(where())
                        choice = chunk["choices"][0]
                        reason = choice.get("finish_reason") or reason
                        piece = choice["delta"].get("content")
                        if piece:
                            pieces.append(piece)
                            if on_text is not None:
                                on_text(piece)
                            if on_token is not None:
                                on_token(seen[0] if seen else 0, len(seen), piece)
                finally:
                    chunks.close()
        finally:
            llm.__dict__.pop("eval", None)
        if on_token is not None:
            on_token(seen[0] if seen else 0, len(seen), "")
        return "".join(pieces), reason

    @property
    def template_digest(self) -> str:
        """SHA-256 hex of the GGUF's chat template (``tokenizer.chat_template``; "" when it has none)."""
        template = self._model().metadata.get("tokenizer.chat_template", "")
        return hashlib.sha256(template.encode()).hexdigest()

    def stream(self, messages: list[dict], *, max_tokens: int, json_schema: dict, stop: threading.Event,
               on_text: Callable[[str], None] | None = None, temperature: float = 0.0,
               seed: int | None = None, on_token: Callable[[int, int, str], None] | None = None,
               on_prompt: Callable[[int, int], None] | None = None) -> str:
        """One streamed completion constrained to ``json_schema`` (ValueError when the converter rejects it),
        each piece passed to ``on_text``. ``stop`` is checked before each sampled piece: once it is set the
        stream is closed (llama.cpp stops within one token; the next call is unaffected) and
        ``GenerationInterrupted`` is raised; so it is when ``stop`` is set while the prompt is evaluated (see
        "Stopping" in the class docstring). ``on_token`` and ``on_prompt`` report exact counts as for
        `complete`."""
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        options = dict(messages=messages, max_tokens=max_tokens, temperature=temperature,
                       grammar=self.grammar(json_schema), seed=self._seed if seed is None else seed)
        with self._lock, self._generating():
            return self._stream(options, on_token, on_prompt, stop, on_text)[0]

    @contextlib.contextmanager
    def _generating(self) -> Iterator[None]:
        """For one completion (the lock held): stand in for ``llm.generate`` to load an offered state whose tokens
        start the prompt, and to record the prompt and how much of it the kept context covers (`last_reuse`)."""
        llm = self._model()
        generate = type(llm).generate

        def generating(tokens: Any, *args: Any, **kwargs: Any) -> Any:
            tokens = list(tokens)
            self._take_offer(tokens)
            kept = _common_prefix(llm.input_ids[:llm.n_tokens], tokens) if llm.n_tokens else 0
            if kept == len(tokens) and kept:
                kept -= 1  # all of it matched: one token is evaluated again for its logits
            self.last_reuse = PromptReuse(len(tokens), len(tokens) - kept)
            self._last_prompt = tokens
            return generate(llm, tokens, *args, **kwargs)

        llm.generate = generating  # an instance attribute: create_chat_completion calls self.generate
        try:
            yield
        finally:
            llm.__dict__.pop("generate", None)

    def set_threads(self, n_threads: int) -> None:
        """Use ``n_threads`` (>= 1) for generation and prompt evaluation from the next call on."""
        with self._lock:
            self._llama_cpp.llama_set_n_threads(self._model().ctx, n_threads, n_threads)

    def measure(self, text: str, *, prompt_tokens: int, max_tokens: int) -> dict[str, float]:
        """From an empty context: evaluate ``text`` (repeated or cut to ``prompt_tokens`` tokens), then sample
        ``max_tokens`` tokens greedily one by one; return ``{"prompt_tps", "generate_tps", "seconds"}``. The
        context holds no conversation afterwards."""
        import time

        with self._lock:
            llm = self._model()
            tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
            tokens = (tokens * (prompt_tokens // max(1, len(tokens)) + 1))[:prompt_tokens]
            llm.reset()
            self._last_prompt = []
            started = time.perf_counter()
            llm.eval(tokens)
            evaluated = time.perf_counter()
            for _ in range(max_tokens):
                llm.eval([llm.sample(temp=0.0)])
            ended = time.perf_counter()
            llm.reset()
        return {"prompt_tps": prompt_tokens / (evaluated - started), "generate_tps": max_tokens / (ended - evaluated),
                "seconds": ended - started}

    def context_settings(self) -> dict[str, Any]:
        """What a saved state depends on besides the model and template: the context's size, batch sizes, cache
        types, attention settings, and the llama-cpp-python version that wrote it."""
        params = self._model().context_params
        fields = ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "type_k", "type_v", "flash_attn_type", "swa_full",
                  "kv_unified", "offload_kqv", "embeddings", "rope_freq_base", "rope_freq_scale")
        settings = {name: getattr(params, name) for name in fields if hasattr(params, name)}
        return {**settings, "llama_cpp": self._llama_cpp.__version__}

    def export_state(self, max_bytes: int) -> tuple[list[int], bytes] | None:
        """The context's state for reuse in another process: the tokens it has evaluated, kept only up to the last
        prompt (what a later prompt of the same conversation starts with; the generated tokens after it are dropped
        from the context), then fewer, from the end, until the state's bytes fit in ``max_bytes``. None when nothing
        is evaluated or even one token's state would not fit. The dropped tokens are evaluated again by the next
        completion, if any."""
        with self._lock:
            llm, low = self._model(), self._llama_cpp
            keep = _common_prefix(llm.input_ids[:llm.n_tokens], self._last_prompt)
            while keep > 0:
                self._truncate(keep)
                size = int(low.llama_state_get_size(llm.ctx))
                if size <= max_bytes:
                    buffer = (ctypes.c_uint8 * size)()
                    written = int(low.llama_state_get_data(llm.ctx, buffer, size))
                    return [int(t) for t in llm.input_ids[:keep]], bytes(buffer)[:written]
                keep = min(keep - 1, int(keep * max_bytes / size * 0.98))
            return None

    def _truncate(self, n_tokens: int) -> None:
        """Drop the context after its first ``n_tokens`` (the lock held)."""
        llm = self._model()
        if n_tokens < llm.n_tokens:
            llm._ctx.kv_cache_seq_rm(-1, n_tokens, -1)
            llm.n_tokens = n_tokens
            llm._requires_eval = True

    def offer_state(self, tokens: list[int], data: bytes, on_outcome: Callable[[bool, str], None]) -> None:
        """Offer a state exported by `export_state` (with the same model, template and `context_settings`: the
        caller's check). The next completion loads it when its prompt starts with ``tokens`` and then evaluates only
        the rest; otherwise it is dropped and the prompt evaluated. ``on_outcome(loaded, why)`` is told which,
        once."""
        with self._lock:
            self._offered = (list(tokens), data, on_outcome)

    def _take_offer(self, prompt: list[int]) -> None:
        """Load the offered state if ``prompt`` starts with its tokens (the lock held); tell its outcome."""
        if self._offered is None:
            return
        tokens, data, on_outcome = self._offered
        self._offered = None
        if prompt[:len(tokens)] != tokens:
            at = _common_prefix(tokens, prompt)
            on_outcome(False, f"the prompt differs from the saved state's {len(tokens)} tokens at token {at}")
            return
        llm = self._model()
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if int(self._llama_cpp.llama_state_set_data(llm.ctx, buffer, len(data))) != len(data):
            llm.reset()
            llm._ctx.kv_cache_clear()
            on_outcome(False, "llama.cpp did not accept the saved state's bytes")
            return
        llm.input_ids[:len(tokens)] = tokens
        llm.n_tokens = len(tokens)
        llm._requires_eval = True
        on_outcome(True, f"loaded {len(tokens)} evaluated tokens")

    def close(self) -> None:
        """Free the model and context; idempotent. Later calls raise RuntimeError."""
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None
