"""Hook specifications of the "emelex" plugin project (pluggy).

Plugins implement these with `@hookimpl` and are found through the `emelex`
entry-point group; the built-in llama.cpp plugin registers on the same hooks.
Every hook is keyword-called: an implementation may accept any subset of the
arguments, by name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

from emelex_memory import InstalledModel

from ..settings import WorkerSettings
from .types import Distiller, Embedder, ModelBinding, ModelCheck, Summarizer

if TYPE_CHECKING:
    from .policies import TurnPolicy
    from .tools import ToolSpec

PROJECT_NAME = "emelex"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_summarizers(register: Callable[[Summarizer], None]) -> None:
    """Add summarizers: call `register(Summarizer(name, summarize))` once for each. Return nothing.

    Summarizer names are unique across all plugins; registering a name twice
    is a `PluginHookError` naming both plugins. The worker uses the one named
    by the `summarizer` setting.
    """


@hookspec
def register_distillers(register: Callable[[Distiller], None]) -> None:
    """Add distillers: call `register(Distiller(name, distill))` once for each. Return nothing.

    Names are unique across plugins, as for summarizers. The worker uses the
    one named by the `distiller` setting.
    """


@hookspec
def register_tools(register: Callable[[ToolSpec], None]) -> None:
    """Add agent tools: call `register(ToolSpec(...))` once for each. Return nothing.

    Tool names match [a-z][a-z0-9_]{0,47} and are unique across all plugins;
    an invalid spec or a name registered twice is a `PluginHookError` naming
    the plugin (both plugins for a clash). See `emelex_workers.agent.tools`.
    """


@hookspec
def register_policies(register: Callable[[TurnPolicy], None]) -> None:
    """Add turn policies: call `register(policy)` once for each, an instance of a `TurnPolicy` subclass
    (`emelex_workers.plugin_api`). Return nothing.

    A policy decides how a chat turn is guided (which tools a round offers, its arguments, a free or a quoted
    answer, when an answer is forced); its name matches [a-z][a-z0-9_]{0,47} and is unique across plugins and
    the built-in policies ("guided", "open", "narrowed"): a clash is a `PluginHookError` naming both. `emelex
    chat --policy NAME` (or the `chat_policy` setting) starts a Session under it, and the Session's snapshot
    records its name and version, so a resume needs the same plugin version.
    """


@hookspec(firstresult=True)
def model_binding(model: InstalledModel, settings: WorkerSettings, stop: threading.Event) -> ModelBinding | None:
    """Return a `ModelBinding` that runs `model`, or None to pass. The first non-None result wins.

    Called once per worker run (and per chat), after Emelex validated the
    snapshot. Return quickly: load the weights lazily, on the binding's first
    use. `stop` is set when the user asks the process to stop (SIGINT,
    SIGTERM, Ctrl-C while the chat loads its model): check it while loading
    the model, evaluating a prompt and generating, and once it is set raise
    `GenerationInterrupted` saying where it stopped; a binding that ignores it
    is stopped when its call returns. The built-in llama.cpp plugin answers
    for any GGUF file; mark an implementation `@hookimpl(tryfirst=True)` to
    answer before it.
    """


@hookspec(firstresult=True)
def check_model(model: InstalledModel, settings: WorkerSettings) -> ModelCheck | None:
    """Try `model` on this machine and return a `ModelCheck`, or None to pass. The first non-None result wins.

    `emelex memory doctor` calls it for the worker's default model. It may
    take seconds (the built-in llama.cpp plugin generates a few tokens in a
    child process) and reports what the model does as a failed check, never
    as an exception.
    """


@hookspec(firstresult=True)
def embedder(settings: WorkerSettings) -> Embedder | None:
    """Return the `Embedder` the `embedder` setting names, or None to pass. The first non-None result wins.

    Called when the worker embeds what the search index holds and when a
    search embeds its query, only with the `embedder` setting set. Return
    quickly: load the model lazily, on the first `embed`. The built-in
    plugins answer for "llamacpp" (a local GGUF embedding model,
    `embedding_model` its path) and "openai" (a served `/v1/embeddings`
    endpoint at `embedding_url`, `embedding_model` its model name).
    """
