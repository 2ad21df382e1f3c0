"""Thread advice: how many model threads, from which setting source, on how many usable CPUs, and how busy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_memory import Settings
from emelex_workers.models.threads import thread_advice


def test_the_advice_says_the_threads_their_source_and_the_usable_cpus(home: Path) -> None:
    advice = thread_advice(Settings(home=home), loadavg=lambda: (0.25, 0.0, 0.0))
    cpus = len(os.sched_getaffinity(0))
    assert (advice.threads, advice.source, advice.usable_cpus, advice.load) == (2, "default", cpus, 0.25)
    assert advice.line().startswith(f"model threads: 2 (model_threads, default); this process may use {cpus} CPUs; "
                                    "load average 0.2")


def test_busy_cores_are_warned_about(home: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    advice = thread_advice(Settings(home=home, model_threads=1), loadavg=lambda: (cpus + 0.5, 0.0, 0.0))
    assert advice.source == "argument"
    assert advice.warnings == (f"the load average ({cpus + 0.5:.1f}) shows all {cpus} CPU{'s' * (cpus > 1)} this "
                               "process may use busy: generation may be many times slower; run the worker when the "
                               "machine is quieter",)
    assert advice.line().endswith("; warning: " + advice.warnings[0])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_the_usable_cpus_are_this_process_affinity_not_the_machine(home: Path) -> None:
    child = ("import json, os, sys\n"
             "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
             "from emelex_memory import Settings\n"
             "from emelex_workers.models.threads import thread_advice\n"
             "print(json.dumps(thread_advice(Settings(home=sys.argv[1])).as_dict()))\n")
    env = {**os.environ, "EMELEX_MODEL_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", child, str(home)], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    advice = json.loads(out)
    assert advice["usable_cpus"] == 1 and advice["source"] == "environment EMELEX_MODEL_THREADS"
    assert advice["warnings"][0] == "2 threads on 1 CPU contend with each other; set model_threads to at most 1"
