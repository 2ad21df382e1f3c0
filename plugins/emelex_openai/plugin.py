"""The built-in served-model plugin: a `ModelBinding`/`AgentBinding` for models an OpenAI-compatible server serves.

Registered through the `emelex` entry-point group exactly like a third-party
plugin (name "openai"). It answers `model_binding` for installed models of
kind "served" (`emelex models add-server`) and passes on every other model.
httpx (the `openai` extra) is imported only when a binding first talks to
its server, so the plugin loads without it.
"""

from __future__ import annotations

import threading

from emelex_memory import InstalledModel
from emelex_workers.plugin_api import WorkerSettings
from emelex_workers.hookspecs import hookimpl

from .binding import ServedBinding

NAME = "openai"
__all__ = ["NAME", "ServedBinding", "model_binding"]


@hookimpl
def model_binding(model: InstalledModel, settings: WorkerSettings, stop: threading.Event) -> ServedBinding | None:
    """Bind a served model (its requests stop once `stop` is set); pass on anything else."""
    if model.kind != "served" or model.server is None:
        return None
    return ServedBinding(model, settings, stop=stop)


@hookimpl
def embedder(settings: WorkerSettings):
    """The "openai" embedder (a served /v1/embeddings endpoint, see `embedding.py`) when the `embedder` setting
    names it."""
    if settings.embedder != NAME:
        return None
    from .embedding import served_embedder

    return served_embedder(settings)
