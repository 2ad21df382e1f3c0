"""`emelex memory work` as real processes: SIGTERM/SIGINT during a job, and two workers draining one queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings

from ...support.plugins import fake_model_file, fake_plugin_distribution
from .test_work import FAKE_SETTINGS, seed

WORKER = [sys.executable, "-c", "from emelex_workers.cli import main; main()", "memory", "work"]


@pytest.fixture
def proc_env(tmp_path: Path, home: Path) -> dict[str, str]:
    """Environment for worker subprocesses: the fake plugin on PYTHONPATH, Home with the fake model."""
    site = fake_plugin_distribution(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env.update(FAKE_SETTINGS, EMELEX_HOME=str(home), PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]))
    with ModelManager(WorkerSettings(home=home, default_model="fake")) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="fake")
    return env


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.02)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_job_releases_it_without_consuming_an_attempt(
    signum: int, proc_env: dict, home: Path, workspace: Path, tmp_path: Path
) -> None:
    settings = WorkerSettings(home=home)
    with MemoryStore.open(settings) as store:
        seed(store, workspace)
    started = tmp_path / "started"
    proc_env["EMELEX_FAKE_PLUGIN"] = json.dumps({"mode": "slow", "started": str(started)})
    proc = subprocess.Popen(WORKER, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(started, proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert out.startswith("emelex work: 1 job(s)") and "(1 released)" in out and "Traceback" not in err
    with MemoryStore.open(settings) as store:
        jobs = store.list_jobs().jobs
    assert {j.state for j in jobs} == {"pending"} and {j.attempts for j in jobs} == {0}
    released = [j for j in jobs if j.diagnostics]
    assert len(released) == 1
    name = signal.Signals(signum).name
    assert released[0].diagnostics[-1].message == f"worker stopped by {name}; no attempt consumed"


def test_two_worker_processes_drain_one_queue_with_no_job_run_twice(
    proc_env: dict, home: Path, workspace: Path, tmp_path: Path
) -> None:
    settings = WorkerSettings(home=home)
    with MemoryStore.open(settings) as store:
        for _ in range(12):
            seed(store, workspace, turns=6)
        total = len(store.list_jobs().jobs)
    record = tmp_path / "ran.txt"
    proc_env["EMELEX_FAKE_PLUGIN"] = json.dumps({"mode": "ok", "record": str(record)})
    procs = [
        subprocess.Popen([*WORKER, "--json"], env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out))
    ran = record.read_text().split()
    assert len(ran) == len(set(ran)) == total == 24  # every job ran exactly once
    assert sum(r["done"] for r in reports) == total
    ids = [j["id"] for r in reports for j in r["jobs"]]
    assert len(ids) == len(set(ids)) == total
    with MemoryStore.open(settings) as store:
        jobs = store.list_jobs().jobs
    assert {j.state for j in jobs} == {"done"} and {j.attempts for j in jobs} == {0}


def test_a_second_signal_ends_the_worker_at_once_releasing_the_job(
    proc_env: dict, home: Path, workspace: Path
) -> None:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        seed(store, workspace, distill=False)
    # a binding that neither checks the stop nor reports progress: the first signal waits for its call to return
    proc_env["EMELEX_FAKE_PLUGIN"] = json.dumps({"legacy": True, "chat": 64, "delay": 1.0})
    proc = subprocess.Popen(WORKER, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    while not line.startswith("[compaction] job "):  # the job started (its model call runs about a minute)
        assert line, proc.communicate()
        line = proc.stderr.readline()
    job_id = line.split()[2]
    proc.send_signal(signal.SIGTERM)
    acknowledged = proc.stderr.readline()
    while not acknowledged.strip():
        acknowledged = proc.stderr.readline()
    assert acknowledged.strip() == (f"stopping (SIGTERM): job {job_id} goes back to pending after its current step, "
                                    "no attempt consumed; SIGTERM again to stop at once")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)  # at once: the model call had about a minute left
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert f"stopped at once (SIGTERM): job {job_id} released" in err
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        job = store.get_job(job_id)
    assert job.state == "pending" and job.attempts == 0
    assert job.diagnostics[-1].message == "worker stopped at once by a second SIGTERM; no attempt consumed"
