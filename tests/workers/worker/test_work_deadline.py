"""Bounded jobs: a plugin that hangs is stopped at the job's deadline, counted, and terminal after three attempts;
the run's max_seconds stops the job in hand (counted only for the run's first job); a real `emelex memory work
--max-seconds` with a hanging plugin ends within its bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_workers.hookspecs import hookimpl
from emelex_workers.host.manager import PluginInfo, get_plugin_manager
from emelex_workers.plugin_api import Summarizer
from emelex_workers.settings import WorkerSettings
from emelex_workers.worker.work import Worker

from .test_work import Clock, env, jobs, seed  # noqa: F401 - env is a fixture

HANG = 120.0  # how long a hanging plugin would run if nothing stopped it


def _hang(request):
    end = time.monotonic() + HANG
    while time.monotonic() < end:
        time.sleep(0.01)
    return "The user asked."


class Hanging:
    """A plugin whose summarizer "hang" hangs in plain Python; "hang-own" declares its own max_seconds."""

    @hookimpl
    def register_summarizers(self, register):
        register(Summarizer("hang", _hang))
        register(Summarizer("hang-own", _hang, max_seconds=0.5))


def _worker(store, settings, **values) -> Worker:
    pm = get_plugin_manager(settings)
    pm.add_plugin(Hanging(), PluginInfo("hanging", "emelex-hanging", "0.1", "test", False))
    return Worker(store, WorkerSettings(**{"summarizer": "hang", **values}), pm=pm, kinds=("compaction",))


def test_a_hanging_plugin_is_stopped_counted_and_terminal_after_three_attempts(
        env: WorkerSettings, workspace: Path) -> None:
    clock = Clock()
    with MemoryStore.open(env, clock=clock) as store:
        seed(store, workspace, distill=False)
        for attempt in (1, 2, 3):
            began = time.monotonic()
            report = _worker(store, env, job_max_seconds=0.5).run()
            assert time.monotonic() - began < HANG / 4
            job = jobs(store)["compaction"]
            assert job.attempts == attempt
            assert job.diagnostics[-1].message.startswith(
                "PluginHookError: summarizer 'hang' of plugin 'hanging' did not finish within the job's deadline of "
                "0.5 s (the job_max_seconds setting); it was stopped while the summarizer ran; a retry gets the same time")
            clock.now += 3600
        assert job.state == "failed" and report.counts["failed"] == 1


def test_a_plugin_declares_its_own_deadline(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        _worker(store, env, summarizer="hang-own", job_max_seconds=600).run()
        assert "deadline of 0.5 s (its own max_seconds)" in jobs(store)["compaction"].diagnostics[-1].message


def test_the_run_s_time_stops_the_job_in_hand(env: WorkerSettings, workspace: Path) -> None:
    """The run's first job had the whole run: counted. A later one is released uncounted."""
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        began = time.monotonic()
        report = _worker(store, env).run(max_seconds=0.5)
        assert time.monotonic() - began < HANG / 4
        job = jobs(store)["compaction"]
        assert job.attempts == 1 and report.counts["retrying"] == 1
        assert "did not finish before the run's max_seconds ran out, though it was the run's first job" in (
            job.diagnostics[-1].message)


def test_a_later_job_stopped_by_the_run_s_time_is_released_uncounted(env: WorkerSettings, workspace: Path) -> None:
    calls = []

    class Quick:
        @hookimpl
        def register_summarizers(self, register):
            def summarize(request):
                calls.append(request.job.id)
                if len(calls) == 1:
                    return "The user asked: question 0?"
                return _hang(request)

            register(Summarizer("quick-then-hang", summarize, needs_model=False))

    pm = get_plugin_manager(env)
    pm.add_plugin(Quick(), PluginInfo("quick", "emelex-quick", "0.1", "test", False))
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        seed(store, workspace, distill=False)
        report = Worker(store, WorkerSettings(summarizer="quick-then-hang"), pm=pm, kinds=("compaction",)).run(
            max_seconds=1.5)
        assert report.stopped == "max-seconds" and report.counts["released"] == 1
        later = next(j for j in store.list_jobs().jobs if j.id == calls[1])
        assert later.state == "pending" and later.attempts == 0
        assert "the run's max_seconds ran out" in later.diagnostics[-1].message


def test_max_seconds_bounds_a_real_run_with_a_hanging_plugin(tmp_path: Path, home: Path, workspace: Path) -> None:
    """`emelex memory work --max-seconds 3` in a real process, with a hanging plugin installed by entry point: it
    ends within its bound, exit status and one line, the job counted."""
    from ...support.plugins import make_distribution

    source = ("import time\nfrom emelex_workers.plugin_api import Distiller, Summarizer, hookimpl\n\n"
              "def summarize(request):\n    while True:\n        time.sleep(0.01)\n\n"
              "@hookimpl\ndef register_summarizers(register):\n"
              "    register(Summarizer('hang', summarize, needs_model=False))\n\n"
              "@hookimpl\ndef register_distillers(register):\n"
              "    register(Distiller('hang', lambda request: [], needs_model=False))\n")
    site = make_distribution(tmp_path / "site", "emelex-hang", "0.2", {"emelex_hang": source}, {"hang": "emelex_hang"})
    settings = WorkerSettings(home=home)
    with MemoryStore.open(settings) as store:
        seed(store, workspace, distill=False)
    env = {**os.environ, "EMELEX_HOME": str(home), "EMELEX_SUMMARIZER": "hang", "EMELEX_DISTILLER": "hang",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", "from emelex_workers.cli import main; main()", "memory", "work",
                          "--max-seconds", "3",
                          "--json"], env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    assert took < 30, took
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout, out.stderr
    result = json.loads(out.stdout)
    with MemoryStore.open(settings) as store:
        job = jobs(store)["compaction"]
    assert job.attempts == 1 and job.state == "pending", result
    assert "summarizer 'hang' of plugin 'hang' did not finish before the run's max_seconds ran out" in (
        job.diagnostics[-1].message)


def test_a_run_whose_plugins_need_no_model_says_nothing_of_model_threads(tmp_path: Path, home: Path,
                                                                         workspace: Path) -> None:
    """`emelex memory work` with a summarizer and a distiller that declare `needs_model=False` loads no model, so
    it prints no `model threads` line: only each job's start and end lines."""
    from ...support.plugins import make_distribution

    source = ("from emelex_workers.plugin_api import Distiller, Summarizer, hookimpl\n\n"
              "@hookimpl\ndef register_summarizers(register):\n"
              "    register(Summarizer('plain', lambda request: 'The user asked a question.', needs_model=False))\n\n"
              "@hookimpl\ndef register_distillers(register):\n"
              "    register(Distiller('plain', lambda request: [], needs_model=False))\n")
    site = make_distribution(tmp_path / "site", "emelex-plain", "0.1", {"emelex_plain": source},
                             {"plain": "emelex_plain"})
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        seed(store, workspace)
    env = {**os.environ, "EMELEX_HOME": str(home), "EMELEX_SUMMARIZER": "plain", "EMELEX_DISTILLER": "plain",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", "from emelex_workers.cli import main; main()", "memory", "work"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 4 and not any("model threads" in line for line in lines), out.stderr
    assert lines[0].startswith("[compaction] job ") and lines[2].startswith("[distill] job "), out.stderr
