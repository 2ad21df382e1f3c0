"""Inference: threads that fit the machine as it is, and prompts evaluated once, on the default model.

- tokens per second by thread count (1..the usable CPUs): a fixed prompt evaluated from an empty context, then
  tokens generated greedily (`LlamaBinding.measure_threads`);
- a job (`JOB_PROMPT` prompt tokens evaluated, `JOB_TOKENS` generated) at the chosen default
  (`threads.thread_choice`, read afresh at the start of each phase) against every fixed thread count, `ROUNDS`
  rounds alternating the counts, medians; quiet (no load of ours) and under a synthetic background load (a busy
  process per usable CPU, started and stopped by the bench, each ending itself after `LOAD_DEADLINE_S`). Target:
  the default's time within 10% of the fastest count's in both;
- time to first token on resuming a Session of ~3k tokens in a fresh binding: cold (the whole prompt evaluated)
  against its saved state (`load_session_state`, the state read from the store and loaded). Target: at least 5x
  faster with the state;
- prefix reuse per round: rounds of a growing conversation in one binding, the prompt tokens each round evaluated
  (`last_reuse`) against what was new since the round before. Target: never more than that, plus one.

Writes the `inference` section of benchmarks/RESULTS.md; exits 1 on a miss. The machine is shared: one run's
figures are noisy, the thread comparisons most of all.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from results import Figures, render_list

from emelex_memory import MemoryStore
from emelex_workers.models import ModelManager
from emelex_workers.models.threads import read_machine, thread_choice
from emelex_workers.settings import WorkerSettings

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
JOB_PROMPT, JOB_TOKENS = 192, 16
LOAD_DEADLINE_S = 600.0
SECTIONS = ("inference",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "plugins/emelex_llamacpp",
    "emelex_workers/models/threads.py",
)
SCHEMA = {"type": "string", "maxLength": 60}
FACT = ("The worker compacts a Session when its history nears the context window, then distills Knowledge from "
        "it; every Summary quotes the transcript, and every entry cites the events it came from. ")
ABOUT = """Produced by `python benchmarks/bench_inference.py` on the embedded default model (SmolLM2-135M-Instruct,
Q4_1, through llama.cpp). A job: a {prompt}-token prompt evaluated from an empty context and {tokens} tokens
generated, {rounds} rounds alternating the thread counts, medians. The load: one busy process per usable CPU,
started by the bench. The default is `model_threads` as chosen at the start of each phase
(`emelex_workers/models/threads.py`). The machine is a 2-core VM shared with other engineers' work: these
figures are noisy, the thread comparisons most of all (the "quiet" phase is only free of the bench's own load)."""


def render(figures: dict) -> str:
    """The `inference` section: the target figures, then the tokens-per-second table and the rounds' reuse."""
    rows = "\n".join(f"| {r['threads']} | {r['prompt_tps']:.1f} | {r['generate_tps']:.1f} |" for r in figures["tps"])
    reuse = "\n".join(f"| {i + 1} | {r['prompt_tokens']} | {r['new']} | {r['evaluated']} |"
                      for i, r in enumerate(figures["rounds"]))
    about = ABOUT.format(prompt=figures["job_prompt"], tokens=figures["job_tokens"], rounds=figures["job_rounds"])
    return render_list("Inference (`bench_inference.py`)", f"""Tokens per second by thread count (quiet phase):

| threads | prompt tok/s | generation tok/s |
| --- | --- | --- |
{rows}

Prompt tokens per round of one conversation in one binding:

| round | prompt tokens | new since the round before | evaluated |
| --- | --- | --- | --- |
{reuse}

{about}
""", figures)


def _busy(n: int) -> list[subprocess.Popen]:
    code = f"import time\nend = time.monotonic() + {LOAD_DEADLINE_S}\nwhile time.monotonic() < end: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait(timeout=30)


def _job_phase(binding, figures: Figures, settings: WorkerSettings, counts: list[int], name: str) -> dict:
    """Each fixed count's median job time, the default's, and the figure of the default against the fastest."""
    choice = thread_choice(settings, machine=read_machine)
    times: dict[int, list[float]] = {t: [] for t in counts}
    for i in range(ROUNDS):
        for t in counts[i % len(counts):] + counts[:i % len(counts)]:
            times[t].append(binding.measure_threads(t, prompt_tokens=JOB_PROMPT, max_tokens=JOB_TOKENS)["seconds"])
    medians = {t: statistics.median(v) for t, v in times.items()}
    fastest = min(medians, key=medians.get)
    ratio = medians[choice.threads] / medians[fastest]
    detail = ", ".join(f"{t} thread{'s' * (t > 1)} {s:.2f} s" for t, s in medians.items())
    figures.add(f"job time {name}, the default ({choice.threads}) against the fastest ({fastest})", ratio, "<=", 1.10,
                format=".2f", unit="x", detail=f"{detail}; chosen because {choice.reason}")
    return {"chosen": choice.threads, "medians": medians}


def _conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You answer in a few words."}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"Note {i}: {FACT}"}, {"role": "assistant", "content": "Noted."}]
    return [*messages, {"role": "user", "content": "What does the worker do?"}]


def _first_token(binding, messages: list[dict]) -> float:
    started = time.perf_counter()
    binding.stream_chat(messages, max_tokens=1, json_schema=SCHEMA, stop=threading.Event())
    return time.perf_counter() - started


def main() -> int:
    from emelex_llamacpp.binding import LlamaBinding

    figures = Figures("inference", render)
    with tempfile.TemporaryDirectory(prefix="emelex-bench-inference-") as tmp:
        home, workspace = Path(tmp) / "home", Path(tmp) / "workspace"
        workspace.mkdir()
        settings = WorkerSettings(home=home)
        with ModelManager(settings) as manager:
            model = manager.ensure_default(link=True)[0]
        counts = list(range(1, (read_machine(probe_s=0).usable_cpus or 1) + 1))

        def bind(threads: int = 1) -> LlamaBinding:
            binding = LlamaBinding(model, max_context=4096, threads=threads, home=home)
            binding.context_window  # noqa: B018 - load the model before anything is timed
            return binding

        binding = bind()
        try:
            tps = [binding.measure_threads(t, prompt_tokens=256, max_tokens=32) for t in counts]
            quiet = _job_phase(binding, figures, settings, counts, "quiet")
            load = _busy(len(counts))
            try:
                time.sleep(1.0)
                loaded = _job_phase(binding, figures, settings, counts, "under a busy process per CPU")
            finally:
                _stop(load)
            rounds = []
            previous = 0
            messages = _conversation(2)
            for i in range(4):
                binding.stream_chat(messages, max_tokens=8, json_schema=SCHEMA, stop=threading.Event())
                reuse = binding.last_reuse
                rounds.append({"prompt_tokens": reuse.prompt_tokens, "evaluated": reuse.evaluated,
                               "new": reuse.prompt_tokens - previous})
                previous = reuse.prompt_tokens
                messages = [*messages, {"role": "assistant", "content": "It compacts and distills."},
                            {"role": "user", "content": f"And step {i}?"}]
        finally:
            binding.close()
        later = rounds[1:]
        worst = max(r["evaluated"] - r["new"] for r in later)
        figures.add("prompt tokens evaluated per round beyond those new since the round before (worst of rounds 2-4)",
                    worst, "<=", 1, format="d", detail=f"rounds 2-4 evaluated {sum(r['evaluated'] for r in later)} of "
                                                       f"{sum(r['prompt_tokens'] for r in later)} prompt tokens")

        history = _conversation(60)
        with MemoryStore.open(settings) as store:
            session = store.create_session(workspace)
            first = bind()
            try:
                with store.acquire_lease(session.id, workspace, ttl_s=3600) as lease:  # nothing renews it here
                    list(lease.replay_all())
                    first.stream_chat(history, max_tokens=4, json_schema=SCHEMA, stop=threading.Event())
                    saved = first.save_session_state(store, lease)
            finally:
                first.close()
            resumed = [*history, {"role": "assistant", "content": "It compacts."}, {"role": "user", "content": "Why?"}]
            cold = bind()
            try:
                cold_s = _first_token(cold, resumed)
                prompt = cold.last_reuse.prompt_tokens
            finally:
                cold.close()
            warm = bind()
            try:
                with store.acquire_lease(session.id, workspace, ttl_s=3600) as lease:  # nothing renews it here
                    list(lease.replay_all())
                    started = time.perf_counter()
                    warm.load_session_state(store, session.id)
                    warm_s = time.perf_counter() - started + _first_token(warm, resumed)
                    outcome = warm.state_outcome
            finally:
                warm.close()
        figures.add(f"time to first token resuming a Session of {prompt} prompt tokens, cold / with its saved state",
                    cold_s / warm_s, ">=", 5, format=".1f", unit="x",
                    detail=f"cold {cold_s:.2f} s, with the state {warm_s:.2f} s ({saved}; {outcome})")
    extra = {"tps": tps, "rounds": rounds, "quiet": quiet, "loaded": loaded, "job_prompt": JOB_PROMPT,
             "job_tokens": JOB_TOKENS, "job_rounds": ROUNDS}
    return _write(figures, extra)


def _write(figures: Figures, extra: dict) -> int:
    """Publish the figures with the tables' data; 1 when a target was missed."""
    from results import publish

    text = publish(figures.name, render, {"figures": figures.figures, **extra})
    print(text)
    missed = figures.missed()
    if missed:
        print(f"missed: {'; '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
