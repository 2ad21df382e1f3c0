"""The work queue across real processes: racing workers, and a worker killed with SIGKILL mid-job."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

from emelex_memory import JobClaim, MemoryStore, Settings, run_one_job
from emelex_memory.job_kinds import builtin_kinds

from ..support import kinds_fixture

CTX = multiprocessing.get_context("spawn")

KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)


def _drain(db: str, home: str, start, results) -> None:
    store = MemoryStore.open_path(db, Settings(home=home), kinds=KINDS)
    ran: list[str] = []

    def handler(claim: JobClaim) -> dict:
        ran.append(claim.id)
        return {"pid": os.getpid()}

    start.wait()
    while run_one_job(store, handler, kinds="noop") is not None:
        pass
    store.close()
    results.put(ran)


def test_two_worker_processes_racing_never_claim_the_same_job(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    n = 80
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session = store.create_session(workspace)
        ids = {store.enqueue_job("noop", session.id, {"n": i}).job.id for i in range(n)}
    start, results = CTX.Barrier(2), CTX.Queue()
    procs = [CTX.Process(target=_drain, args=(str(db_path), str(settings.home), start, results)) for _ in range(2)]
    for p in procs:
        p.start()
    ran = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert not set(ran[0]) & set(ran[1])
    assert sorted(ran[0] + ran[1]) == sorted(ids)  # every job ran exactly once
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        jobs = store.list_jobs(limit=n + 1).jobs
    assert len(jobs) == n and all(j.state == "done" and j.attempts == 0 for j in jobs)
    assert {j.result["pid"] for j in jobs} <= {p.pid for p in procs}


def _claim_and_hang(db: str, home: str, claimed) -> None:
    store = MemoryStore.open_path(db, Settings(home=home), kinds=KINDS)
    claim = store.claim_job("noop", ttl_s=5)
    claimed.put(claim.id)
    time.sleep(600)  # "running the model" until killed


def test_a_worker_killed_mid_job_is_rescued_and_the_job_retried(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session = store.create_session(workspace)
        job = store.enqueue_job("noop", session.id, {"work": "summarize"}).job
    pid = _kill_once_it_holds(_claim_and_hang, db_path, settings, job.id)
    _rescue_and_retry(db_path, settings, job.id, pid)


def _kill_once_it_holds(target, db_path: Path, settings: Settings, expected) -> int:
    """Run `target(db, home, queue)` in a worker process, SIGKILL it once it puts `expected` on the queue; its pid."""
    claimed = CTX.Queue()
    worker = CTX.Process(target=target, args=(str(db_path), str(settings.home), claimed))
    worker.start()
    assert claimed.get(timeout=60) == expected
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(30)
    assert worker.exitcode == -signal.SIGKILL
    return worker.pid


def _rescue_and_retry(db_path: Path, settings: Settings, job_id: str, pid: int) -> None:
    """The job a killed worker `pid` held under a 5 s lease: claimed until the lease expires, then rescued as a
    counted failure by the next claim, then run again once its retry is due."""
    offset = [0.0]
    with MemoryStore.open_path(db_path, settings, clock=lambda: time.time() + offset[0], kinds=KINDS) as store:
        assert store.get_job(job_id).state == "claimed"
        assert store.claim_job("noop") is None  # the lease is still live: nobody else may take it
        offset[0] = 6  # past the killed worker's lease
        assert store.claim_job("noop") is None  # rescued as a counted failure, due again in 30 s
        rescued = store.get_job(job_id)
        assert (rescued.state, rescued.attempts, rescued.diagnostics[-1].event) == ("pending", 1, "expired")
        assert str(pid) in rescued.diagnostics[-1].message
        offset[0] = 40
        outcome = run_one_job(store, lambda claim: {"retried": True}, kinds="noop")
        assert outcome.job.id == job_id and outcome.status == "done"
        assert (outcome.job.attempts, outcome.job.result) == (1, {"retried": True})


def _complete_claim_next_and_hang(db: str, home: str, claimed) -> None:
    store = MemoryStore.open_path(db, Settings(home=home), kinds=KINDS)
    outcome = run_one_job(store, lambda claim: {"first": True}, kinds="noop", ttl_s=5, claim_next=lambda: True)
    claimed.put((outcome.job.id, outcome.next_claim.id))
    time.sleep(600)  # killed before it runs the job it claimed with the completion


def test_a_worker_killed_after_completing_and_claiming_in_one_commit_is_rescued(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        session = store.create_session(workspace)
        first = store.enqueue_job("noop", session.id, {"n": 1}).job
        second = store.enqueue_job("noop", session.id, {"n": 2}).job
    pid = _kill_once_it_holds(_complete_claim_next_and_hang, db_path, settings, (first.id, second.id))
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as store:
        assert store.get_job(first.id).state == "done"
    _rescue_and_retry(db_path, settings, second.id, pid)
