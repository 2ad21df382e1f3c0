"""Worker lease renewal while a handler runs: one shared daemon thread per process renews every registered claim.

`renewing(claim, ttl_s)` registers a claim for the length of a `with` block;
the renewer renews its worker lease by `ttl_s` every `ttl_s / 3` seconds until
the block ends or the lease is lost. One long-lived thread serves every claim,
so a job costs two dictionary updates instead of starting and joining a thread
of its own (about 0.1 ms here, as long as a whole committed transaction), and
the thread only wakes when a renewal is due. While it renews jobs the thread
is named after them (`renew-<job ID>`), otherwise `emelex-lease-renewer`, so a
thread listing shows what it is doing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import TYPE_CHECKING

from .errors import WorkerLeaseLostError

if TYPE_CHECKING:
    from .job_claim import JobClaim

IDLE_NAME = "emelex-lease-renewer"


class _Renewer:
    """The registry of claims to renew and the one thread that renews them; all state is guarded by `_lock`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._due: dict[JobClaim, tuple[float, float]] = {}  # claim -> (next renewal, monotonic seconds; TTL)
        self._wake_at = math.inf  # when the thread wakes next; a claim due earlier must notify it
        self._idle_s = math.inf  # with nothing to renew, the thread still wakes this often (the last TTL / 3), so
        # that a claim registered later, with the same TTL, is never due before its wake-up and needs no notify
        self._busy: JobClaim | None = None  # the claim being renewed right now, outside the lock
        self._thread: threading.Thread | None = None

    def add(self, claim: JobClaim, ttl_s: float) -> None:
        with self._lock:  # `due` read under the lock is never before a `_wake_at` the thread computed earlier
            due = time.monotonic() + ttl_s / 3
            self._due[claim] = (due, ttl_s)
            self._idle_s = ttl_s / 3
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=IDLE_NAME, daemon=True)
                self._thread.start()
                self._wake_at = due  # the new thread's first look is due no later than this
            elif due < self._wake_at:
                self._cond.notify()
            self._thread.name = f"renew-{claim.id}" if len(self._due) == 1 else self._name()

    def remove(self, claim: JobClaim) -> None:
        with self._lock:
            self._due.pop(claim, None)  # gone already if the renewer found the lease lost
            while self._busy is claim:  # a renewal of it is under way: let it end, so none happens after the block
                self._cond.wait()
            if self._thread is not None:  # None in a forked child that never renewed anything
                self._thread.name = self._name() if self._due else IDLE_NAME

    def _name(self) -> str:
        return f"renew-{','.join(c.id for c in self._due)}" if self._due else IDLE_NAME

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for claim, (at, ttl_s) in list(self._due.items()):
                    if at <= now and claim in self._due:  # still registered: renewing another may take a while
                        self._renew(claim, ttl_s)
                now = time.monotonic()
                self._wake_at = min((at for at, _ in self._due.values()), default=now + self._idle_s)
                self._cond.wait(None if self._wake_at == math.inf else max(0.0, self._wake_at - now))

    def _renew(self, claim: JobClaim, ttl_s: float) -> None:
        """Renew one due claim with the lock released; drop it once its lease is lost."""
        self._busy = claim
        self._cond.release()
        lost = False
        try:
            claim.renew(ttl_s)
        except WorkerLeaseLostError:
            lost = True
        except Exception:  # e.g. busy: the next tick tries again, well before the lease expires
            pass
        finally:
            self._cond.acquire()
            self._busy = None
            self._cond.notify_all()  # wakes a `remove` waiting for this renewal
        if claim in self._due:
            if lost:
                del self._due[claim]
                self._thread.name = self._name()
            else:
                self._due[claim] = (time.monotonic() + ttl_s / 3, ttl_s)


_renewer = _Renewer()


def _after_fork() -> None:
    global _renewer
    _renewer = _Renewer()  # the child has no renewer thread and renews none of its parent's claims


os.register_at_fork(after_in_child=_after_fork)


class Renewal:
    """A `with` block during which a claim's worker lease is renewed; see `renewing`."""

    __slots__ = ("_claim", "_ttl_s")

    def __init__(self, claim: JobClaim, ttl_s: float) -> None:
        """Renew `claim` by `ttl_s` every `ttl_s / 3` seconds while the block runs."""
        self._claim = claim
        self._ttl_s = ttl_s

    def __enter__(self) -> None:
        _renewer.add(self._claim, self._ttl_s)

    def __exit__(self, *exc: object) -> None:
        _renewer.remove(self._claim)


def renewing(claim: JobClaim, ttl_s: float) -> Renewal:
    """Renew `claim`'s worker lease by `ttl_s` every `ttl_s / 3` seconds, on the shared renewer thread, while the
    returned `with` block runs.

    When the block ends, however it ends, the claim is no longer renewed (a
    renewal under way is waited for, so none happens afterwards). Renewal
    gives up once the lease is lost (the outcome then reports it) and tries
    again on the next tick after any other error (e.g. a busy database).
    """
    return Renewal(claim, ttl_s)
