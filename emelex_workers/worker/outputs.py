"""What the worker accepts from a summarizer or a distiller, in one place: the worker applies it to every job and
the plugin test kit (`emelex_workers.plugin_testing`) to a plugin's output in a test, so a plugin that passes its
tests meets the same checks when `emelex memory work` runs it.

A Summary must be text (a `str` that is not blank) within the job's budget under the model's tokenizer, then the
faithfulness guards clean it (`guard_summary`). A distiller's proposals are read lazily, at most one over the most
a job may read, then guarded (`guard_candidates`) and validated (`validate_result`). `EstimatedBinding` is the
model a summarizer or distiller declared `needs_model=False` gets: it counts tokens by an estimate and refuses to
generate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

from emelex_memory import DistillationResult, Event, InstalledModel, Job, PermanentJobError, PluginHookError

from ..faithfulness.guards import guard_candidates, guarded_summary, summary_cuts

BYTES_PER_TOKEN = 4  # the estimate of a model-free run, as for a source whose tokens were not counted


def component_name(kind: str, name: str, plugin: str) -> str:
    """How a diagnostic names a summarizer or distiller: `summarizer 'x' of plugin 'y'`."""
    return f"{kind} {name!r} of plugin {plugin!r}"


def checked_summary(text: object, *, named: str, budget: int, count: Callable[[str], int], job: Job,
                    events: Sequence[Event], examples: Sequence[str], model_called: bool) -> tuple[str, dict[str, int]]:
    """The Summary `text` a summarizer (`named`) returned, checked and guarded: `PluginHookError` when it is not a
    non-blank `str` or is over `budget` tokens (`count`), else what the faithfulness guards keep (or their typed
    error) and what they cut (`summary_cuts`)."""
    if not isinstance(text, str):
        raise PluginHookError(f"{named} returned a {type(text).__name__}, not the Summary text (a str)")
    if not text.strip():
        raise PluginHookError(f"{named} returned no text")
    if count(text) > budget:
        raise PluginHookError(f"{named} exceeded the Summary budget of {budget} tokens")
    check = guarded_summary(text, job=job, events=events, examples=examples, model_called=model_called)
    return check.text, summary_cuts(check)


def read_proposals(proposals: Any) -> Any:
    """A distiller's proposals read into a list, at most one over the most a job may read; anything that is not
    an iterable is returned as it is (for validation to refuse)."""
    from emelex_memory.knowledge.distillation import MAX_RAW_CANDIDATES

    if isinstance(proposals, (str, bytes)) or not isinstance(proposals, Iterable):
        return proposals
    return list(islice(proposals, MAX_RAW_CANDIDATES + 1))


def checked_candidates(proposals: Any, *, events: Sequence[Event], examples: Sequence[str]) -> DistillationResult:
    """The faithful, valid candidates of `proposals` (read by `read_proposals`) with the counts of those dropped;
    `InvalidCandidateError` for a batch that is not candidates or is too large."""
    from emelex_memory.knowledge.distillation import validate_result

    return validate_result(guard_candidates(proposals, events=events, examples=examples))


class EstimatedBinding:
    """The model a summarizer or distiller that needs none gets (`needs_model=False`): `count_tokens` estimates 4
    UTF-8 bytes a token, `context_window` is the `model_max_context_tokens` setting, and `chat` is a
    `PermanentJobError` (the plugin said it makes no model call). `model` is None."""

    model: InstalledModel | None = None

    def __init__(self, window: int, named: str = "the plugin") -> None:
        """An estimate with a window of `window` tokens for `named`."""
        self._window = window
        self._named = named

    @property
    def context_window(self) -> int:
        """The window the estimate allows."""
        return self._window

    def count_tokens(self, text: str) -> int:
        """`text`'s UTF-8 bytes / 4, rounded up."""
        return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
             **_: Any) -> str:
        """Refused: the plugin declared it needs no model."""
        raise PermanentJobError(f"{self._named} declared needs_model=False but called the model; declare "
                                "needs_model=True (the default) to have one")

    def close(self) -> None:
        """Nothing to free."""
