"""The "llamacpp" embedder on real llama.cpp inference: its default model (all-MiniLM-L6-v2 from a package, written as
GGUF) computes what the original weights compute; texts are embedded in batches; the worker embeds what the index
holds after its jobs, and the search command fuses the query's vector."""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from typer.testing import CliRunner

from emelex_llamacpp import sentence_model
from emelex_memory import InvalidModelError, MemoryStore
from emelex_memory.maintenance.doctor import diagnose
from emelex_workers.cli import app
from emelex_workers.models import default_model_file
from emelex_memory.search.ranking import EVENTS
from emelex_memory.search.vectors import nearest, unit_vector
from emelex_memory.sessions.workspaces import workspace_scope
from emelex_workers.worker.embedding import embed_pending, embedder_of, query_vector
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings

from ...search.test_search_index import say
from ...support.models import require_default_model, require_sentence_model

require_default_model()
require_sentence_model()


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
        fused = query_vector(embedder, store, workspace, "What instrument does Grace play?")
        embedder.close()
        assert model == "llamacpp:all-MiniLM-L6-v2" and len(fused["query_vector"]) == 384
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


def _layer_norm(x, weight, bias):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-12) * weight + bias


def _reference(weights: dict, ids: list[int]) -> np.ndarray:
    """all-MiniLM-L6-v2 computed from its original float32 weights in numpy (BERT, mean-pooled, unit length)."""
    n, heads = len(ids), 12
    x = weights["embeddings.word_embeddings.weight"][ids] + weights["embeddings.position_embeddings.weight"][:n] \
        + weights["embeddings.token_type_embeddings.weight"][0]
    x = _layer_norm(x, weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
    erf = np.vectorize(math.erf)
    for layer in range(6):
        def w(name, value):
            p = f"encoder.layer.{layer}.{name}"
            return value @ weights[p + ".weight"].T + weights[p + ".bias"]

        q, k, v = (w(f"attention.self.{m}", x).reshape(n, heads, -1).transpose(1, 0, 2) for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(n, -1)
        p = f"encoder.layer.{layer}."
        x = _layer_norm(w("attention.output.dense", a) + x, weights[p + "attention.output.LayerNorm.weight"],
                        weights[p + "attention.output.LayerNorm.bias"])
        h = w("intermediate.dense", x)
        x = _layer_norm(w("output.dense", 0.5 * h * (1 + erf(h / math.sqrt(2)))) + x,
                        weights[p + "output.LayerNorm.weight"], weights[p + "output.LayerNorm.bias"])
    e = x.mean(0)
    return e / np.linalg.norm(e)


TEXTS = ["What instrument does Grace play?", "Grace plays the ukulele", "the weather is strange today"]


def test_the_default_model_computes_what_its_original_weights_compute(home: Path) -> None:
    from llama_cpp import Llama

    embedder = embedder_of(WorkerSettings(home=home, plugins_autoload=False, embedder="llamacpp", model_threads=1))
    try:
        vectors = np.array(embedder.embed(TEXTS))
    finally:
        embedder.close()
    weights = sentence_model._tensors(sentence_model.packaged_model_dir() / "model.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        with open(path, "wb") as out:
            sentence_model.write_gguf(sentence_model.packaged_model_dir(), out)
        llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        ids = [llm.tokenize(t.encode(), add_bos=True) for t in TEXTS]
        llm.close()
    assert ids[1] == [101, 4519, 3248, 1996, 2866, 9307, 2571, 102]  # [CLS] grace plays the uk ##ule ##le [SEP]
    reference = np.array([_reference(weights, i) for i in ids])
    units = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert min((units * reference).sum(axis=1)) > 0.9999  # float16 weights: the same vectors
    similarity = units @ units.T
    assert similarity[0, 1] > 0.5 > similarity[0, 2]  # a sentence model: the answer is near its question


def test_texts_are_embedded_in_batches_with_the_vectors_of_one_at_a_time(home: Path, monkeypatch) -> None:
    from llama_cpp import Llama

    calls = []
    embed = Llama.embed
    monkeypatch.setattr(Llama, "embed", lambda self, inputs, **kw: calls.append(inputs) or embed(self, inputs, **kw))
    for model in (None, str(default_model_file())):  # a sentence model, and a chat model without pooling
        calls.clear()
        embedder = embedder_of(WorkerSettings(home=home, plugins_autoload=False, embedder="llamacpp", model_threads=1,
                                        embedding_model=model))
        try:
            together = np.array(embedder.embed(TEXTS * 4))
            apart = np.array([embedder.embed([text])[0] for text in TEXTS])
        finally:
            embedder.close()
        if model is None:
            assert len(calls[0]) == 12 and len(calls) == 1 + 3  # one call for the twelve texts
        else:  # llama-cpp-python mixes the token vectors of a batch's texts without pooling: one at a time
            assert len(calls) == 12 + 3
        assert np.allclose(together[:3], apart, atol=1e-3) and np.allclose(together[3:6], apart, atol=1e-3)


def test_weights_that_are_not_the_original_release_are_refused(tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(sentence_model.packaged_model_dir(), copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(InvalidModelError, match="not the original all-MiniLM-L6-v2 weights"):
        sentence_model.write_gguf(copy, io.BytesIO())


def test_a_question_naming_the_person_talked_to_finds_the_answer_by_its_vector(home: Path, workspace: Path) -> None:
    """The name said in every Session's greeting is left out of the query's embedding: the answer's vector is then
    the nearest, not a greeting's (all-MiniLM-L6-v2 ranks "Wow Jon, same here!" first for the whole question)."""
    settings = WorkerSettings(home=home, plugins_autoload=False, embedder="llamacpp", model_threads=1)
    with MemoryStore.open(settings) as store:
        for greeting in ("Evening Jon! Quick catch-up?", "Wow Jon, same here!", "Haha, that's amazing Jon.",
                         "That's so good to hear, Jon!"):
            say(store, workspace, greeting, "Thanks, all good here.")
        answer = say(store, workspace, "Hi Jon, anything new?", "I'm currently reading The Lean Startup.")
        embedder = embedder_of(settings)
        try:
            assert embed_pending(store, embedder) == 10
            fused = query_vector(embedder, store, workspace, "What book is Jon currently reading?")
        finally:
            embedder.close()
        with store.db.read() as conn:
            scope = workspace_scope(conn, workspace)
            ((_, rowid, _),) = nearest(conn, scope, fused["embedding_model"], unit_vector(fused["query_vector"]),
                                       (EVENTS,), limit=1)
            (session, seq) = conn.execute("SELECT s.uuid, e.seq FROM events e JOIN sessions s ON s.id = e.session_id "
                                          "WHERE e.id = ?", (rowid,)).fetchone()
        assert (session, seq) == (answer, 2)
