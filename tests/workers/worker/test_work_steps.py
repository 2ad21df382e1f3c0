"""A Session far past the model's window compacts in steps through the real worker pipeline (`emelex memory
compact`, then the `Worker` behind `emelex memory work`), each job's source within what the summarizer can read; a
job that failed for size is planned again as one that fits.

The fake plugin's binding stands in for the default model: an 8192-token window (SmolLM2-135M's) and a
deterministic tokenizer of 4 characters per token; every setting is the default. The summarizer quotes the
source's last sentence verbatim, as an extractive summarizer would, so the worker's output checks accept it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent, SummaryStateError, compaction_handler, run_one_job
from emelex_memory.compaction.policy import PROMPT_RESERVE_TOKENS
from emelex_workers.cli import app
from emelex_workers.cli.work_display import end_line
from emelex_workers.hookspecs import hookimpl
from emelex_workers.plugin_api import Summarizer
from emelex_workers.host.manager import PluginInfo, get_plugin_manager
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings

from .test_work import env  # noqa: F401 - the fake model and plugin of the worker tests
from .test_work_planning import fake_tokens, view_tokens

WINDOW = 8192
MODEL_REF = "smollm2-135m-instruct@sha256:" + "a" * 64
TARGET = WINDOW // 2


@pytest.fixture
def wide(env: WorkerSettings, monkeypatch) -> WorkerSettings:  # noqa: F811
    """The fake binding with the default model's 8192-token window."""
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"window": WINDOW}))
    return env


TOPICS = ("the lease table", "the asset folder", "the retry schedule", "the worker loop", "the plugin manager")


def long_session(store: MemoryStore, workspace: Path, turns: int = 150) -> str:
    """`turns` turns of about 84 fake tokens each: 150 of them are about 1.5 windows."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for i in range(turns):
            topic = TOPICS[i % len(TOPICS)]
            question = (f"Turn {i}: what should change in {topic} so that module m{i} keeps working when the disk "
                        f"is slow and the database stays busy for {i % 7 + 1} seconds?")
            answer = (f"Module m{i} should retry {i % 4 + 2} times with backoff, log each attempt, and give up "
                      f"with a typed error naming the fix; tests/test_m{i}.py covers it.")
            lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})])
        lease.release()
    return session.id


class Quoting:
    """The summarizer "quoting": the text of the source's last event, verbatim."""

    @hookimpl
    def register_summarizers(self, register) -> None:
        register(Summarizer("quoting", lambda request: request.events[-1].payload["text"]))


def run_worker(settings: WorkerSettings, **options):
    """One run of the worker on compaction jobs, as `emelex memory work --kind compaction` runs it, summarizing
    with "quoting"."""
    settings = settings.model_copy(update={"summarizer": "quoting"})
    pm = get_plugin_manager(settings)
    pm.add_plugin(Quoting(), PluginInfo("quoting", "test", "0", "test", False))
    with MemoryStore.open(settings) as store:
        return work(store, settings, pm=pm, kinds=("compaction",), **options)


def run(*args: str):
    return CliRunner().invoke(app, ["memory", *args])


def compaction_jobs(store: MemoryStore, sid: str):
    """The Session's compaction jobs, oldest first."""
    return sorted(store.list_jobs(kind="compaction", session_id=sid).jobs, key=lambda j: (j.created_at, j.id))


def assert_fits(store: MemoryStore, job) -> None:
    """The job's source, counted with the model's tokenizer, fits the window beside its Summary and the prompt."""
    tokens = sum(map(fake_tokens, store.read_compaction_source(job)))
    budget = job.source["summary_budget_tokens"]
    assert tokens == job.source["source_tokens"] <= job.source["max_source_tokens"]
    assert tokens + budget + PROMPT_RESERVE_TOKENS <= WINDOW


