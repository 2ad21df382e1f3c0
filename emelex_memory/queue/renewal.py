"""Worker lease renewal while a handler runs: one shared daemon thread per process renews every registered claim.

`renewing(claim, ttl_s)` registers a claim for the length of a `with` block
(`RENEWER.add` / `RENEWER.remove` do the same without the block); the renewer
renews its worker lease by `ttl_s` every `ttl_s / 3` seconds until the block
ends or the lease is lost. One long-lived thread serves every claim, so a job
costs two dictionary updates instead of starting and joining a thread of its
own (about 0.1 ms here, as long as a whole committed transaction), and the
thread only wakes when a renewal is due. Its name says what it renews right
now (`renew-<job ID>`, or `emelex-lease-renewer` while it renews nothing), so
a thread listing shows what it is doing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import TYPE_CHECKING

from ..errors import WorkerLeaseLostError

if TYPE_CHECKING:
    from .claim import JobClaim

IDLE_NAME = "emelex-lease-renewer"


class _RenewerThread(threading.Thread):
    """The renewer's thread. Its name is read from the registry, so registering a claim never renames it."""

    def __init__(self, renewer: Renewer) -> None:
        self._renewer = renewer  # first: `name` reads it
        super().__init__(target=renewer._run, name=IDLE_NAME, daemon=True)

    @property  # type: ignore[override]
    def name(self) -> str:
        """`renew-<job ID>[,<job ID>...]` of the claims registered now, or `emelex-lease-renewer`."""
        claims = list(self._renewer._due)  # one atomic copy: the registry may change meanwhile
        return f"renew-{','.join(claim.id for claim in claims)}" if claims else IDLE_NAME


class Renewer:
    """The registry of claims to renew and the one thread that renews them; all state is guarded by `_lock`.

    There is one per process, `RENEWER`; a forked child starts it afresh.
    """

    def __init__(self) -> None:
        """An empty registry; the thread starts with the first claim."""
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._due: dict[JobClaim, tuple[float, float]] = {}  # claim -> (next renewal, monotonic seconds; TTL)
        self._wake_at = math.inf  # when the thread wakes next; a claim due earlier must notify it
        self._idle_s = math.inf  # with nothing to renew, the thread still wakes this often (the last TTL / 3), so
        # that a claim registered later, with the same TTL, is never due before its wake-up and needs no notify
        self._busy: JobClaim | None = None  # the claim being renewed right now, outside the lock
        self._thread: _RenewerThread | None = None

    def add(self, claim: JobClaim, ttl_s: float) -> None:
        """Renew `claim` by `ttl_s` every `ttl_s / 3` seconds from now until `remove(claim)`."""
        with self._lock:  # `due` read under the lock is never before a `_wake_at` the thread computed earlier
            due = time.monotonic() + ttl_s / 3
            self._due[claim] = (due, ttl_s)
            self._idle_s = ttl_s / 3
            if self._thread is None:
                self._thread = _RenewerThread(self)
                self._thread.start()
                self._wake_at = due  # the new thread's first look is due no later than this
            elif due < self._wake_at:
                self._cond.notify()

    def remove(self, claim: JobClaim) -> None:
        """Stop renewing `claim`; a renewal of it under way is waited for, so none happens after this returns."""
        with self._lock:
            self._due.pop(claim, None)  # gone already if the renewer found the lease lost
            while self._busy is claim:
                self._cond.wait()

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
            else:
                self._due[claim] = (time.monotonic() + ttl_s / 3, ttl_s)


RENEWER = Renewer()
os.register_at_fork(after_in_child=RENEWER._reset)  # the child has no renewer thread and none of the parent's claims


class Renewal:
    """A `with` block during which a claim's worker lease is renewed; see `renewing`."""

    __slots__ = ("_claim", "_ttl_s")

    def __init__(self, claim: JobClaim, ttl_s: float) -> None:
        """Renew `claim` by `ttl_s` every `ttl_s / 3` seconds while the block runs."""
        self._claim = claim
        self._ttl_s = ttl_s

    def __enter__(self) -> None:
        RENEWER.add(self._claim, self._ttl_s)

    def __exit__(self, *exc: object) -> None:
        RENEWER.remove(self._claim)


def renewing(claim: JobClaim, ttl_s: float) -> Renewal:
    """Renew `claim`'s worker lease by `ttl_s` every `ttl_s / 3` seconds, on the shared renewer thread, while the
    returned `with` block runs.

    When the block ends, however it ends, the claim is no longer renewed (a
    renewal under way is waited for, so none happens afterwards). Renewal
    gives up once the lease is lost (the outcome then reports it) and tries
    again on the next tick after any other error (e.g. a busy database).
    """
    return Renewal(claim, ttl_s)
