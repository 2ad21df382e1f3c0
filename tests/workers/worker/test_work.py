"""`emelex memory work` in process, with the fake plugin from a real entry point: outcomes, retry rules,
live Sessions, stop requests, limits, configuration errors and the CLI's output and exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    MemoryStore,
    ModelNotInstalledError,
    NewEvent,
    UnknownPluginComponentError,
)
from emelex_workers.cli import app
from emelex_workers.hookspecs import hookimpl
from emelex_workers.models import ModelManager
from emelex_workers.plugin_api import Summarizer
from emelex_workers.host.manager import PluginInfo, get_plugin_manager
from emelex_workers.worker.work import Worker, work
from emelex_workers.settings import WorkerSettings

from ...support import table_rows
from ...support.plugins import activate, fake_model_file, fake_plugin_distribution

FAKE_SETTINGS = {"EMELEX_DEFAULT_MODEL": "fake", "EMELEX_SUMMARIZER": "fake", "EMELEX_DISTILLER": "fake"}


@pytest.fixture
def env(tmp_path: Path, home: Path, monkeypatch) -> WorkerSettings:
    """Home with the fake model installed, the fake plugin discoverable, and settings selecting both."""
    activate(monkeypatch, fake_plugin_distribution(tmp_path / "site"))
    monkeypatch.setenv("EMELEX_HOME", str(home))
    for key, value in FAKE_SETTINGS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("EMELEX_FAKE_PLUGIN", raising=False)
    settings = WorkerSettings()
    with ModelManager(settings) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="fake")
    return settings


class Clock:
    """A settable clock for the store."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def seed(store: MemoryStore, workspace: Path, turns: int = 8, *, compact: bool = True, distill: bool = True) -> str:
    """A Session with `turns` user/assistant turns; queue its compaction and/or distillation; return its ID."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        for i in range(turns):
            lease.append_turn([NewEvent("user", {"text": f"question {i}?"}),
                               NewEvent("assistant", {"text": f"answer {i} is {i * i}."})])
        if compact:
            store.queue_compaction(session.id, context_window=4096, force=True)
        if distill:
            store.finish_session(lease)
        else:
            lease.release()
    return session.id


def jobs(store: MemoryStore):
    return {j.kind: j for j in store.list_jobs().jobs}


def test_worker_commits_a_verified_summary_and_knowledge_with_provenance(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"chat": 2}))  # the summarizer calls the model: it is named
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace)
        report = work(store, env)
        assert report.counts["done"] == 2 and report.claimed == 2 and report.stopped == "empty"
        model = ModelManager(env).get("fake")
        view = store.replay(sid).events  # replay verifies the Summary's provenance
        assert view[0].kind == "summary" and view[0].payload["text"].startswith("Summary of the events")
        assert view[0].payload["provenance"]["model"] == model.reference
        assert [e.seq for e in view[1:]] == list(range(9, 17))  # the newest four turns, uncompacted
        entries = {e.key: e for e in store.recall(workspace).entries}
        assert set(entries) == {f"fact-{seq}" for seq in range(2, 17, 2)}
        source = entries["fact-2"].head.source
        assert (source.session_id, source.first_seq, source.last_seq) == (sid, 1, 16)
        assert entries["fact-2"].head.origin == "distillation" and entries["fact-2"].confidence == 0.75
        assert [r.snapshot_id for r in store.session_model_refs(sid).refs] == [model.snapshot_id]
        assert {j.state for j in jobs(store).values()} == {"done"}


def test_the_model_is_bound_through_plugins_once_per_run(env: WorkerSettings, workspace: Path) -> None:
    calls = []

    class Counting:
        @hookimpl(tryfirst=True)
        def model_binding(self, model):
            calls.append(model.name)

    pm = get_plugin_manager(env)
    pm.add_plugin(Counting(), PluginInfo("counting", "test", "0", "test", False))
    with MemoryStore.open(env) as store:
        for _ in range(3):
            seed(store, workspace)
        report = work(store, env, pm=pm)
    assert report.counts["done"] == 6 and calls == ["fake"]


def test_the_worker_skips_a_live_session(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, distill=False)
        lease = store.acquire_lease(sid, workspace)
        before = table_rows(env.database_path)
        report = work(store, env)
        assert report.idle and report.stopped == "empty"
        assert table_rows(env.database_path) == before
        lease.release()
        assert work(store, env).counts["done"] == 1


def test_a_session_going_live_mid_job_releases_it_without_an_attempt(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"mode": "go-live"}))
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, distill=False)
        report = work(store, env, kinds=("compaction",))
        job = jobs(store)["compaction"]
        assert report.counts["released"] == 1 and job.state == "pending" and job.attempts == 0
        assert job.diagnostics[-1].event == "released" and "interactive use wins" in job.diagnostics[-1].message
        assert all(e.kind != "summary" for e in store.replay(sid).events)


def test_a_failing_plugin_fails_the_job_with_a_bounded_diagnostic_and_the_retry_rules(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"mode": "fail"}))
    clock = Clock()
    with MemoryStore.open(env, clock=clock) as store:
        seed(store, workspace, distill=False)
        for attempt, delay in [(1, 30.0), (2, 60.0)]:
            report = work(store, env)
            job = jobs(store)["compaction"]
            assert report.counts["retrying"] == 1 and job.state == "pending" and job.attempts == attempt
            assert job.due_at == clock.now + delay
            message = job.diagnostics[-1].message
            assert message.startswith("PluginHookError: summarizer 'fake' of plugin 'fake' failed: RuntimeError: "
                                      "fake plugin failure xxx")
            assert len(message) <= 1000
            assert work(store, env).idle  # not due yet
            clock.now += delay
        report = work(store, env)
        job = jobs(store)["compaction"]
        assert report.counts["failed"] == 1 and job.state == "failed" and job.attempts == 3


def test_a_summary_over_budget_is_refused(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"mode": "overlong"}))
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, distill=False)
        work(store, env)
        job = jobs(store)["compaction"]
        assert job.attempts == 1 and "exceeded the Summary budget" in job.diagnostics[-1].message
        assert all(e.kind != "summary" for e in store.replay(sid).events)


def test_a_stop_request_inside_a_job_releases_it_without_an_attempt(env: WorkerSettings, workspace: Path) -> None:
    holder: list[Worker] = []

    class Stopping:
        @hookimpl
        def register_summarizers(self, register):
            def summarize(request):
                holder[0].stop.request("SIGTERM")
                raise AssertionError("not reached: the request raises inside the job")

            register(Summarizer("stopping", summarize))

    pm = get_plugin_manager(env)
    pm.add_plugin(Stopping(), PluginInfo("stopping", "test", "0", "test", False))
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        worker = Worker(store, WorkerSettings(summarizer="stopping"), pm=pm)
        holder.append(worker)
        report = worker.run()
        assert report.stopped == "signal:SIGTERM" and report.counts["released"] == 1 and report.claimed == 1
        job = jobs(store)["compaction"]
        assert job.state == "pending" and job.attempts == 0 and "stopped by SIGTERM" in job.diagnostics[-1].message
        assert jobs(store)["distill"].state == "pending"  # no further claim after the stop


def test_limits_stop_the_run(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        report = work(store, env, max_jobs=1)
        assert report.stopped == "max-jobs" and report.claimed == 1
        assert work(store, env, max_seconds=1e-9).stopped == "max-seconds"
        assert work(store, env).counts["done"] == 1


def test_configuration_errors_stop_before_any_claim(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        before = table_rows(env.database_path)
        with pytest.raises(ModelNotInstalledError, match="no model 'missing' is installed"):
            work(store, WorkerSettings(default_model="missing"))
        with pytest.raises(UnknownPluginComponentError, match="no summarizer named 'nope'.*available: fake, llamacpp"):
            work(store, WorkerSettings(summarizer="nope"))
        assert table_rows(env.database_path) == before


# -- the CLI -------------------------------------------------------------------------------------------------------


def test_cli_is_quiet_when_idle_and_prints_one_line_otherwise(env: WorkerSettings, workspace: Path) -> None:
    runner = CliRunner()
    idle = runner.invoke(app, ["memory", "work"])
    assert idle.exit_code == 0 and idle.output == ""
    assert json.loads(runner.invoke(app, ["memory", "work", "--json"]).output)["claimed"] == 0
    with MemoryStore.open(env) as store:
        seed(store, workspace)
    result = runner.invoke(app, ["memory", "work", "--kind", "distill"])
    assert result.exit_code == 0
    assert result.stdout.startswith("emelex work: 1 job(s) in ")
    summary, saved = result.stdout.splitlines()  # the compaction job is waiting: another --kind
    assert summary.endswith("(1 done); stopped: empty") and saved.startswith("done: distill job ")
    threads, started, ended = result.stderr.splitlines()  # not a terminal: plain lines as each job starts and ends
    assert threads.startswith("[worker] model threads: ") and "(chosen: " in threads
    assert started.startswith("[distill] job ") and " done in " in ended
    data = json.loads(runner.invoke(app, ["memory", "work", "--json", "--max-jobs", "5"]).output)
    assert data["done"] == 1 and data["jobs"][0]["kind"] == "compaction" and data["jobs"][0]["status"] == "done"


def test_cli_exit_status_reports_failed_jobs(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"mode": "fail"}))
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
    result = CliRunner().invoke(app, ["memory", "work"])
    assert result.exit_code == 3 and "(1 retrying)" in result.output


def test_cli_errors_are_one_line(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace)
    monkeypatch.setenv("EMELEX_DEFAULT_MODEL", "missing")
    result = CliRunner().invoke(app, ["memory", "work"])
    assert result.exit_code == 1 and result.output.startswith("error: no model 'missing' is installed")
    result = CliRunner().invoke(app, ["memory", "work", "--kind", "other"])
    assert result.exit_code == 2 and result.output.startswith("error: Invalid value for '--kind': must be one of")


def test_scheduler_units_run_the_worker() -> None:
    import plistlib

    config = Path(__file__).parents[3] / "config"
    plist = plistlib.loads((config / "com.emelex.memory-work.plist").read_bytes())
    assert plist["ProgramArguments"][1:3] == ["memory", "work"] and plist["StartInterval"] == 900
    for log in (plist["StandardOutPath"], plist["StandardErrorPath"]):  # the user's own logs, not world-writable /tmp
        assert log == "/Users/USERNAME/Library/Logs/emelex-memory-work.log"
    service = (config / "emelex-memory-work.service").read_text()
    assert "ExecStart=/path/to/emelex memory work " in service and "SuccessExitStatus=143" in service
    assert "OnCalendar=*:0/15" in (config / "emelex-memory-work.timer").read_text()
    cron = [line for line in (config / "emelex-work.cron").read_text().splitlines() if not line.startswith("#")]
    assert len(cron) == 1 and cron[0].split()[5:8] == ["/path/to/emelex", "memory", "work"]


def test_a_run_claims_each_next_job_in_the_transaction_completing_the_last(
    env: WorkerSettings, workspace: Path
) -> None:
    import apsw

    with MemoryStore.open(env) as store:
        seed(store, workspace)
        statements: list[str] = []
        store.db.conn.trace_v2(apsw.SQLITE_TRACE_STMT, lambda e: statements.append(e["sql"]))
        report = work(store, env)
        store.db.conn.trace_v2(0, None)
        assert report.counts["done"] == 2 and report.claimed == 2
        transactions: list[list[str]] = []
        for sql in statements:
            if sql.startswith("BEGIN"):
                transactions.append([])
            elif transactions:
                transactions[-1].append(sql.split(",")[0])
        claims = [t for t in transactions if "UPDATE jobs SET state = 'claimed'" in t]
        alone = [t for t in claims if "UPDATE jobs SET state = 'done'" not in t]
        # The first claim, and the last, which finds the queue empty; every completion claimed the next job itself.
        assert len(claims) == 4 and len(alone) == 2 and claims.index(alone[1]) == 3


def test_a_run_stopped_by_its_job_limit_leaves_the_next_job_untouched(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        assert work(store, env, max_jobs=1).stopped == "max-jobs"
        (waiting,) = [j for j in store.list_jobs().jobs if j.state != "done"]
        assert (waiting.state, waiting.diagnostics) == ("pending", ())
