"""What a job costs: a `ModelBinding` wrapper that counts every `chat` call's tokens and relays its progress.

The worker wraps the binding it got from the plugins in a `MeteredBinding`, so
summarizers and distillers use it unchanged. When the binding's `chat`
accepts `on_token` (checked with `inspect.signature`), its own exact counts
are used and every report is passed on to the worker's progress display (and
to an `on_token` the plugin passed itself). Otherwise the call runs as before
and is counted afterwards with the model's tokenizer: the messages' contents
as prompt tokens (chat-template tokens not included) and the reply as
generated tokens; the cost then says `"estimated": true`, as it does when a
progress report itself says its counts are estimated.

With a `GracefulStop`, every use of the binding (which may load the model) is
one step of the stop: a signal during it only sets the flag the binding
checks (`GracefulStop.deferred`), and once a stop was requested the call
ends in `WorkerStopped`, whatever the binding did: its `GenerationInterrupted`
(whose message says where it stopped), another failure, or a normal return.
A plugin's summarizer or distiller therefore never goes on to its next model
call after a stop, and cannot swallow it (`WorkerStopped` is no `Exception`).
A binding that reports progress but does not check `stop` is stopped at its
next report: the `on_token` it calls raises `WorkerStopped` once a stop was
requested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emelex_memory import InstalledModel

from ..host.manager import accepts_keyword
from ..host.types import GenerationInterrupted, GenerationProgress, ModelBinding
from .stopping import GracefulStop, WorkerStopped

ProgressSink = Callable[[GenerationProgress, "int | None"], None]


@dataclass
class JobCost:
    """Tokens one job's model calls spent so far: prompt and generated tokens, calls, and whether any count was
    estimated with the tokenizer rather than reported by the binding."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    model_calls: int = 0
    estimated: bool = False

    def as_dict(self, seconds: float) -> dict[str, Any]:
        """The cost as recorded with the job: the counts, plus the attempt's `seconds`."""
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                               "seconds": round(seconds, 3), "model_calls": self.model_calls}
        if self.estimated:
            out["estimated"] = True
        return out


class MeteredBinding:
    """A `ModelBinding` that delegates to `inner` and meters `chat` into `cost`; `sink(progress, max_tokens)`
    (when set) sees every progress report. `begin_job()` starts a new job's cost. With `stop`, each use of the
    binding is a step of that stop (see the module docstring)."""

    def __init__(self, inner: ModelBinding, stop: GracefulStop | None = None) -> None:
        """Wrap `inner`; nothing is loaded."""
        self.inner = inner
        self.stop = stop
        self.model: InstalledModel = inner.model
        self.cost = JobCost()
        self.sink: ProgressSink | None = None
        self._reports = accepts_keyword(inner.chat, "on_token")
        complete = getattr(inner, "complete", None)
        if callable(complete):  # a plugin's richer call (its own options and result), metered the same way
            self._complete_reports = accepts_keyword(complete, "on_token")
            self.complete = self._complete

    @property
    def context_window(self) -> int:
        """The inner binding's context window (which may load the model)."""
        return self._step(lambda: self.inner.context_window, "while loading the model")

    def count_tokens(self, text: str) -> int:
        """The inner binding's token count of `text`."""
        return self._step(lambda: self.inner.count_tokens(text), "while counting tokens")

    def _step(self, call: Callable[[], Any], doing: str) -> Any:
        """`call()` as one step of the stop: `WorkerStopped` when a stop was requested before or during it,
        saying where (the binding's `GenerationInterrupted` says it best, else `doing`)."""
        stop = self.stop
        if stop is None:
            return call()
        stop.check()
        with stop.deferred():
            try:
                result = call()
            except BaseException as exc:
                if stop.requested is None or isinstance(exc, WorkerStopped):
                    raise
                raise WorkerStopped(stop.requested, interruption(exc) or doing) from None
        stop.check(f"{doing.replace('while', 'after', 1)}")
        return result

    def begin_job(self, sink: ProgressSink | None = None) -> JobCost:
        """Start metering a new job, reporting progress to `sink`; return its (empty) cost."""
        self.cost, self.sink = JobCost(), sink
        return self.cost

    def chat(self, messages: list[dict[str, str]], **options: Any) -> str:
        """The inner `chat(messages, **options)`, metered. An `on_token` in `options` still gets every report."""
        return self._metered(self.inner.chat, self._reports, messages, options, lambda text: text)

    def _complete(self, messages: list[dict[str, str]], **options: Any) -> Any:
        """The inner binding's `complete(messages, **options)`, metered like `chat` (its result's `text` is what
        came out); present only when the inner binding has one."""
        return self._metered(self.inner.complete, self._complete_reports, messages, options,
                             lambda result: getattr(result, "text", None))

    def _metered(self, call: Callable[..., Any], reports: bool, messages: list[dict[str, str]],
                 options: dict[str, Any], text_of: Callable[[Any], Any]) -> Any:
        caller = options.pop("on_token", None)
        max_tokens = options.get("max_tokens")
        last: list[GenerationProgress] = []

        def relay(progress: GenerationProgress) -> None:
            last[:1] = [progress]
            if self.sink is not None:
                self.sink(progress, max_tokens)
            if caller is not None:
                caller(progress)
            if self.stop is not None and self.stop.requested is not None:  # a binding that does not check the stop
                raise WorkerStopped(self.stop.requested, _stage(progress))  # itself ends at its next report

        self.cost.model_calls += 1
        result = None
        try:
            result = self._step(lambda: call(messages, **options, on_token=relay) if reports
                                else call(messages, **options), "while the model ran")
            return result
        finally:
            self._account(messages, last[0] if last else None, None if result is None else text_of(result))

    def _account(self, messages: list[dict[str, str]], progress: GenerationProgress | None, text: str | None) -> None:
        if progress is not None:
            self.cost.estimated = self.cost.estimated or progress.estimated
            self.cost.prompt_tokens += progress.prompt_tokens
            self.cost.generated_tokens += progress.generated_tokens
        elif isinstance(text, str):  # a binding that does not report: count what went in and came out
            self.cost.estimated = True
            self.cost.prompt_tokens += sum(self.inner.count_tokens(str(m.get("content", ""))) for m in messages)
            self.cost.generated_tokens += self.inner.count_tokens(text)

    def close(self) -> None:
        """Close the inner binding."""
        self.inner.close()


def _stage(progress: GenerationProgress) -> str:
    """Where a model call reporting `progress` stands, worded as the llama.cpp binding words its interruptions."""
    if progress.evaluated_tokens is not None:
        return f"while evaluating the prompt ({progress.evaluated_tokens} of {progress.prompt_tokens} tokens)"
    return f"while generating (after {progress.generated_tokens} tokens)"


def interruption(exc: BaseException | None) -> str:
    """What the `GenerationInterrupted` in `exc`'s chain (its causes and contexts) says, or "" without one."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, GenerationInterrupted):
            return str(exc)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return ""
