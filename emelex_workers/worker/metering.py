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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emelex_memory import InstalledModel

from ..host.manager import accepts_keyword
from ..host.types import GenerationProgress, ModelBinding

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
    (when set) sees every progress report. `begin_job()` starts a new job's cost."""

    def __init__(self, inner: ModelBinding) -> None:
        """Wrap `inner`; nothing is loaded."""
        self.inner = inner
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
        """The inner binding's context window."""
        return self.inner.context_window

    def count_tokens(self, text: str) -> int:
        """The inner binding's token count of `text`."""
        return self.inner.count_tokens(text)

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

        self.cost.model_calls += 1
        result = None
        try:
            result = call(messages, **options, on_token=relay) if reports else call(messages, **options)
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
