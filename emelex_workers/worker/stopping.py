"""Stopping a worker run: `GracefulStop`, the stop request SIGINT and SIGTERM make, and `WorkerStopped`, how a
job learns of it.

A signal handler never raises into whatever it interrupted, except plain plugin code (`interruptible`): a
handler runs on the main thread at the next Python instruction, which during model work is inside one of
llama.cpp's callbacks (its loading progress, its log, a sampler, the abort check), and ctypes swallows an
exception raised there ("Exception ignored on calling ctypes callback function") and lets the C code run on.
So a request sets `event`, which the worker checks between its steps and which a model binding checks while it
loads the model, evaluates the prompt and generates (the llama.cpp binding through llama.cpp's own progress
and abort callbacks); where the binding returns, `check` raises `WorkerStopped` in ordinary code.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
            raise WorkerStopped(name)

    def check(self, where: str = "") -> None:
        """Raise `WorkerStopped` (met `where`) when a stop was requested; else return."""
        if self.requested is not None:
            raise WorkerStopped(self.requested, where)

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
    def interruptible(self) -> Iterator[None]:
        """Plain plugin code: within the block a stop request raises `WorkerStopped` where the code is; one already
        made raises at once. A model call inside it is kept from that by `deferred()`."""
        self.check()
        self._interruptible += 1
        self._thread = threading.get_ident()
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
            self._interruptible = held if self.requested is None else 0
