"""The library worker renews the worker lease while a handler runs, and stops renewing once it ends."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from emelex_memory import JobClaim, MemoryStore, Settings, run_one_job
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.queue.renewal import renewing

from ..support import kinds_fixture, wait_until

KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)
TTL = 0.5  # real seconds: renewed every third of it


def renewal_threads() -> list[threading.Thread]:
    """Threads renewing some claim right now (the shared renewer is named after the claims it renews)."""
    return [t for t in threading.enumerate() if t.name.startswith("renew-")]


@pytest.fixture
def store(db_path: Path, settings: Settings):
    s = MemoryStore.open_path(db_path, settings, kinds=KINDS)  # the real clock: renewal runs in real time
    yield s
    s.close()


@pytest.fixture
def job(store: MemoryStore, workspace: Path):
    return store.enqueue_job("noop", store.create_session(workspace).id, {"slow": True}).job


def test_a_handler_slower_than_its_lease_completes_without_being_rescued(
    store: MemoryStore, job, db_path: Path, settings: Settings
) -> None:
    seen = {}

    def slow(claim: JobClaim) -> dict:
        time.sleep(2.4 * TTL)  # well past the lease it was claimed with
        with MemoryStore.open_path(db_path, settings, kinds=KINDS) as other:  # another worker's claim would rescue it now
            seen["rescued"] = other.rescue_expired_jobs()
            seen["job"] = other.get_job(claim.id)
        seen["threads"] = len(renewal_threads())
        return {"ok": True}

    outcome = run_one_job(store, slow, ttl_s=TTL)
    assert seen["rescued"] == 0 and seen["job"].state == "claimed" and seen["threads"] == 1
    assert seen["job"].lease_expires_at > seen["job"].created_at + TTL  # it was renewed
    assert outcome.status == "done" and outcome.job.attempts == 0 and outcome.job.result == {"ok": True}
    assert renewal_threads() == []


def test_renewal_stops_however_the_handler_ends(store: MemoryStore, job) -> None:
    def interrupted(claim: JobClaim) -> None:
        assert len(renewal_threads()) == 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_one_job(store, interrupted, ttl_s=TTL)
    assert renewal_threads() == []
    assert store.get_job(job.id).state == "pending"


def test_renewal_gives_up_once_the_lease_is_lost(store: MemoryStore, job) -> None:
    claim = store.claim_job("noop", ttl_s=TTL)
    with renewing(claim, TTL):
        store.cancel_job(claim.id)  # the operator takes the job away
        # renewal ends on WorkerLeaseLostError, before the block does
        wait_until(lambda: renewal_threads() == [], "the renewal thread ending once the lease was lost", 10)
    assert store.get_job(claim.id).state == "cancelled"
    claim.ended = True
