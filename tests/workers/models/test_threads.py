"""Model threads: chosen from the usable, idle cores unless `model_threads` is set, and said with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_workers.settings import WorkerSettings
from emelex_workers.models.threads import MachineLoad, choose_threads, read_machine, thread_choice


def _machine(cpus: int = 2, *, quota: float | None = None, cores: int | None = None, busy: float | None = 0.0,
             load: float | None = None) -> MachineLoad:
    return MachineLoad(cpus, quota, cores, busy, load)


def test_a_quiet_machine_gets_a_thread_per_usable_core() -> None:
    assert choose_threads(_machine(2, cores=2, busy=0.1))[0] == 2
    assert choose_threads(_machine(8, cores=8, busy=0.0))[0] == 8


def test_never_more_than_the_affinity_the_quota_or_the_physical_cores() -> None:
    assert choose_threads(_machine(1, cores=4))[0] == 1  # affinity: one CPU
    threads, reason = choose_threads(_machine(8, quota=2.5, cores=8))
    assert threads == 2 and "a CPU quota of 2.5" in reason  # a quota of 2.5 CPUs: 2 threads
    assert choose_threads(_machine(4, quota=0.5, cores=4))[0] == 1  # at least one
    threads, reason = choose_threads(_machine(4, cores=2))
    assert threads == 2 and "2 physical cores" in reason  # hyper-threads are no cores


def test_other_work_keeping_the_cores_busy_means_fewer_threads() -> None:
    threads, reason = choose_threads(_machine(2, cores=2, busy=2.0))  # a busy process per core
    assert threads == 1 and "other work keeps 2.0 of them busy (measured)" in reason
    assert choose_threads(_machine(2, cores=2, busy=1.0))[0] == 1  # one core busy: 2 threads would wait on it
    assert choose_threads(_machine(4, cores=4, busy=1.0))[0] == 3
    assert choose_threads(_machine(4, cores=4, busy=9.0))[0] == 1


def test_the_load_average_stands_in_where_the_probe_cannot_measure() -> None:
    threads, reason = choose_threads(_machine(2, cores=2, busy=None, load=5.0))
    assert threads == 1 and "(load average)" in reason
    assert choose_threads(_machine(2, cores=2, busy=None, load=0.1))[0] == 2
    assert choose_threads(_machine(2, cores=2, busy=None, load=None)) == (2, "2 CPUs usable; how busy they are is "
                                                                              "unknown")


def test_unset_the_threads_are_chosen_and_the_line_says_why(home: Path) -> None:
    choice = thread_choice(WorkerSettings(home=home), machine=lambda: _machine(2, cores=2, busy=1.9, load=4.2))
    assert (choice.threads, choice.source, choice.chosen, choice.warnings) == (1, "chosen", 1, ())
    assert choice.line() == ("model threads: 1 (chosen: 2 CPUs usable, but other work keeps 1.9 of them busy "
                             "(measured): more threads would wait on each other); this process may use 2 CPUs, "
                             "2 physical cores, no CPU quota; 1.9 busy over 0.2 s; load average 4.2")


def test_a_set_model_threads_is_used_as_given_with_warnings(home: Path) -> None:
    busy = _machine(2, cores=2, busy=2.0)
    choice = thread_choice(WorkerSettings(home=home, model_threads=3), machine=lambda: busy)
    assert (choice.threads, choice.source, choice.chosen) == (3, "argument", 1)
    assert choice.warnings[0] == ("3 threads on 2 CPUs contend with each other; set model_threads to at most 2, or "
                                  "unset it to have it chosen")
    assert "may be many times slower than 1; unset model_threads" in choice.warnings[1]
    assert choice.line().startswith("model threads: 3 (model_threads, argument; the choice here would be 1); ")
    quiet = thread_choice(WorkerSettings(home=home, model_threads=2), machine=lambda: _machine(2, cores=2))
    assert (quiet.threads, quiet.warnings) == (2, ())


def test_the_environment_variable_overrides_the_choice(home: Path) -> None:
    child = ("import json, sys\n"
             "from emelex_workers.settings import WorkerSettings\n"
             "from emelex_workers.models.threads import thread_choice\n"
             "print(json.dumps(thread_choice(WorkerSettings(home=sys.argv[1])).as_dict()))\n")
    env = {**os.environ, "EMELEX_MODEL_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", child, str(home)], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    choice = json.loads(out)
    assert choice["threads"] == 1 and choice["source"] == "environment EMELEX_MODEL_THREADS"


def test_the_probe_reads_this_machine(home: Path) -> None:
    machine = read_machine(probe_s=0.05)
    assert machine.usable_cpus == len(os.sched_getaffinity(0))
    assert machine.busy is None or 0.0 <= machine.busy <= machine.usable_cpus
    assert machine.physical_cores is None or 1 <= machine.physical_cores <= machine.usable_cpus


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_the_usable_cpus_are_this_process_affinity_not_the_machine(home: Path) -> None:
    child = ("import json, os, sys\n"
             "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
             "from emelex_workers.settings import WorkerSettings\n"
             "from emelex_workers.models.threads import thread_choice\n"
             "print(json.dumps(thread_choice(WorkerSettings(home=sys.argv[1])).as_dict()))\n")
    env = {k: v for k, v in os.environ.items() if k != "EMELEX_MODEL_THREADS"}
    out = subprocess.run([sys.executable, "-c", child, str(home)], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    choice = json.loads(out)
    assert choice["usable_cpus"] == 1 and choice["threads"] == 1 and choice["source"] == "chosen"
