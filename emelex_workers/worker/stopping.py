"""Stopping a worker run: `GracefulStop`, the stop request SIGINT and SIGTERM make, and `WorkerStopped`, how a
job learns of it; and a job's deadline (`GracefulStop.deadline`), which stops the job in hand the same way and
ends in `JobDeadline`.

A signal handler never raises into whatever it interrupted, except plain plugin code (`interruptible`): a
handler runs on the main thread at the next Python instruction, which during model work is inside one of
llama.cpp's callbacks (its loading progress, its log, a sampler, the abort check), and ctypes swallows an
exception raised there ("Exception ignored on calling ctypes callback function") and lets the C code run on.
So a request sets `event`, which the worker checks between its steps and which a model binding checks while it
loads the model, evaluates the prompt and generates (the llama.cpp binding through llama.cpp's own progress
and abort callbacks); where the binding returns, `check` raises `WorkerStopped` in ordinary code.

A deadline is one more way to ask: when it passes (a SIGALRM timer on the main thread; elsewhere a timer thread,
which can only set the flag) it sets `expired` and `event` and, inside plain plugin code, raises `JobDeadline`
there at once, again every `DEADLINE_REPEAT_S` while the job has not ended (a plugin that catches it and goes on
meets it again). Unlike a stop request it ends with the job: leaving the block clears `expired` and `event`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
DEADLINE_REPEAT_S = 1.0  # how often a passed deadline is raised again in plugin code that has not ended


class JobDeadline(BaseException):  # noqa: N818 - like WorkerStopped, it is not an error of the code it stops
    """Raised inside a running job when its deadline passed: `reason` is the deadline's (what `deadline()` was
    given), `where` what the job was doing ("while evaluating the prompt (512 of 1204 tokens)") or ""."""

    def __init__(self, reason: str, where: str = "") -> None:
        """The deadline `reason`, met `where`."""
        super().__init__(reason)
        self.reason = reason
        self.where = where


class WorkerStopped(BaseException):  # noqa: N818 - like KeyboardInterrupt, it is not an error
    """Raised inside a running job when a stop was requested: the job is released, then the run ends. `where`
    says what the job was doing when it stopped ("while evaluating the prompt (512 of 1204 tokens)"), or is ""."""

    def __init__(self, signal_name: str, where: str = "") -> None:
        """A stop requested by `signal_name` (e.g. "SIGTERM", or "stop" for `GracefulStop.request()`), met
        `where`."""
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.where = where


class GracefulStop:
    """A stop request: SIGINT or SIGTERM while `installed()`, or `request()`.

    The first request sets `requested` (the signal's name) and `event`, and
    calls `on_request(name)`; it raises nothing, except inside
    `interruptible()` (plain plugin code, outside any model call), where it
    raises `WorkerStopped` at once. Every later request calls
    `on_repeat(name)`, which is expected to end the process at once (the
    CLI's releases what it can and exits with 128+N); without one it is only
    counted. `check()` raises `WorkerStopped` once a stop was requested.
    Both callbacks run in the signal handler, on the main thread: they must
    be quick and must not raise.
    """

    def __init__(self, on_request: Callable[[str], None] | None = None,
                 on_repeat: Callable[[str], None] | None = None) -> None:
        """No stop requested yet; `on_request` and `on_repeat` as the class docstring says."""
        self.requested: str | None = None
        self.event = threading.Event()
        self.repeats = 0
        self.on_request = on_request
        self.on_repeat = on_repeat
        self._interruptible = 0
        self._thread: int | None = None  # the thread inside `interruptible()`
        self._doing = ""  # what the code inside `interruptible()` is doing ("while the summarizer ran")
        self.expired: str | None = None  # the reason of the job's deadline once it passed (see `deadline`)
        self._deadline_reason: str | None = None  # the deadline in force (inside `deadline()`)

    @property
    def stopping(self) -> bool:
        """True once a stop was requested or the job's deadline passed."""
        return self.requested is not None or self.expired is not None

    def exception(self, where: str = "") -> BaseException:
        """What a job that meets this stop raises: `WorkerStopped` for a request, else `JobDeadline`."""
        if self.requested is not None:
            return WorkerStopped(self.requested, where)
        return JobDeadline(self.expired or "", where)

    def request(self, name: str = "stop") -> None:
        """Ask the run to stop (see the class docstring); inside `interruptible()` on its thread, raise
        `WorkerStopped`."""
        if self.requested is not None:
            self.repeats += 1
            if self.on_repeat is not None:
                self.on_repeat(name)
            return
        self.requested = name
        self.event.set()
        if self.on_request is not None:
            self.on_request(name)
        if self._interruptible and threading.get_ident() == self._thread:
            self._interruptible = 0  # the job is being released: nothing may interrupt that
            raise WorkerStopped(name, self._doing)

    def check(self, where: str = "") -> None:
        """Raise `WorkerStopped` (met `where`) when a stop was requested, `JobDeadline` when the job's deadline
        passed; else return."""
        if self.stopping:
            raise self.exception(where)

    def expire(self, reason: str) -> None:
        """The job's deadline passed: set `expired` and `event` (unless a stop was requested already); inside
        `interruptible()` on its thread, raise `JobDeadline`."""
        if self.requested is not None:
            return
        self.expired = reason
        self.event.set()
        if self._interruptible and self._thread == threading.get_ident():  # plain plugin code: stop it there
            raise JobDeadline(reason, self._doing)

    def _on_alarm(self, _signum: int, _frame: object) -> None:
        if self._deadline_reason is not None:
            self.expire(self._deadline_reason)

    @contextmanager
    def deadline(self, seconds: float, reason: str) -> Iterator[None]:
        """Within the block (one job), `expire(reason)` once `seconds` passed, and again every
        `DEADLINE_REPEAT_S` while the block runs. On the main thread a SIGALRM timer does it, so plain plugin code
        is interrupted where it runs; on another thread a timer thread, so only the flag is set. Leaving the block
        cancels the timer and clears `expired` (and `event`, unless a stop was requested)."""
        self._deadline_reason = reason
        on_main = threading.current_thread() is threading.main_thread()
        timer: threading.Timer | None = None
        if on_main:
            previous = signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001), DEADLINE_REPEAT_S)
        else:
            timer = threading.Timer(max(seconds, 0.0), lambda: self.expire(reason))
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            self._deadline_reason = None
            if on_main:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            elif timer is not None:
                timer.cancel()
            if self.expired is not None and self.requested is None:
                self.event.clear()
            self.expired = None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.request(signal.Signals(signum).name)

    @contextmanager
    def installed(self) -> Iterator[GracefulStop]:
        """Handle SIGINT and SIGTERM with `request` while inside the block (main thread only), then restore the
        handlers there were."""
        previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextmanager
    def interruptible(self, doing: str = "") -> Iterator[None]:
        """Plain plugin code, `doing` what it does ("while the summarizer ran"): within the block a stop request
        raises `WorkerStopped` where the code is, met `doing`; one already made raises at once, met before it ("before
        the summarizer ran"). A model call inside it is kept from that by `deferred()`."""
        self.check(doing.replace("while", "before", 1))
        self._interruptible += 1
        self._thread, self._doing = threading.get_ident(), doing
        try:
            yield
        finally:
            self._interruptible = max(0, self._interruptible - 1)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A model call (or the worker's own step) inside `interruptible()`: a request within the block only sets
        the flag, which the binding checks; leaving the block does not raise (call `check`)."""
        held, self._interruptible = self._interruptible, 0
        try:
            yield
        finally:
            self._interruptible = held if not self.stopping else 0
