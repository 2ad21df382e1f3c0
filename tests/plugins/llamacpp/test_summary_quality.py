"""What an extractive Summary keeps, on Sessions of a real store: each answer with its question, the decisions of the
replaced turns within the budget, and, across the steps of a chained compaction through the real worker, the
previous Summary's decisions; and what the Summary guard lets through from any summarizer: a speaker-labelled line
only as that speaker's verbatim words (else marked a paraphrase), and only claims supported sentence by sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emelex_llamacpp import extractive
from emelex_memory import DegenerateOutputError, MemoryStore
from emelex_workers import faithfulness as fx
from emelex_workers.faithfulness.guards import guard_summary
from emelex_workers.plugin_api import SummaryRequest
from emelex_workers.host.manager import get_plugin_manager
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings

from .test_knowledge_quality import _chat, _session
from .test_llamacpp_extractive import ScriptedBinding
from ...workers.worker.test_work import env  # noqa: F401 - the fake model and plugin of the worker tests
from ...workers.worker.test_work_steps import WINDOW, compaction_jobs, long_session, run


def _summary(store: MemoryStore, workspace: Path, turns: list[str], budget: int) -> str:
    job, events = _session(store, workspace, _chat(*turns))
    return extractive.summarize(SummaryRequest(job, events, budget, ScriptedBinding()))


def test_each_kept_answer_comes_with_the_question_it_answers(store: MemoryStore, workspace: Path) -> None:
    text = _summary(store, workspace, [
        "Where is the search mapping kept?", "In search/mappings/products.json.",
        "Do we use type hints?", "Yes, in all new code.",
        "We run Elasticsearch 8.11 on search-02.", "Noted.",
    ], 200)
    lines = text.splitlines()
    assert lines.index("assistant: In search/mappings/products.json.") == lines.index(
        "user: Where is the search mapping kept?") + 1
    assert lines.index("assistant: Yes, in all new code.") == lines.index("user: Do we use type hints?") + 1


def test_a_long_question_is_shortened_to_its_last_clause_still_verbatim(store: MemoryStore, workspace: Path) -> None:
    question = ("One more thing before the release, since the old pipeline used a different account entirely and "
                "nobody remembers it, which IAM role does the deploy job assume?")
    text = _summary(store, workspace, [question, "The deploy job assumes `release-bot`."], 200)
    assert text.splitlines()[0] == "user: which IAM role does the deploy job assume?"


def test_the_decisions_of_the_replaced_turns_are_kept_within_the_budget(store: MemoryStore, workspace: Path) -> None:
    small_talk = ["Coffee tastes bitter whenever interns brew espresso downstairs.",
                  "Office plants wilt because radiators blast heat constantly.",
                  "Standups drag since everyone narrates weekend hiking adventures.",
                  "Keyboards clatter loudly during quarterly planning marathons.",
                  "Music playlists rotate between jazz, metal and podcasts.",
                  "Parking spots vanish early every rainy morning."]
    turns = [t for c in small_talk for t in (c, "Interesting.")]
    turns[5:5] = ["We build the wheel with `make wheel`.", "OK."]
    text = _summary(store, workspace, turns, 40)
    assert "We build the wheel with `make wheel`." in text
    assert ScriptedBinding().count_tokens(text) <= 40


def test_a_decision_that_changes_something_goes_before_other_decisions(store: MemoryStore, workspace: Path) -> None:
    text = _summary(store, workspace, [
        "Maria signs off v2.4.1 on GitHub.", "Bob owns the S3 bucket acme-logs-7.",
        "Deploys run on ECS cluster prod-3.", "Use `pip install --no-build-isolation -e .` instead.",
    ], 24)
    assert "Use `pip install --no-build-isolation -e .` instead." in text


@pytest.fixture
def wide(env: WorkerSettings, monkeypatch) -> WorkerSettings:  # noqa: F811
    """The fake binding with the default model's 8192-token window; the built-in extractive summarizer."""
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"window": WINDOW}))
    return env.model_copy(update={"summarizer": "llamacpp"})


