"""The one retry schedule of the work queues, and bounded in-process retries, both built on tenacity.

Durable retry deadlines: a retryable failure schedules the next attempt
`RETRY_SCHEDULE.delay(n)` seconds after the n-th failure (30 s, doubling,
capped at five minutes); the third failure is terminal. The schedule is a
tenacity wait strategy plus a tenacity stop condition, evaluated for a failed
attempt number instead of being slept on, so the queue stores a deadline and
no process has to stay alive to honour it.

In-process retries (a transient inference error) use tenacity's `Retrying`
with a bounded number of attempts, never a hand-written loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import tenacity
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from ..errors import InvalidInputError

T = TypeVar("T")

FIRST_RETRY_S = 30.0
MAX_RETRY_S = 300.0
MAX_FAILED_ATTEMPTS = 3


def _attempt_state(failed_attempts: int) -> tenacity.RetryCallState:
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = failed_attempts
    return state


@dataclass(frozen=True)
class RetrySchedule:
    """When a failed job runs again: a tenacity wait strategy and stop condition over failed-attempt numbers."""

    wait: wait_base = field(
        default_factory=lambda: tenacity.wait_exponential(multiplier=FIRST_RETRY_S, exp_base=2, max=MAX_RETRY_S)
    )
    stop: stop_base = field(default_factory=lambda: tenacity.stop_after_attempt(MAX_FAILED_ATTEMPTS))

    def delay(self, failed_attempts: int) -> float:
        """Seconds from the `failed_attempts`-th failure (1-based) to the next attempt."""
        if failed_attempts < 1:
            raise InvalidInputError(f"failed_attempts counts from 1, got {failed_attempts}")
        return float(self.wait(_attempt_state(failed_attempts)))

    def is_terminal(self, failed_attempts: int) -> bool:
        """True when the `failed_attempts`-th failure leaves the job terminally failed."""
        return failed_attempts >= 1 and bool(self.stop(_attempt_state(failed_attempts)))


RETRY_SCHEDULE = RetrySchedule()
"""The schedule every work queue uses: 30 s, 60 s, ... capped at 300 s; the third failure is terminal."""


def bounded_retrying(
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    *,
    attempts: int,
    wait: wait_base,
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
) -> tenacity.Retrying:
    """A tenacity `Retrying` for in-process retries of `retry_on` errors: at most `attempts` tries, then re-raise."""
    if attempts < 1:
        raise InvalidInputError(f"attempts must be at least 1, got {attempts}")
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(retry_on),
        stop=tenacity.stop_after_attempt(attempts),
        wait=wait,
        before_sleep=before_sleep,
        reraise=True,
    )
