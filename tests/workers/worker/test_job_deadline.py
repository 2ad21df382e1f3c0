"""A job's deadline (`GracefulStop.deadline`): plain plugin code is interrupted where it runs, a model call is
stopped through the flag its binding checks, and the deadline ends with the job."""

from __future__ import annotations

import threading
import time

import pytest

from emelex_workers.worker.stopping import GracefulStop, JobDeadline, WorkerStopped


def _hang(seconds: float = 30.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


def test_a_deadline_interrupts_plain_plugin_code_and_ends_with_the_job() -> None:
    stop = GracefulStop()
    began = time.monotonic()
    with pytest.raises(JobDeadline) as met, stop.deadline(0.2, "job"):
        with stop.interruptible():
            _hang()
    assert met.value.reason == "job" and time.monotonic() - began < 10
    assert stop.expired is None and not stop.event.is_set() and stop.requested is None  # the next job starts clean
    with stop.deadline(5, "job"), stop.interruptible():
        pass  # an unexpired deadline changes nothing


def test_a_plugin_that_swallows_the_deadline_once_meets_it_again() -> None:
    stop = GracefulStop()
    caught = []
    with pytest.raises(JobDeadline), stop.deadline(0.1, "job"):
        with stop.interruptible():
            try:
                _hang()
            except BaseException as exc:  # a plugin that swallows everything, then goes on
                caught.append(exc)
            _hang()
    assert len(caught) == 1


def test_a_model_call_sees_the_flag_and_is_not_interrupted_mid_call() -> None:
    stop = GracefulStop()
    seen = []

    def model_call() -> None:  # a binding checking `stop.event` between its tokens
        while not stop.event.wait(0.01):
            pass
        seen.append("flag")

    with pytest.raises(JobDeadline) as met, stop.deadline(0.1, "job"):
        with stop.interruptible():
            with stop.deferred():
                model_call()
            stop.check("after the model call")
    assert seen == ["flag"] and met.value.where == "after the model call"


def test_a_stop_request_wins_over_a_deadline() -> None:
    stop = GracefulStop()
    with pytest.raises(WorkerStopped), stop.deadline(0.05, "job"):
        stop.request("SIGTERM")
        with stop.interruptible():
            _hang(1)
    assert stop.event.is_set()  # the stop stays requested after the job


def test_off_the_main_thread_the_deadline_sets_the_flag_only() -> None:
    stop, out = GracefulStop(), []

    def job() -> None:
        with stop.deadline(0.05, "job"):
            out.append(stop.event.wait(10))
            out.append(stop.expired)

    thread = threading.Thread(target=job)
    thread.start()
    thread.join(20)
    assert out == [True, "job"] and not stop.event.is_set()
