"""How a plugin's job is stopped at its deadline: what each way costs per job, and how soon each stops a hung one.

Three ways to run a summarizer so that the worker can stop it (docs/plugins.md, "Bounded jobs"):

- in-process (what the worker does): the plugin runs on the worker's thread inside `GracefulStop.deadline` and
  `interruptible`: a SIGALRM timer raises `JobDeadline` where its Python code runs, a model call stops through the
  flag its binding checks;
- a worker thread per job: the plugin runs on a new thread the worker joins with a timeout; at the deadline the
  worker can only walk away: the thread runs on (Python cannot stop a thread), holding the model;
- a child process per job (fork): the plugin runs in a forked child that sends the Summary back through a pipe;
  at the deadline the worker kills it. (A model loaded in the worker cannot be shared with a child: the child
  would have to load its own, seconds per job for the default model, not counted here.)

Each way runs the same trivial summarizer (what it adds per job, beside the direct call, the baseline), rounds
alternating the four; then each runs a summarizer that hangs in plain Python with a 0.2 s deadline, and the time
from the deadline to the worker holding the outcome is measured (the thread: to the worker giving up on it).
Writes the `job-stopping` section of benchmarks/RESULTS.md. Targets: the in-process deadline adds at most 1 ms a
job, and stops a hung plugin within 1.5 s of its deadline.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import threading
import time

from results import met, publish, verdict

from emelex_workers import plugin_testing as kit
from emelex_workers.plugin_api import Summarizer
from emelex_workers.worker.stopping import GracefulStop, JobDeadline

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "200"))
STOP_TRIALS = int(os.environ.get("BENCH_STOP_TRIALS", "5"))
DEADLINE_S = 0.2
OVERHEAD_TARGET_MS = 1.0
STOP_TARGET_S = 1.5
SECTIONS = ("job-stopping",)
MEASURES = ("emelex_workers/worker/stopping.py", "emelex_workers/worker/work.py")
REQUEST = kit.summary_request([("user", "Which database?"), ("assistant", "SQLite.")] * 4)
FORK = multiprocessing.get_context("fork")


def summarize(request) -> str:
    return "The user asked: " + " / ".join(e.payload["text"] for e in request.events if e.kind == "user")


def hang(request) -> str:
    while True:
        time.sleep(0.01)


def direct(call, deadline: float) -> object:
    return call(REQUEST)


def in_process(call, deadline: float) -> object:
    stop = GracefulStop()
    try:
        with stop.deadline(deadline, "job"), stop.interruptible():
            return call(REQUEST)
    except JobDeadline:
        return "stopped"


def worker_thread(call, deadline: float) -> object:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call(REQUEST)), daemon=True)
    thread.start()
    thread.join(deadline)
    return out[0] if out else "abandoned"


def _child(call, conn) -> None:
    conn.send(call(REQUEST))
    conn.close()


def child_process(call, deadline: float) -> object:
    parent, child = FORK.Pipe(duplex=False)
    process = FORK.Process(target=_child, args=(call, child), daemon=True)
    process.start()
    child.close()
    try:
        if parent.poll(deadline):
            return parent.recv()
        process.kill()
        return "killed"
    finally:
        process.join(5)
        parent.close()


WAYS = {"direct": direct, "in-process": in_process, "thread": worker_thread, "process": child_process}


def measure() -> dict:
    """Per-job microseconds of each way on the trivial summarizer (rounds alternating), and seconds from the
    deadline to the outcome for the hanging one."""
    times: dict[str, list[float]] = {name: [] for name in WAYS}
    names = list(WAYS)
    for i in range(ROUNDS):
        for name in names[i % len(names):] + names[: i % len(names)]:
            start = time.perf_counter()
            assert WAYS[name](summarize, 60.0) == summarize(REQUEST)
            times[name].append((time.perf_counter() - start) * 1e6)
    stops: dict[str, list[float]] = {name: [] for name in names[1:]}
    for _ in range(STOP_TRIALS):
        for name in names[1:]:
            start = time.perf_counter()
            assert WAYS[name](hang, DEADLINE_S) in ("stopped", "abandoned", "killed")
            stops[name].append(time.perf_counter() - start - DEADLINE_S)
    us = {name: statistics.median(t) for name, t in times.items()}
    return {"rounds": ROUNDS, "stop_trials": STOP_TRIALS, "us": us,
            "overhead_us": {name: statistics.median(a - b for a, b in zip(times[name], times["direct"]))
                            for name in names[1:]},
            "stop_s": {name: max(s) for name, s in stops.items()}}


def render(figures: dict) -> str:
    """The `job-stopping` section of the recorded `figures`."""
    us, over, stop = figures["us"], figures["overhead_us"], figures["stop_s"]
    return f"""## Stopping a job at its deadline (`bench_job_stopping.py`)

Measured {figures['measured']}. A trivial summarizer run {figures['rounds']} times each way, rounds alternating the ways;
medians. Baseline: the direct call. Then a summarizer hanging in plain Python, deadline {DEADLINE_S} s,
{figures['stop_trials']} trials each: the slowest time from the deadline to the worker holding the outcome.
Produced by `python benchmarks/bench_job_stopping.py`.

| way | per job | added to the direct call | a hung plugin | after its deadline |
| --- | --- | --- | --- | --- |
| direct call (baseline) | {us['direct']:.1f} µs | | cannot be stopped | |
| in-process deadline (the worker's) | {us['in-process']:.1f} µs | {over['in-process']:.1f} µs | stopped where it runs | {stop['in-process']:.3f} s |
| a worker thread per job | {us['thread']:.1f} µs | {over['thread']:.1f} µs | abandoned, runs on | {stop['thread']:.3f} s |
| a child process per job (fork) | {us['process']:.1f} µs | {over['process']:.1f} µs | killed | {stop['process']:.3f} s |

Targets: what the in-process deadline adds to a job, in ms, {verdict(over['in-process'] / 1000, '<=', OVERHEAD_TARGET_MS)}; how
long after its deadline it stops a hung plugin, in seconds, {verdict(stop['in-process'], '<=', STOP_TARGET_S)}.

The worker stops a plugin in process: it costs next to nothing per job and stops plain Python code (a loop, a sleep,
a blocking read) where it runs, and a model call through the flag the binding checks. A thread cannot be stopped
at all; a child process can be killed, but costs a fork per job and cannot share the worker's loaded model.
"""


def main() -> int:
    if sys.platform == "win32":
        print("bench_job_stopping needs fork and SIGALRM")
        return 1
    figures = measure()
    print(publish("job-stopping", render, figures))
    ok = met(figures["overhead_us"]["in-process"] / 1000, "<=", OVERHEAD_TARGET_MS) and met(
        figures["stop_s"]["in-process"], "<=", STOP_TARGET_S)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
