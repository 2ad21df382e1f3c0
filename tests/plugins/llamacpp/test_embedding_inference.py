"""The "llamacpp" embedder on real llama.cpp inference (the embedded default model's GGUF in embedding mode): the
worker embeds what the index holds after its jobs, and the search command fuses the query's vector."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from emelex_memory import MemoryStore
from emelex_memory.maintenance.doctor import diagnose
from emelex_workers.cli import app
from emelex_workers.worker.embedding import embedder_of, query_vector
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings

from ...search.test_search_index import say
from ...support.models import require_default_model

require_default_model()


def test_the_worker_embeds_with_a_local_gguf_model_and_search_fuses_it(home: Path, workspace: Path,
                                                                       monkeypatch) -> None:
    settings = WorkerSettings(home=home, plugins_autoload=False, embedder="llamacpp", model_threads=1)
    with MemoryStore.open(settings) as store:
        sid = say(store, workspace, "I bought a second-hand ukulele", "nice", "the weather is strange", "indeed")
        store.remember(workspace, "music", "Grace plays the ukulele")
        report = work(store, settings)
        assert report.embedded == 5 and "; embedded 5 row(s) for search;" in report.summary_line()
        embedder = embedder_of(settings)
        model = embedder.model
        fused = query_vector(embedder, "What instrument does Grace play?")
        embedder.close()
        assert model == "llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf" and len(fused["query_vector"]) == 576
        assert store.embedding_counts(model) == (5, 0)
        hits = store.search(workspace, "What instrument does Grace play?", **fused).hits
        assert len(hits) == 5  # every embedded row is a vector neighbour; the full-text matches lead
        assert hits[0].kind == "knowledge" and hits[0].relevance > 0
        assert work(store, settings).embedded == 0  # nothing pending: nothing embedded again
    assert [c.ok for c in diagnose(settings).checks if c.name == "search vectors"] == [True]
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_EMBEDDER", "llamacpp")
    monkeypatch.setenv("EMELEX_PLUGINS_AUTOLOAD", "0")
    done = CliRunner().invoke(app, ["memory", "search", "ukulele", "-w", str(workspace), "--json"])
    assert done.exit_code == 0, done.output
    hits = json.loads(done.stdout)["hits"]
    assert {h.get("session") for h in hits if h["kind"] == "sessions"} == {sid}
