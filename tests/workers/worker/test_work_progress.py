"""A worker that shows its work: each job's start, the model's progress and the attempt's cost (stored with the job),
and why jobs were left waiting, including a claim whose worker died; in process and through the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import JobStateError, MemoryStore, NewEvent, holder_is_dead
from emelex_memory.sessions.holders import holder_label
from emelex_workers.cli import app
from emelex_workers.plugin_api import GenerationProgress
from emelex_workers.worker.work import work
from emelex_workers.worker.work_report import JobReport, JobStart, WorkObserver, done_detail
from emelex_workers.settings import WorkerSettings

from ...support import table_rows
from .test_work import env, jobs, seed  # noqa: F401 - `env` is a fixture

CHAT = {"chat": 5}
PROMPT_TOKENS = 9  # the fake binding's count of its one message ("summarize this, please": 6) plus 3 for a template
COMPACTION_SOURCE_TOKENS = 4096  # seed() plans with this window: the planner records the source's tokens


def configure(monkeypatch: pytest.MonkeyPatch, **options) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps(options))


class Recorder(WorkObserver):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def job_started(self, job: JobStart) -> None:
        self.events.append(("start", job))

    def generating(self, job: JobStart, progress: GenerationProgress, max_tokens: int | None) -> None:
        self.events.append(("tokens", job.id, progress.generated_tokens, progress.prompt_tokens, max_tokens))

    def job_finished(self, report: JobReport) -> None:
        self.events.append(("end", report))


def test_the_observer_hears_each_start_the_tokens_and_each_end(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    configure(monkeypatch, **CHAT)
    recorder = Recorder()
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace)
        planned = jobs(store)["compaction"].source["source_tokens"]
        report = work(store, env, observer=recorder)
    assert report.counts["done"] == 2
    starts = [e[1] for e in recorder.events if e[0] == "start"]
    assert [(s.kind, s.session_id, s.attempt) for s in starts] == [("compaction", sid, 1), ("distill", sid, 1)]
    assert starts[0].source_tokens == planned and starts[0].source_estimated  # seed plans with estimate_tokens
    with MemoryStore.open(env) as store:
        distill_bytes = store.job_source_bytes(jobs(store)["distill"])
    assert starts[1].source_tokens == -(-distill_bytes // 4) and starts[1].source_estimated
    first = [e for e in recorder.events if e[0] == "tokens" and e[1] == starts[0].id]
    assert [e[2] for e in first] == [1, 2, 3, 4, 5, 5] and {(e[3], e[4]) for e in first} == {(PROMPT_TOKENS, 64)}
    ends = [e[1] for e in recorder.events if e[0] == "end"]
    assert [r.status for r in ends] == ["done", "done"]
    assert [e[0] for e in recorder.events][:8] == ["start", *["tokens"] * 6, "end"]  # in order, job by job


def test_each_jobs_cost_is_stored_with_it_and_survives_the_run(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    configure(monkeypatch, **CHAT)
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        report = work(store, env)
    costs = {j.kind: j.cost for j in report.jobs}
    with MemoryStore.open(env) as store:  # another connection: the cost is in the database
        stored = {kind: job.result["cost"] for kind, job in jobs(store).items()}
    assert stored == costs
    for cost in stored.values():
        assert (cost["prompt_tokens"], cost["generated_tokens"], cost["model_calls"]) == (PROMPT_TOKENS, 5, 1)
        assert isinstance(cost["seconds"], float) and cost["seconds"] >= 0 and "estimated" not in cost
    listed = CliRunner().invoke(app, ["memory", "jobs", "list"])
    assert listed.exit_code == 0
    assert listed.output.count(f"cost: {PROMPT_TOKENS} prompt + 5 generated tokens, ") == 2, listed.output
    data = json.loads(CliRunner().invoke(app, ["memory", "jobs", "list", "--json"]).output)
    assert {j["kind"]: j["result"]["cost"] for j in data["jobs"]} == stored


def test_a_binding_without_on_token_still_works_and_its_cost_is_estimated(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    configure(monkeypatch, **CHAT, legacy=True)
    recorder = Recorder()
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        report = work(store, env, observer=recorder)
        cost = jobs(store)["compaction"].result["cost"]
    assert report.counts["done"] == 1 and not [e for e in recorder.events if e[0] == "tokens"]
    assert (cost["prompt_tokens"], cost["generated_tokens"], cost["estimated"]) == (6, 5, True)  # no template


def test_a_failed_attempts_cost_goes_into_its_diagnostic(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    configure(monkeypatch, **CHAT, fail_after_chat=True)
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        report = work(store, env)
        job = jobs(store)["compaction"]
    assert report.counts["retrying"] == 1 and job.result is None
    (diagnostic,) = job.diagnostics
    assert diagnostic.event == "failure" and diagnostic.cost["generated_tokens"] == 5
    assert report.jobs[0].cost == diagnostic.cost
    listed = CliRunner().invoke(app, ["memory", "jobs", "list"]).output
    assert f"pending   attempt 2 of 3 due " in listed  # the next attempt, of the queue's three
    assert f"attempt 1 of 3 cost: {PROMPT_TOKENS} prompt + 5 generated tokens, " in listed


def test_an_observer_that_fails_is_dropped_and_the_jobs_still_run(env: WorkerSettings, workspace: Path) -> None:
    class Broken(WorkObserver):
        def job_started(self, job: JobStart) -> None:
            raise BrokenPipeError("stderr went away")

    with MemoryStore.open(env) as store:
        seed(store, workspace)
        assert work(store, env, observer=Broken()).counts["done"] == 2


# -- why jobs wait --------------------------------------------------------------------------------------------------


def test_the_report_says_why_each_job_is_left_waiting(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    configure(monkeypatch, mode="fail")
    with MemoryStore.open(env) as store:
        busy = seed(store, workspace, distill=False)
        retried = seed(store, workspace, distill=False)
        with store.acquire_lease(busy, workspace) as lease:
            lease.replay()
            report = work(store, env)  # fails the job of `retried`; the job of `busy` waits for its Session
            waiting = {w.job.session_id: w for w in report.waiting.jobs}
            assert report.waiting.total == 2
            assert (waiting[busy].reason, waiting[busy].holder, waiting[busy].until) == (
                "session-in-use", holder_label(), lease.expires_at)
            due = jobs_of(store, retried)["compaction"].due_at
            assert (waiting[retried].reason, waiting[retried].until) == ("not-due", due)
            result = CliRunner().invoke(app, ["memory", "work"])
    lines = result.stdout.splitlines()  # nothing ran, so no summary line: only why each job waits
    assert result.exit_code == 0 and len(lines) == 2
    assert all(line.startswith("waiting: compaction job ") for line in lines)
    assert any(f"Session {busy}: Session in use by {holder_label()} until " in line for line in lines)
    assert any(f"Session {retried}: attempt 2 of 3 due at " in line for line in lines)
    data = json.loads(CliRunner().invoke(app, ["memory", "work", "--json"]).output)
    assert {w["reason"] for w in data["waiting"]} == {"not-due"} and data["waiting_total"] == 2


def jobs_of(store: MemoryStore, session_id: str):
    return {j.kind: j for j in store.list_jobs(session_id=session_id).jobs}


def test_quiet_prints_only_the_summary_line(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    configure(monkeypatch, **CHAT)
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        seed(store, workspace, compact=False)  # its distill job waits: --max-jobs stops the run first
    result = CliRunner().invoke(app, ["memory", "work", "--quiet", "--max-jobs", "2"])
    assert result.exit_code == 0 and result.stderr == ""
    assert result.stdout.startswith("emelex work: 2 job(s) in ") and result.stdout.count("\n") == 1
    loud = CliRunner().invoke(app, ["memory", "work", "--max-jobs", "0"])
    assert loud.exit_code == 2  # --max-jobs is at least 1


def test_plain_lines_show_each_job_and_a_due_job_left_by_the_limit(env: WorkerSettings, workspace: Path, monkeypatch):
    configure(monkeypatch, **CHAT)
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace)
    result = CliRunner().invoke(app, ["memory", "work", "--max-jobs", "1"])
    assert result.exit_code == 0
    threads, started, ended = result.stderr.splitlines()
    assert threads.startswith("[worker] model threads: ")
    assert started.startswith("[compaction] job ") and f"Session {sid}  attempt 1 of 3  source " in started
    assert " done in " in ended and f"({PROMPT_TOKENS} prompt + 5 generated tokens)" in ended
    summary, waiting = result.stdout.splitlines()
    assert summary.endswith("stopped: max-jobs") and waiting.startswith("waiting: distill job ")
    assert waiting.endswith("due now, not run: this run stopped (max-jobs)")


# -- a worker that died -------------------------------------------------------------------------------------------

CLAIMER = """
import sys, time
from emelex_memory import MemoryStore, Settings
store = MemoryStore.open(Settings())
claim = store.claim_job("compaction")
print(claim.id, flush=True)
time.sleep(120)
"""


@pytest.fixture
def dead_claim(env: WorkerSettings, workspace: Path) -> tuple[str, str]:
    """A compaction job claimed by a worker process that was then killed with SIGKILL: (job ID, holder)."""
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
    proc = subprocess.Popen([sys.executable, "-c", CLAIMER], stdout=subprocess.PIPE, text=True, env=os.environ)
    job_id = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    with MemoryStore.open(env) as store:
        job = store.get_job(job_id)
    assert job.state == "claimed" and holder_is_dead(job.lease_holder)
    return job_id, job.lease_holder


def test_a_claim_whose_worker_died_is_named_with_the_command_that_frees_it(
    env: WorkerSettings, dead_claim: tuple[str, str]
) -> None:
    job_id, holder = dead_claim
    result = CliRunner().invoke(app, ["memory", "work"])
    assert result.exit_code == 0
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"waiting: compaction job {job_id}  Session ")
    assert f"held by worker {holder} until " in line and "but that process is gone (no such pid on this host)" in line
    assert line.endswith(f"free it now with `emelex memory jobs rescue {job_id}`")
    rescued = CliRunner().invoke(app, ["memory", "jobs", "rescue", job_id[:8]])
    assert rescued.exit_code == 0 and rescued.output.startswith(
        f"job {job_id} rescued from its dead worker; pending again: attempt 2 of 3 due ")
    with MemoryStore.open(env) as store:
        job = store.get_job(job_id)
    assert (job.state, job.attempts, job.diagnostics[-1].event) == ("pending", 1, "expired")  # counted, as on expiry
    assert f"worker {holder} died" in job.diagnostics[-1].message
    again = CliRunner().invoke(app, ["memory", "jobs", "rescue", job_id])
    assert again.exit_code == 1 and "is pending, not claimed" in again.output


def test_a_live_workers_claim_is_never_rescued(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        claim = store.claim_job("compaction")  # held by this process, which is alive
        before = table_rows(env.database_path)
        with pytest.raises(JobStateError, match="which is running or not on this host"):
            store.rescue_dead_claim(claim.id)
        assert table_rows(env.database_path) == before
        (waiting,) = store.waiting_jobs(kinds=["compaction"]).jobs
        assert (waiting.reason, waiting.holder, waiting.holder_dead) == ("held", holder_label(), False)
        claim.release()


@pytest.mark.parametrize("holder", [None, "", "nope", "0@{host}", "-1@{host}", "123@another-host", "{me}@{host}"])
def test_a_holder_is_dead_only_when_provably_so(holder: str | None) -> None:
    import socket

    label = None if holder is None else holder.format(host=socket.gethostname(), me=os.getpid())
    assert not holder_is_dead(label)


def test_waiting_jobs_refuses_a_bad_limit(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        from emelex_memory import InvalidInputError

        with pytest.raises(InvalidInputError, match="limit must be between 1 and 100"):
            store.waiting_jobs(limit=0)
        session = store.list_sessions().sessions[0].id
        with store.acquire_lease(session, store.get_session(session).workspace.path) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "still here"})])
            assert store.waiting_jobs().jobs[0].reason == "session-in-use"


def test_what_a_done_distillation_saved_is_shown_at_the_end_of_work_and_in_jobs_list(
    env: WorkerSettings, workspace: Path
) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace)
    result = CliRunner().invoke(app, ["memory", "work"])
    assert result.exit_code == 0, result.output
    ended = [line for line in result.stderr.splitlines() if line.startswith("[distill]") and " done in " in line]
    with MemoryStore.open(env) as store:
        said = done_detail(jobs(store)["distill"].result)
    assert said.startswith("completed; ") and " applied, " in said and said.endswith("by the faithfulness guards")
    assert len(ended) == 1 and ended[0].endswith(f": {said}")
    outcome = [line for line in result.stdout.splitlines() if line.startswith("done: distill job ")]
    assert len(outcome) == 1 and outcome[0].endswith(f": {said}")
    listed = CliRunner().invoke(app, ["memory", "jobs", "list", "--kind", "distill"])
    assert listed.stdout.rstrip().endswith(said)


def test_a_dead_pid_is_a_dead_holder_only_on_this_boot_and_in_this_pid_namespace() -> None:
    import socket

    from emelex_memory.sessions.holders import process_identity

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)  # its pid is now free
    identity = process_identity()
    assert identity, "this platform exposes a boot ID and a pid namespace"
    here = f"{proc.pid}@{socket.gethostname()}"
    assert holder_is_dead(f"{here}#{identity}")
    assert not holder_is_dead(here)  # no identity: it could be a process of another container or boot
    assert not holder_is_dead(f"{here}#00000000.{identity.split('.')[1]}")  # another boot
    assert not holder_is_dead(f"{here}#{identity.split('.')[0]}.1")  # another pid namespace
    assert holder_label() == f"{os.getpid()}@{socket.gethostname()}#{identity}"