def test_a_chained_compaction_keeps_the_decisions_of_its_first_steps_in_its_last_summary(
    wide: WorkerSettings, workspace: Path
) -> None:
    with MemoryStore.open(wide) as store:
        sid = long_session(store, workspace)
    assert run("compact", sid, "--json").exit_code == 0
    with MemoryStore.open(wide) as store:
        report = work(store, wide, pm=get_plugin_manager(wide), kinds=("compaction",))
    with MemoryStore.open(wide) as store:
        jobs = compaction_jobs(store, sid)
        assert len(jobs) >= 2 and {j.state for j in jobs} == {"done"}, report.jobs
        last = store.replay(sid).events[0]
        first_covered = jobs[0].source["through_seq"]
    assert last.kind == "summary"
    early = [n for n in range(150) if f"tests/test_m{n}.py" in last.payload["text"] and 2 * n + 2 <= first_covered]
    assert early, last.payload["text"]  # the first step's turns still speak in the final Summary


SOURCES = ["Which database do we use?", "We use PostgreSQL 16 for the orders service.",
           "Where are the migrations?", "Migration scripts live in db/migrations/."]
SPEAKERS = {"user": [SOURCES[0], SOURCES[2]], "assistant": [SOURCES[1], SOURCES[3]]}


def test_a_speaker_labelled_line_that_is_not_that_speakers_words_is_marked_a_paraphrase() -> None:
    check = fx.check_summary(
        "assistant: We use PostgreSQL 16 for the orders service.\n"
        "user: Migration scripts live in db/migrations/.\n"  # the assistant said it, not the user
        "assistant: The orders service uses PostgreSQL 16.",  # supported, but not the assistant's words
        sources=SOURCES, speakers=SPEAKERS)
    assert check.text.splitlines() == [
        "assistant: We use PostgreSQL 16 for the orders service.",
        "user (paraphrase): Migration scripts live in db/migrations/.",
        "assistant (paraphrase): The orders service uses PostgreSQL 16.",
    ]
    assert check.relabelled == 2 and check.problem is None


def test_claims_are_checked_sentence_by_sentence_and_a_mostly_unsupported_summary_is_rejected(
    store: MemoryStore, workspace: Path
) -> None:
    check = fx.check_summary("The user asked which database to use. The team keeps orders in spreadsheets. "
                             "Migration scripts live in db/migrations/.", sources=SOURCES)
    assert check.text == "The user asked which database to use. Migration scripts live in db/migrations/."
    assert check.unsupported == 1
    job, events = _session(store, workspace, _chat(*SOURCES))
    with pytest.raises(DegenerateOutputError, match="unsupported claims"):
        guard_summary("assistant: The orders service runs in production on weekends.\nuser: Backups are hourly.",
                      job=job, events=events)


def test_the_answer_that_settles_what_the_other_side_asked_is_kept_before_small_talk(
    store: MemoryStore, workspace: Path
) -> None:
    """A reply that states something (two substantive words or more) to what the other side asked settles it: it
    ranks with the decisions, its question quoted before it, ahead of remarks and small talk however wordy."""
    small_talk = ["Coffee tastes bitter whenever interns brew espresso downstairs.",
                  "Office plants wilt because radiators blast heat constantly.",
                  "Standups drag since everyone narrates weekend hiking adventures.",
                  "Keyboards clatter loudly during quarterly planning marathons."]
    turns = [t for c in small_talk for t in (c, "Interesting.")]
    turns[4:4] = ["How is the move going?", "We pushed the move to October, the van broke down."]
    text = _summary(store, workspace, turns, 40)
    lines = text.splitlines()
    assert lines.index("assistant: We pushed the move to October, the van broke down.") == lines.index(
        "user: How is the move going?") + 1
    assert ScriptedBinding().count_tokens(text) <= 40