def test_a_150_turn_session_past_the_window_compacts_in_a_few_steps_that_each_fit(wide: WorkerSettings, workspace):
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace)
        assert view_tokens(store, sid, fake_tokens) > 1.5 * WINDOW
    planned = run("compact", sid, "--json")
    assert planned.exit_code == 0, planned.output
    data = json.loads(planned.output)
    first = data["job"]["source"]
    assert data["created"] and data["plan"]["context_window"] == WINDOW
    assert first["goal_through_seq"] > first["through_seq"]  # a step: the whole prefix would not fit
    assert "further steps" in data["reason"]

    report = run_worker(wide)
    with MemoryStore.open(wide) as store:
        jobs = compaction_jobs(store, sid)
        assert 2 <= len(jobs) <= 4 and {j.state for j in jobs} == {"done"}, report.jobs
        assert report.counts["done"] == len(jobs) == report.claimed  # one run took every step
        for job in jobs:
            assert_fits(store, job)
        for earlier, later in zip(jobs, jobs[1:]):  # each step summarizes the previous Summary plus the next slice
            assert later.source["base_summary_id"] == earlier.result["summary_event_id"]
            assert earlier.result["next_job"] == later.id
        assert jobs[-1].source["through_seq"] == first["goal_through_seq"]
        view = store.replay(sid).events  # verifies the newest Summary's provenance
        assert view[0].kind == "summary" and view[0].id == jobs[-1].result["summary_event_id"]
        assert view_tokens(store, sid, fake_tokens) <= TARGET


def test_compact_after_a_job_failed_for_size_plans_a_new_job_that_fits(wide: WorkerSettings, workspace) -> None:
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace)
    oversized = json.loads(run("compact", sid, "--context-window", "65536", "--force", "--json").output)
    assert oversized["created"]
    failed = run("work", "--kind", "compaction", "--json")
    assert failed.exit_code == 3
    with MemoryStore.open(wide) as store:
        job = store.get_job(oversized["job"]["id"])
    assert job.state == "failed"
    message = job.diagnostics[-1].message
    assert "SourceTooLargeError" in message and f"emelex memory compact {sid}" in message

    again = json.loads(run("compact", sid, "--json").output)
    assert again["created"] and again["job"]["id"] != job.id
    assert run_worker(wide).counts["retrying"] == 0
    with MemoryStore.open(wide) as store:
        done = [j for j in compaction_jobs(store, sid) if j.id != job.id]
        assert done and {j.state for j in done} == {"done"}
        for step in done:
            assert_fits(store, step)
        assert view_tokens(store, sid, fake_tokens) <= TARGET


def test_a_chain_stopped_by_a_turn_too_large_says_why_in_its_done_job_jobs_list_and_the_work_end_line(
    wide: WorkerSettings, workspace
) -> None:
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace, turns=60)
        with store.acquire_lease(sid, workspace) as lease:  # a turn no summarizer in this window can read
            list(lease.replay_all())
            lease.append_turn([NewEvent("user", {"text": "Paste: " + "the log line repeats here. " * 1200})])
            for i in range(8):
                lease.append_turn([NewEvent("user", {"text": f"Later question {i} about module n{i}?"})])
            lease.release()
    planned = json.loads(run("compact", sid, "--force", "--json").output)
    assert planned["created"] and planned["job"]["source"]["goal_through_seq"] > planned["job"]["source"]["through_seq"]

    report = run_worker(wide)
    with MemoryStore.open(wide) as store:
        jobs = compaction_jobs(store, sid)
    last = jobs[-1]
    assert {j.state for j in jobs} == {"done"} and "next_job" not in last.result
    stopped = last.result["chain_stopped"]
    assert "stopped short of its goal" in stopped and "turns are never split" in stopped
    ended = end_line(next(j for j in report.jobs if j.id == last.id))
    assert stopped in ended
    listed = run("jobs", "list", "--session", sid)
    line = next(x for x in listed.output.splitlines() if x.startswith(last.id))
    assert stopped in line


