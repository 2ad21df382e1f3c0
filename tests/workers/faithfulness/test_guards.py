"""The worker's faithfulness guards through a real store and worker, with scripted summarizer and distiller doubles:
unfaithful candidates are dropped and counted in the job's result, degenerate Summaries are retryable failures, a
retry gets its attempt number, and a retry repeating a rejected output fails for good."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory import CompactionPolicy, KnowledgeCandidate, MemoryStore, NewEvent
from emelex_workers.faithfulness.guards import guard_candidates
from emelex_workers.hookspecs import hookimpl
from emelex_workers.models import ModelManager
from emelex_workers.plugin_api import Distiller, Summarizer
from emelex_workers.host.manager import PluginInfo, get_plugin_manager
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings

from ...support import Clock
from ...support.plugins import activate, fake_model_file, fake_plugin_distribution

TURNS = [
    ("Which database do we use?", "We use PostgreSQL 16 for the orders service."),
    ("Where are the migrations?", "Migration scripts live in db/migrations/."),
]
EXAMPLE = "The server listens on port 8080."


class Scripted:
    """A plugin whose summarizer and distiller return what the test scripts, per attempt; it records requests.
    Its summarizer calls the model first, as a model-based one does, unless `rule_based`."""

    def __init__(self, summaries=(), proposals=(), *, rule_based=False) -> None:
        self.summaries, self.proposals, self.requests = list(summaries), list(proposals), []
        self.rule_based = rule_based

    @hookimpl
    def register_summarizers(self, register):
        def summarize(request):
            self.requests.append(request)
            if not self.rule_based:
                request.model.chat([{"role": "user", "content": "summarize"}], max_tokens=1)
            return self.summaries[min(request.attempt, len(self.summaries) - 1)]

        register(Summarizer("scripted", summarize, examples=(EXAMPLE,)))

    @hookimpl
    def register_distillers(self, register):
        def distill(request):
            self.requests.append(request)
            return list(self.proposals)

        register(Distiller("scripted", distill, examples=(EXAMPLE,)))


@pytest.fixture
def env(tmp_path: Path, home: Path, monkeypatch) -> WorkerSettings:
    """Home with the fake model installed (bound by the fake plugin) and the scripted components selected."""
    activate(monkeypatch, fake_plugin_distribution(tmp_path / "site"))
    monkeypatch.setenv("EMELEX_HOME", str(home))
    for key, value in {"DEFAULT_MODEL": "fake", "SUMMARIZER": "scripted", "DISTILLER": "scripted"}.items():
        monkeypatch.setenv(f"EMELEX_{key}", value)
    settings = WorkerSettings()
    with ModelManager(settings) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="fake")
    return settings


def _run(store: MemoryStore, env: WorkerSettings, plugin: Scripted):
    pm = get_plugin_manager(env)
    pm.add_plugin(plugin, PluginInfo("scripted", "test", "0", "test", False))
    return work(store, env, pm=pm)


def _seed(store: MemoryStore, workspace: Path, *, compact: bool) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        for user, assistant in TURNS:
            lease.append_turn([NewEvent("user", {"text": user}), NewEvent("assistant", {"text": assistant})])
        if compact:
            store.queue_compaction(session.id, context_window=4096, force=True,
                                   policy=CompactionPolicy(preserve_turns=0))
            lease.release()
        else:
            store.finish_session(lease)
    return session.id


def _job(store: MemoryStore, kind: str):
    return next(j for j in store.list_jobs().jobs if j.kind == kind)


def test_unfaithful_candidates_are_dropped_and_counted_in_the_job_result(env: WorkerSettings, workspace: Path) -> None:
    plugin = Scripted(proposals=[
        KnowledgeCandidate("database", "We use PostgreSQL 16 for the orders service.", 0.7),  # a quote
        KnowledgeCandidate("migrations", "The migration scripts live in db/migrations.", 0.6),  # supported
        KnowledgeCandidate("port", EXAMPLE, 0.9),  # the worked example
        KnowledgeCandidate("cache", "Redis caches the orders.", 0.8),  # not in the source
        KnowledgeCandidate("feature", "The feature is a feature.", 0.5),  # vacuous
        KnowledgeCandidate("db-version", "We use PostgreSQL 16 for the orders service.", 1.5),  # out of range
        KnowledgeCandidate("database", "Orders use PostgreSQL.", 0.5),  # a second content for "database"
        KnowledgeCandidate("bad\x00key", "We use PostgreSQL 16 for the orders service.", 0.5),  # invalid key
    ])
    with MemoryStore.open(env) as store:
        _seed(store, workspace, compact=False)
        report = _run(store, env, plugin)
        job = _job(store, "distill")
        entries = {e.key: (e.content, e.confidence) for e in store.recall(workspace).entries}
    assert report.counts["done"] == 1 and job.state == "done"
    assert entries == {"database": ("We use PostgreSQL 16 for the orders service.", 0.7),
                       "migrations": ("The migration scripts live in db/migrations.", 0.6)}
    assert {k: v for k, v in job.result.items() if k.startswith("rejected_")} == {
        "rejected_confidence": 1, "rejected_invalid": 1, "rejected_machinery": 0, "rejected_vacuous": 1,
        "rejected_example": 1, "rejected_unsupported": 1, "rejected_conflicting": 1}
    assert job.result["applied"] == 2 and "nothing_saved" not in job.result
    assert plugin.requests[0].attempt == 0 and plugin.requests[0].settings is not None


def test_a_distillation_that_saves_nothing_says_why(env: WorkerSettings, workspace: Path) -> None:
    plugin = Scripted(proposals=[KnowledgeCandidate("cache", "Redis caches the orders.", 0.8)] +
                      [KnowledgeCandidate(f"k{i}", "Migration scripts live in db/migrations/.", 0.9 + i) for i in
                       range(1, 4)])
    with MemoryStore.open(env) as store:
        _seed(store, workspace, compact=False)
        report = _run(store, env, plugin)
        job = _job(store, "distill")
        assert store.recall(workspace).entries == []
    assert job.state == "done" and job.result["applied"] == 0
    assert job.result["nothing_saved"] == "nothing saved: 3 rejected (confidence), 1 rejected (unsupported)"
    assert report.jobs[0].detail == f"completed; {job.result['nothing_saved']}"  # what `emelex memory work` prints


def test_a_distiller_proposing_nothing_is_named_as_the_reason(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        _seed(store, workspace, compact=False)
        _run(store, env, Scripted(proposals=[]))
        assert _job(store, "distill").result["nothing_saved"] == "the distiller proposed no Knowledge"


def test_the_summary_is_cleaned_before_it_is_stored(env: WorkerSettings, workspace: Path) -> None:
    raw = ("We use PostgreSQL 16 for the orders service. We use PostgreSQL 16 for the orders service. "
           "Migration scripts live in db/migrations/. Migrations run on every deploy. The assistant then")
    with MemoryStore.open(env) as store:
        sid = _seed(store, workspace, compact=True)
        _run(store, env, Scripted(summaries=[raw]))
        summary = store.replay(sid).events[0]
    assert summary.kind == "summary"
    assert summary.payload["text"] == ("We use PostgreSQL 16 for the orders service. Migration scripts live in "
                                       "db/migrations/.")  # "Migrations run on every deploy." no source says


def test_a_degenerate_summary_fails_retryably_and_the_retry_gets_its_attempt(
    env: WorkerSettings, workspace: Path
) -> None:
    looped = "We use PostgreSQL 16. " * 6
    plugin = Scripted(summaries=[looped, f"{EXAMPLE} We use PostgreSQL 16. Migration scripts live in db/migrations/."])
    clock = Clock()
    with MemoryStore.open(env, clock=clock) as store:
        sid = _seed(store, workspace, compact=True)
        report = _run(store, env, plugin)
        job = _job(store, "compaction")
        assert report.counts["retrying"] == 1 and job.state == "pending" and job.attempts == 1
        message = job.diagnostics[-1].message
        assert message.startswith("DegenerateOutputError: degenerate Summary (output ")
        assert "5 of its 6 sentences were cut (5 repeated" in message
        assert all(e.kind != "summary" for e in store.replay(sid).events)
        clock.now += 31
        report = _run(store, env, plugin)
        summary = store.replay(sid).events[0]
    assert report.counts["done"] == 1 and [r.attempt for r in plugin.requests] == [0, 1]
    text = "We use PostgreSQL 16. Migration scripts live in db/migrations/."  # the example's echo cut
    assert summary.kind == "summary" and summary.payload["text"] == text


def test_a_retry_repeating_a_rejected_summary_fails_for_good(env: WorkerSettings, workspace: Path) -> None:
    plugin = Scripted(summaries=[EXAMPLE])  # the same worked-example echo on every attempt
    clock = Clock()
    with MemoryStore.open(env, clock=clock) as store:
        sid = _seed(store, workspace, compact=True)
        _run(store, env, plugin)
        assert "nothing is left" in _job(store, "compaction").diagnostics[-1].message
        clock.now += 31
        report = _run(store, env, plugin)
        job = _job(store, "compaction")
        assert all(e.kind != "summary" for e in store.replay(sid).events)
    assert report.counts["failed"] == 1 and job.state == "failed" and job.attempts == 2
    message = job.diagnostics[-1].message
    assert message.startswith("RepeatedOutputError: attempt 2 of 3 returned the same degenerate Summary (output ")
    assert "emelex models install PATH" in message


def test_a_degenerate_summary_from_a_summarizer_that_made_no_model_call_fails_for_good_saying_what_a_user_can_do(
    env: WorkerSettings, workspace: Path
) -> None:
    plugin = Scripted(summaries=[EXAMPLE], rule_based=True)  # a retry would compute the same output
    with MemoryStore.open(env) as store:
        sid = _seed(store, workspace, compact=True)
        report = _run(store, env, plugin)
        job = _job(store, "compaction")
        assert all(e.kind != "summary" for e in store.replay(sid).events)
        message = job.diagnostics[-1].message
        # What it advises works: another span is a new plan, queued while the failed job stays failed.
        again = store.queue_compaction(sid, context_window=4096, force=True, policy=CompactionPolicy(preserve_turns=1))
    assert report.counts["failed"] == 1 and job.state == "failed" and job.attempts == 1
    assert message.startswith("DeterministicOutputError: degenerate Summary (output ")
    assert "nothing was replaced: the Session keeps its full history and can go on" in message
    assert f"`emelex memory compact {sid} --force --preserve-turns N` with N other than 0" in message
    assert "EMELEX_SUMMARIZER" in message and "abstractive" not in message.casefold()
    assert "jobs retry" not in message  # a retry computes the same output
    assert again.created and again.job.id != job.id


def test_guard_candidates_leaves_what_is_not_a_candidate_batch_to_validation() -> None:
    assert guard_candidates("text", events=[]) == "text"
    assert guard_candidates([1, 2], events=[]) == [1, 2]
    assert guard_candidates(None, events=[]) is None


def test_a_summary_event_does_not_support_a_knowledge_candidate(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([NewEvent("user", {"text": "Backups run nightly with pg_dump."})])
        lease.release()
    summary = store.replay(session.id).events[0]._replace(kind="summary")
    said = KnowledgeCandidate("backups", "Backups run nightly with pg_dump.", 0.5)
    assert guard_candidates([said], events=[summary]).rejected["rejected_unsupported"] == 1
