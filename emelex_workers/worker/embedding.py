"""The embedding pass: the vectors of what the search index holds, written after the worker's jobs, never inside
the transaction that wrote the text (see `emelex_memory/search/vectors.py`).

`embedder_of(settings)` is the `Embedder` the `embedder` setting names (None when it is unset: full text alone);
`embed_pending` embeds the rows without a vector of its model in batches until none is left or a stop asks.
"""

from __future__ import annotations

from collections.abc import Callable

from emelex_memory import MemoryStore, UnknownPluginComponentError

from ..settings import WorkerSettings
from ..host.manager import EmelexPluginManager, get_plugin_manager, plugin_call
from ..host.types import Embedder

BATCH = 32  # texts embedded per call and stored per transaction


def embedder_of(settings: WorkerSettings, pm: EmelexPluginManager | None = None) -> Embedder | None:
    """The embedder the `embedder` setting names, or None when it is unset; `UnknownPluginComponentError` when no
    loaded plugin provides it."""
    if settings.embedder is None:
        return None
    pm = pm or get_plugin_manager(settings)
    found = plugin_call(lambda: pm.hook.embedder(settings=settings), f"embedder {settings.embedder!r}")
    if not isinstance(found, Embedder):
        raise UnknownPluginComponentError(
            f"no loaded plugin provides the embedder {settings.embedder!r} (built-in: llamacpp, openai); install its "
            "plugin or unset EMELEX_EMBEDDER")
    return found


def embed_pending(store: MemoryStore, embedder: Embedder, *, stop: Callable[[], bool] = lambda: False) -> int:
    """Embed every indexed row without a vector of `embedder.model`, `BATCH` at a time, until none is left or `stop()`
    says so; return how many vectors were stored. A plugin failure raises (what was stored before it stays)."""
    stored = 0
    while not stop():
        items = store.pending_embeddings(embedder.model, limit=BATCH)
        if not items:
            break
        vectors = plugin_call(lambda: list(embedder.embed([item.text for item in items])),
                              f"embedder {embedder.model!r}")
        if len(vectors) != len(items):
            raise UnknownPluginComponentError(f"embedder {embedder.model!r} returned {len(vectors)} vectors for "
                                              f"{len(items)} texts; fix or replace its plugin")
        stored += store.put_embeddings(embedder.model, list(zip(items, vectors)))
    return stored


def query_vector(embedder: Embedder | None, query: str) -> dict:
    """The keyword arguments of `MemoryStore.search` that fuse `embedder`'s vector of `query` (none without an
    embedder)."""
    if embedder is None:
        return {}
    (vector,) = plugin_call(lambda: list(embedder.embed([query])), f"embedder {embedder.model!r}")
    return {"query_vector": vector, "embedding_model": embedder.model}
