"""Token budgets from a bound model: its effective context window and a per-event token counter.

The worker and `emelex memory compact` both size work with these, so a
compaction planned from the command line fits the model the worker will run:
the window is the binding's allocated context capped by the
`model_max_context_tokens` setting, and events are counted with the model's own
tokenizer as `event_text(event)` plus a per-event template allowance. Every
call into the binding is made here, so a failing binding becomes a one-line
`PluginHookError` naming its plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from emelex_memory import Event, InstalledModel, PluginHookError
from emelex_memory.snapshots.installed import revalidate, snapshot_mutation_lock

from ..settings import WorkerSettings
from ..models import ModelManager
from ..host.types import ModelBinding, event_text
from ..host.manager import bind_model, get_plugin_manager, plugin_call

EVENT_OVERHEAD_TOKENS = 4  # chat-template tokens around each event line, a generous allowance

T = TypeVar("T")


def binding_call(plugin: str, what: str, call: Callable[[], T]) -> T:
    """Run `call` (one use of a model binding) through `plugin_call`: a failure is a `PluginHookError` naming
    `plugin` and `what` was being done."""
    return plugin_call(call, f"the model binding of plugin {plugin!r} failed to {what}")


def context_window(binding: ModelBinding, plugin: str, settings: WorkerSettings) -> int:
    """The binding's allocated context (loading the model if it is lazy), capped by `model_max_context_tokens`."""
    window = binding_call(plugin, f"load model {binding.model.name!r}", lambda: binding.context_window)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise PluginHookError(f"the model binding of plugin {plugin!r} reported a context window of {window!r} tokens")
    return min(window, settings.model_max_context_tokens)


def count_text(binding: ModelBinding, plugin: str, text: str) -> int:
    """Tokens of `text` under the binding's tokenizer."""
    return binding_call(plugin, "count tokens", lambda: binding.count_tokens(text))


def event_counter(binding: ModelBinding, plugin: str) -> Callable[[Event], int]:
    """A `TokenCounter` for planning and source checks: the model's tokens of `event_text(event)` plus a per-event
    template allowance."""

    def count(event: Event) -> int:
        return count_text(binding, plugin, event_text(event)) + EVENT_OVERHEAD_TOKENS

    return count


@dataclass(frozen=True)
class ModelBudget:
    """What planning needs from a bound model: the model, its effective context window and its event counter."""

    model: InstalledModel
    plugin: str
    context_window: int
    count_tokens: Callable[[Event], int]


@contextmanager
def default_model_budget(settings: WorkerSettings) -> Iterator[ModelBudget]:
    """Bind the installed `default_model` through the plugins, as the worker would, for planning only.

    The snapshot is revalidated under the snapshot-mutation lock (a tampered
    model is `ModelTamperedError` and never loaded); the binding then loads
    the model for its tokenizer and context window, runs no inference, and is
    closed when the block ends. Raises the model's or the plugins' typed
    errors (`ModelNotInstalledError`, `PluginHookError`, ...).
    """
    with ModelManager(settings) as manager:
        model = manager.default()
    pm = get_plugin_manager(settings)
    with snapshot_mutation_lock(settings.home_dir, timeout_s=settings.model_lock_timeout_s):
        model = revalidate(model)
    plugin, binding = bind_model(pm, model, settings)
    try:
        window = context_window(binding, plugin, settings)
        yield ModelBudget(model, plugin, window, event_counter(binding, plugin))
    finally:
        binding_call(plugin, "close the model", binding.close)
