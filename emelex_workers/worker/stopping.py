"""Stopping a worker run: `GracefulStop`, the stop request SIGINT and SIGTERM make, and `WorkerStopped`, how a
job learns of it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class WorkerStopped(BaseException):  # noqa: N818 - like KeyboardInterrupt, it is not an error
    """Raised inside a running job when a stop was requested: the job is released, then the run ends."""

    def __init__(self, signal_name: str) -> None:
        """A stop requested by `signal_name` (e.g. "SIGTERM", or "stop" for `GracefulStop.request()`)."""
        super().__init__(signal_name)
        self.signal_name = signal_name


class GracefulStop:
    """A stop request (SIGINT/SIGTERM, or `request`). Outside a job it only marks the run to end before the next
    claim; inside `interruptible()` it raises `WorkerStopped`, so the job in hand is released."""

    def __init__(self) -> None:
        """No stop requested yet."""
        self.requested: str | None = None
        self._interruptible = False

    def request(self, name: str = "stop") -> None:
        """Ask the run to stop; raise `WorkerStopped` when called inside `interruptible()` on its thread."""
        self.requested = self.requested or name
        if self._interruptible:
            self._interruptible = False  # a second request while releasing must not interrupt the release
            raise WorkerStopped(name)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.request(signal.Signals(signum).name)

    @contextmanager
    def installed(self) -> Iterator[GracefulStop]:
        """Handle SIGINT and SIGTERM with `request` while inside the block (main thread only), then restore."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Within the block a stop request raises `WorkerStopped`; one already made raises at once."""
        if self.requested:
            raise WorkerStopped(self.requested)
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False
