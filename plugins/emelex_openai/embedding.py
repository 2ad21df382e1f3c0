"""The "openai" embedder: a served `/v1/embeddings` endpoint (Ollama, llama-server, vLLM, llama-cpp-python's
server), at `embedding_url` (the server's base URL, with or without `/v1`), for the model `embedding_model`, through
the same bounded, retried client as served models (httpx, the `openai` extra). A reply of one vector per token
(llama-cpp-python's server, for a model without a pooling layer) is mean-pooled."""

from __future__ import annotations

from collections.abc import Sequence

from emelex_memory import ModelServerReplyError, ServedEndpoint
from emelex_workers.plugin_api import Embedder, WorkerSettings

from .client import ServerClient

BATCH = 32  # texts per request


def _pooled(embedding: object) -> object:
    """A vector as given, or the mean of one vector per token (llama-cpp-python's server answers so for a model
    without a pooling layer)."""
    if isinstance(embedding, list) and embedding and all(isinstance(row, list) and row for row in embedding):
        width = len(embedding[0])
        if all(len(row) == width for row in embedding):
            return [sum(column) / len(embedding) for column in zip(*embedding)]
    return embedding


def served_embedder(settings: WorkerSettings) -> Embedder:
    """The "openai" embedder of `embedding_url` and `embedding_model`; `ModelServerReplyError` names a missing one."""
    if not settings.embedding_url or not settings.embedding_model:
        raise ModelServerReplyError("the openai embedder needs embedding_url (the server's base URL) and "
                                    "embedding_model (its model name): set both")
    url = settings.embedding_url.rstrip("/").removesuffix("/v1")
    client = ServerClient(ServedEndpoint(url, settings.embedding_model, None, False, 0), settings)

    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        vectors: list[Sequence[float]] = []
        for start in range(0, len(texts), BATCH):
            batch = texts[start:start + BATCH]
            reply = client.post_json("/v1/embeddings", {"model": settings.embedding_model, "input": batch})
            data = reply.get("data") if isinstance(reply, dict) else None
            if not isinstance(data, list) or len(data) != len(batch):
                raise ModelServerReplyError(f"the server at {url} answered /v1/embeddings without one embedding per "
                                            "input; check that the model is an embedding model")
            vectors += [_pooled(item.get("embedding")) for item in sorted(data, key=lambda item: item.get("index", 0))]
        return vectors

    return Embedder(f"openai:{settings.embedding_model}", embed, client.close)