def test_a_summary_whose_summarizer_made_no_model_call_names_no_model_and_earlier_ones_naming_it_still_verify(
    wide: WorkerSettings, workspace
) -> None:
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace, turns=60)
        first = store.queue_compaction(sid, context_window=WINDOW, count_tokens=fake_tokens, force=True).job
        earlier = compaction_handler(lambda events, job: events[-1].payload["text"], model_ref=MODEL_REF)
        assert run_one_job(store, earlier, kinds="compaction").status == "done"
        assert store.replay(sid).events[0].payload["provenance"]["model"] == MODEL_REF
        for i in range(60, 120):
            with store.acquire_lease(sid, workspace) as lease:
                list(lease.replay_all())
                lease.append_turn([NewEvent("user", {"text": f"Question {i} on module m{i}?"}),
                                   NewEvent("assistant", {"text": f"Module m{i} retries {i % 4 + 2} times."})])
                lease.release()
        store.queue_compaction(sid, context_window=WINDOW, count_tokens=fake_tokens, force=True)

    report = run_worker(wide)  # "quoting" makes no model call: the job line says so
    assert report.counts["done"] >= 1 and all(j.cost["model_calls"] == 0 for j in report.jobs)
    assert "model none (a rule-based summarizer, or not recorded)" in run("sessions", "show", sid).output
    with MemoryStore.open(wide) as store:
        summary = store.replay(sid).events[0]  # verifies it, and the chain back to the earlier Summary
        assert summary.kind == "summary" and summary.payload["provenance"]["model"] is None
        assert summary.payload["provenance"]["job"] != first.id
        while True:
            try:
                store.revert_compaction(sid)
            except SummaryStateError:
                break
            view = store.replay(sid).events  # every Summary restored verifies, the earlier one naming the model too
            if view[0].kind == "summary" and view[0].payload["provenance"]["job"] == first.id:
                assert view[0].payload["provenance"]["model"] == MODEL_REF
                break
        else:
            pytest.fail("the earlier Summary was never restored")
    assert f"model {MODEL_REF}," in run("sessions", "show", sid).output


def test_a_chain_of_steps_reverted_then_redone_continues_to_its_goal(wide: WorkerSettings, workspace) -> None:
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace)
    first = json.loads(run("compact", sid, "--json").output)["job"]
    assert first["source"]["goal_through_seq"] > first["source"]["through_seq"]  # a chain of 2+ steps
    assert run_worker(wide, max_jobs=1).counts["done"] == 1
    with MemoryStore.open(wide) as store:
        step = store.get_job(first["id"]).result["next_job"]
        assert store.get_job(step).state == "pending"

    reverted = run("compaction", "revert", sid)
    assert reverted.exit_code == 0 and f"cancelled compaction job {step}" in reverted.output
    redone = run("compaction", "redo", sid, "--json")
    assert redone.exit_code == 0, redone.output
    assert json.loads(redone.output)["requeued_jobs"] == [step]
    with MemoryStore.open(wide) as store:
        assert store.get_job(step).state == "pending"

    run_worker(wide)
    with MemoryStore.open(wide) as store:
        jobs = compaction_jobs(store, sid)
        assert len(jobs) >= 2 and {j.state for j in jobs} == {"done"}
        assert jobs[-1].source["through_seq"] == first["source"]["goal_through_seq"]  # the chain reached its goal
        view = store.replay(sid).events  # verifies the last Summary and its chain
        assert view[0].id == jobs[-1].result["summary_event_id"]
        assert view_tokens(store, sid, fake_tokens) <= TARGET


def test_token_figures_of_a_plan_made_with_the_estimate_are_marked_estimated_in_compact_jobs_list_and_work(
    wide: WorkerSettings, workspace
) -> None:
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace, turns=40)
    planned = run("compact", sid, "--context-window", str(WINDOW), "--force")
    assert planned.exit_code == 0, planned.output
    with MemoryStore.open(wide) as store:
        job = compaction_jobs(store, sid)[-1]
    tokens = job.source["source_tokens"]
    assert job.source["tokens_estimated"] is True  # recorded with the job
    assert f"{tokens} tokens (estimated)" in planned.output
    line = next(x for x in run("jobs", "list").output.splitlines() if x.startswith(job.id))
    assert f"source {tokens} tokens (estimated)" in line
    started = run("work", "--kind", "compaction").stderr.splitlines()[1]  # after the model threads line
    assert started.startswith(f"[compaction] job {job.id}") and started.endswith(f"source {tokens} tokens (estimated)")

    with MemoryStore.open(wide) as store:  # planned with the model's tokenizer: exact counts, unmarked
        other = long_session(store, workspace, turns=40)
    exact = run("compact", other, "--force")
    with MemoryStore.open(wide) as store:
        counted = compaction_jobs(store, other)[-1]
    assert "tokens_estimated" not in counted.source and "(estimated)" not in exact.output
    line = next(x for x in run("jobs", "list").output.splitlines() if x.startswith(counted.id))
    assert f"source {counted.source['source_tokens']} tokens" in line and "(estimated)" not in line
