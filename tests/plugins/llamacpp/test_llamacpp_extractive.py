"""The built-in plugin's extractive modes without a model: candidate statements, the extractive Summary, labelled
Knowledge with measured confidence, the mode settings, and trimming of abstractive output."""

from __future__ import annotations

import json
from pathlib import Path

from emelex_llamacpp import extractive, prompts
from emelex_llamacpp.binding import generate
from emelex_workers.plugin_api import Completion
from emelex_llamacpp.candidates import candidates
from emelex_llamacpp.plugin import distill, summarize
from emelex_memory import MemoryStore, NewEvent
from emelex_workers import faithfulness as fx
from emelex_workers.plugin_api import DistillRequest, SummaryRequest, event_body
from emelex_workers.settings import WorkerSettings

TURNS = [
    ("We're packaging the cli tool as a wheel for PyPI. Can you help?", "Sure. Which build backend do you want?"),
    ("We'll use hatchling, since the project already has a pyproject.toml.",
     "Good choice. The entry point goes in src/tool/__main__.py."),
    ("What about the old setup.py?", "We could keep it for a while."),
    ("No, nobody runs it any more. Remove setup.py before release 2.0.", "Understood."),
    ("Thanks for the help.", "You're welcome."),
]


class ScriptedBinding:
    """A ModelBinding test double: one token per word, a 2048-token window, and a canned answer for each call."""

    def __init__(self, answers=()) -> None:
        self.answers, self.calls = list(answers), []

    context_window = 2048

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, messages, *, max_tokens, json_schema=None) -> str:
        self.calls.append((messages, max_tokens, json_schema))
        return self.answers.pop(0) if self.answers else "{}"

    def close(self) -> None:
        pass


def said(*texts: str, kinds=("user", "assistant")) -> list[NewEvent]:
    """One store turn of `texts`, said by `kinds` in order."""
    return [NewEvent(kind, {"text": text}) for kind, text in zip(kinds, texts, strict=True)]


def _events(store: MemoryStore, workspace: Path, turns=None):
    """A finished Session of `turns` (store turns, lists of `NewEvent`; default `TURNS`): its distill job and its
    replayed events."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        for turn in [said(*pair) for pair in TURNS] if turns is None else turns:
            lease.append_turn(turn)
        enqueued = store.finish_session(lease)
    return enqueued.job, tuple(store.replay(session.id).events)


def test_candidates_are_verbatim_statements_without_questions_small_talk_proposals_or_rejected_ones(
    store: MemoryStore, workspace: Path
) -> None:
    _, events = _events(store, workspace)
    facts = [c.text for c in candidates(events, facts=True)]
    assert facts == [
        "We're packaging the cli tool as a wheel for PyPI.",
        "We'll use hatchling, since the project already has a pyproject.toml.",
        "The entry point goes in src/tool/__main__.py.",
        "No, nobody runs it any more.",
        "Remove setup.py before release 2.0.",
    ]
    summary = [c.text for c in candidates(events, facts=False)]
    assert "We could keep it for a while." in summary and "You're welcome." not in summary


def test_the_extractive_summary_quotes_the_source_in_order_within_its_length(
    store: MemoryStore, workspace: Path
) -> None:
    job, events = _events(store, workspace)
    binding = ScriptedBinding()
    text = extractive.summarize(SummaryRequest(job, events, 40, binding))
    lines = text.splitlines()
    sources = [event_body(e) for e in events]
    assert lines and binding.calls == []  # chosen by rule, no model call
    for line in lines:
        speaker, _, said = line.partition(": ")
        assert speaker in ("user", "assistant")
        for sentence in fx.sentences(said):
            assert fx.quoted(sentence, sources), sentence
    source_words = sum(len(s.split()) for s in sources)
    assert binding.count_tokens(text) <= max(extractive.MIN_SUMMARY_TOKENS, source_words // 2 + 1) + 2 * len(lines)
    assert "src/tool/__main__.py" in text and "setup.py" in text  # statements rich in key names come first
    positions = [next(i for i, s in enumerate(sources) if line.split(": ", 1)[1].split(". ")[0] in s)
                 for line in lines]
    assert positions == sorted(positions)
    assert binding.count_tokens(extractive.summarize(SummaryRequest(job, events, 12, binding))) <= 12


def test_extractive_knowledge_quotes_statements_labelled_from_their_own_words(
    store: MemoryStore, workspace: Path
) -> None:
    job, events = _events(store, workspace)
    labels = {"1": "pypi", "2": "hatchling", "3": "src/tool/__main__.py", "4": "not-an-option", "5": "setup.py"}
    binding = ScriptedBinding([json.dumps(labels)])
    found = extractive.distill(DistillRequest(job, store_input(store, job, events), 128, binding))
    sources = [event_body(e) for e in events]
    assert [c.key for c in found] == ["pypi-packaging", "hatchling-pyproject-toml", "src-tool-main-py-entry",
                                      "nobody-runs", "setup-py-remove"]  # 2 words each; a file name is one
    assert all(fx.quoted(c.content, sources) and 0.5 <= c.confidence <= 0.9 for c in found)
    assert len({c.confidence for c in found}) > 1  # measured per statement, not a constant
    schema = binding.calls[0][2]
    third = "The entry point goes in src/tool/__main__.py."
    assert schema["properties"]["3"]["enum"] == extractive.label_options(third)
    assert schema["required"] == ["1", "2", "3", "4", "5"]


def store_input(store: MemoryStore, job, events, knowledge=()):
    """The DistillationInput the worker would build for `job`, shown `knowledge`."""
    from emelex_memory import DistillationInput
    from emelex_memory.knowledge.values import KnowledgeSource

    s = job.source
    return DistillationInput(job.session_id, str(store.get_session(job.session_id).workspace.path),
                             KnowledgeSource(job.session_id, s["first_seq"], s["last_seq"], s["digest"]),
                             events, knowledge)


def test_keys_of_statements_labelled_alike_are_two_to_four_words_and_distinct() -> None:
    taken: dict[str, str] = {}
    keys = []
    for statement in ("The Friday portion is frozen.", "The Friday portion thaws on Thursday.",
                      "The Friday portion thaws on Thursday evenings.", "Friday portion thaws Thursday."):
        keys.append(extractive.knowledge_key("friday", statement, taken))
        taken[keys[-1]] = fx.normalize(statement)
    assert keys == ["friday-portion", "friday-portion-thaws", "friday-portion-thaws-thursday",
                    "friday-portion-thaws-thursday-2"]
    assert extractive.knowledge_key("portion", "The Friday portion is frozen.", taken) == "friday-portion"


def test_a_later_job_keeps_a_statements_key_and_never_overwrites_another_statement(
    store: MemoryStore, workspace: Path
) -> None:
    job, events = _events(store, workspace)
    labels = json.dumps({"1": "pypi", "2": "hatchling", "3": "src/tool/__main__.py", "4": "nobody", "5": "setup.py"})
    first = extractive.distill(DistillRequest(job, store_input(store, job, events), 128, ScriptedBinding([labels])))
    for c in first:
        store.remember(workspace, c.key, c.content, confidence=c.confidence)
    other = _event(99, "user", "We publish to PyPI from the release branch only.")  # labelled "pypi" too
    known = store_input(store, job, (*events, other), knowledge=tuple(store.recall(workspace).entries))
    relabelled = json.dumps({"1": "packaging", "2": "hatchling", "3": "entry", "4": "nobody", "5": "setup.py",
                             "6": "pypi"})
    again = extractive.distill(DistillRequest(job, known, 128, ScriptedBinding([relabelled])))
    stored = {e.key: e.content for e in store.recall(workspace).entries}
    assert {c.key: c.content for c in again if c.key in stored} == {c.key: c.content for c in first}
    assert [c.key for c in again if c.key not in stored] == ["pypi-publish"]


def test_the_modes_are_settings_and_abstractive_stays_available(store: MemoryStore, workspace: Path) -> None:
    job, events = _events(store, workspace)
    binding = ScriptedBinding(["The user packages the cli tool for PyPI. The user then"])
    text = summarize(SummaryRequest(job, events, 100, binding, settings=WorkerSettings(summary_mode="abstractive")))
    assert text == "The user packages the cli tool for PyPI."  # an unfinished last sentence trimmed
    facts = json.dumps({"facts": [{"key": "Backend", "content": "The project uses hatchling."}]})
    binding = ScriptedBinding([facts])
    data = store_input(store, job, events)
    found = distill(DistillRequest(job, data, 128, binding, settings=WorkerSettings(distill_mode="abstractive")))
    assert [(c.key, c.content) for c in found] == [("backend", "The project uses hatchling.")]
    assert "confidence" not in json.dumps(binding.calls[0][2])  # the model proposes none; it is measured
    assert extractive.summarize(SummaryRequest(job, events, 100, ScriptedBinding())) == summarize(
        SummaryRequest(job, events, 100, ScriptedBinding()))  # extractive by default


def test_generate_falls_back_to_the_protocols_chat_on_other_bindings() -> None:
    binding = ScriptedBinding(["hello"])
    assert generate(binding, [{"role": "user", "content": "hi"}], max_tokens=5, attempt=2) == Completion(
        "hello", "unknown")
    assert prompts.complete_sentences("One. Two") == "One." and prompts.complete_sentences("One") == "One"


def _event(seq: int, kind: str, text: str):
    """A replayed event built by hand, as replay would return it."""
    from emelex_memory import Event

    body = json.dumps({"text": text})
    return Event((seq, seq, seq, 0, kind, body, len(body), 0, 0.0, None))


PREVIOUS_SUMMARY = ("summary: The orders service runs PostgreSQL 16 on db-1.\n"
                    "user: Migration scripts live in db/migrations/ since release 3.2.")


def test_a_step_does_not_repeat_the_previous_summarys_labels() -> None:
    events = (_event(1, "summary", PREVIOUS_SUMMARY), _event(2, "user", "Backups run nightly at 02:00 with pg_dump."))
    text = extractive.summarize(SummaryRequest(None, events, 200, ScriptedBinding()))
    assert "summary: The orders service runs PostgreSQL 16 on db-1." in text.splitlines()
    assert not any(line.startswith(("summary: summary:", "user: user:")) for line in text.splitlines())


def test_facts_never_come_from_a_summary_event() -> None:
    events = (_event(1, "summary", PREVIOUS_SUMMARY), _event(2, "user", "Backups run nightly at 02:00 with pg_dump."))
    assert [c.text for c in candidates(events, facts=True)] == ["Backups run nightly at 02:00 with pg_dump."]
    assert "The orders service runs PostgreSQL 16 on db-1." in [c.text for c in candidates(events, facts=False)]


def test_the_extractive_summary_fills_the_jobs_budget_not_a_fixed_cap() -> None:
    events = tuple(_event(i, "user" if i % 2 else "assistant", f"Module m{i} keeps its retry count of {i} in "
                          f"config/m{i}.toml and logs to logs/m{i}.log every night.") for i in range(1, 121))
    binding = ScriptedBinding()
    text = extractive.summarize(SummaryRequest(None, events, 900, binding))
    assert 800 < binding.count_tokens(text) <= 900  # half the source's ~1700 tokens, within the budget


def test_a_step_favours_its_new_slice_over_the_previous_summary() -> None:
    previous = "\n".join(f"user: Shard s{i} uses db{i}.internal port 54{i:02d}." for i in range(12))
    fresh = ["We moved the nightly billing export to the new warehouse cluster on Tuesday.",
             "The finance team now reads those billing reports from the shared warehouse_exports schema."]
    events = (_event(1, "summary", previous), *(_event(2 + i, "user", t) for i, t in enumerate(fresh)))
    text = extractive.summarize(SummaryRequest(None, events, 60, ScriptedBinding()))
    assert all(t in text for t in fresh), text  # the previous Summary's decisions take at most half the room
    assert "Shard s" in text  # and keep their place: a chain keeps every step's decisions


def test_a_chat_sessions_summary_records_its_tool_rounds_by_rule_and_the_guard_cuts_nothing(
    store: MemoryStore, settings: WorkerSettings, workspace: Path
) -> None:
    from emelex_workers.faithfulness import guards

    from .chat_session import chat_session

    events = tuple(store.replay(chat_session(store, settings, workspace)).events)
    job = store.list_jobs().jobs[0]
    binding = ScriptedBinding()
    text = extractive.summarize(SummaryRequest(job, events, 2000, binding))
    lines = text.splitlines()
    assert binding.calls == []
    assert lines[:7] == [
        "user: What files are in this workspace?",
        "tool: list_dir `.`: ok, `file 40 config.toml`.",  # the identical second round is said once
        "assistant: file 52 main.py.",  # a sentence the splitter would join to the one before gets its own line
        "assistant: file 31 notes.md.",
        "user: What port does config.toml set?",  # the question before the tool round its answer follows
        "tool: read_file `config.toml`: ok, `[server]`.",
        "assistant: config.toml sets port = 8080.",
    ]
    assert "tool: run_command `ls`: denied." in lines and not any("tool_calls" in line for line in lines)
    check = fx.check_summary(text, sources=guards.source_texts(events), speakers=guards.speaker_texts(events))
    assert (check.text, check.problem, check.relabelled) == (text, None, 0)


def test_an_answer_echoing_lowercase_lines_keeps_each_as_a_sentence(store: MemoryStore, workspace: Path) -> None:
    job, events = _events(store, workspace, [said(
        "We keep the service files under deploy/.",
        "deploy/api.service runs gunicorn\ndeploy/worker.service runs celery\nmain.py starts both")])
    text = extractive.summarize(SummaryRequest(job, events, 200, ScriptedBinding()))
    assert text.splitlines() == ["user: We keep the service files under deploy/.",
                                 "assistant: deploy/api.service runs gunicorn.",
                                 "assistant: deploy/worker.service runs celery.", "assistant: main.py starts both."]
    assert fx.check_summary(text, sources=[event_body(e) for e in events]).text == text


def test_a_summary_of_small_talk_after_a_context_note_quotes_what_was_said_not_the_note(
    store: MemoryStore, workspace: Path
) -> None:
    note = NewEvent("context", {"source": "workspace_map", "text": "Workspace: file 40 config.toml"})
    job, events = _events(store, workspace, [[note, *said("Hi there!", "Hello!")]])
    assert extractive.summarize(SummaryRequest(job, events, 200, ScriptedBinding())) == "user: Hi there!"


def test_answers_with_code_blocks_are_summarised_whole_and_the_guard_cuts_nothing(
    store: MemoryStore, workspace: Path
) -> None:
    from emelex_workers.faithfulness import guards

    job, events = _events(store, workspace, [
        said("List the files.", "```\nconfig.toml\nmain.py\n```"),
        said("Show the config.", "```toml\n[server]\nport = 8080\n```\nThe port is 8080."),
        said("How do I run it?", "Run this:\n```\npython main.py\n```"),
    ])
    text = extractive.summarize(SummaryRequest(job, events, 2000, ScriptedBinding()))
    assert "assistant: ```toml\n[server]\nport = 8080\n```\nassistant: The port is 8080." in text
    assert "assistant: ```\npython main.py\n```" in text and "```." not in text
    check = fx.check_summary(text, sources=guards.source_texts(events), speakers=guards.speaker_texts(events))
    assert (check.text, check.repeated, check.unsupported, check.relabelled, check.trimmed) == (text, 0, 0, 0, False)
    step = events[0]._replace(kind="summary", payload_json=json.dumps({"text": text}))  # a next step reads blocks whole
    first = [c.text for c in candidates([step], facts=False)][:2]
    assert first == ["List the files.", "```\nconfig.toml\nmain.py\n```"]


def test_a_step_over_a_summary_with_tool_lines_keeps_them_as_records_and_the_guard_cuts_nothing() -> None:
    from emelex_memory import Event
    from emelex_workers.faithfulness import guards

    def event(seq: int, kind: str, payload: dict) -> Event:
        body = json.dumps(payload)
        return Event((seq, seq, seq, 0, kind, body, len(body), 0, 0.0, None))

    previous = ("user: What port does config.toml set?\ntool: read_file `config.toml`: ok, `[server]`.\n"
                "assistant: config.toml sets port = 8080.")
    events = (
        event(1, "summary", {"text": previous}),
        event(2, "user", {"text": "Which file defines parse_args?"}),
        event(3, "tool_calls", {"round": 1, "calls": [{"call_id": "c1", "tool": "search_text",
                                                       "arguments": {"text": "def parse_args"}}]}),
        event(4, "tool_result", {"call_id": "c1", "tool": "search_text", "outcome": "ok",
                                 "output": "main.py:4: def parse_args(argv):"}),
        event(5, "assistant", {"text": "parse_args is defined in main.py."}),
    )
    text = extractive.summarize(SummaryRequest(None, events, 2000, ScriptedBinding()))
    assert text.splitlines() == [
        "user: What port does config.toml set?", "tool: read_file `config.toml`: ok, `[server]`.",
        "assistant: config.toml sets port = 8080.", "user: Which file defines parse_args?",
        "tool: search_text `def parse_args`: ok, `main.py:4: def parse_args(argv):`.",
        "assistant: parse_args is defined in main.py.",
    ]
    check = fx.check_summary(text, sources=guards.source_texts(events), speakers=guards.speaker_texts(events))
    assert (check.text, check.problem, check.relabelled) == (text, None, 0)


def test_a_chat_of_failed_turns_is_summarised_as_each_request_its_calls_and_how_the_turn_ended(
    store: MemoryStore, workspace: Path
) -> None:
    from itertools import count

    from ...support.agent import ScriptedBinding as FourCharacterTokens

    ids = count()

    def round_(n: int, path: str, *tools: str) -> list[NewEvent]:  # as the default model proposes them
        calls = [{"call_id": f"{next(ids):032x}", "tool": t, "arguments": {"path": path}} for t in tools]
        return [NewEvent("tool_calls", {"round": n, "calls": calls}), *[
            NewEvent("tool_result", {"call_id": c["call_id"], "tool": c["tool"], "outcome": "error", "output": (
                f"tool '{c['tool']}' failed: WorkspacePathError: path '{path}' does not exist in the workspace")})
            for c in calls]]

    failed = NewEvent("turn_failed", {"reason": "error",
                                      "diagnostic": "the model asked for more than 4 tool rounds in one turn"})
    job, events = _events(store, workspace, [
        said("What files are in this workspace?", kinds=("user",)), round_(1, "list_dir.txt", "list_dir", "read_file"),
        round_(2, "list_dir.txt", "list_dir", "read_file"), [failed],
        said("What port does config.toml set?", kinds=("user",)), round_(1, "list_dir", "list_dir"), [failed],
    ])
    text = extractive.summarize(SummaryRequest(job, events, 2000, FourCharacterTokens()))
    missing = "error, `WorkspacePathError: path '{}' does not exist in the workspace`."
    assert text.splitlines() == [
        "user: What files are in this workspace?",  # a request is quoted with the calls it led to
        f"tool: list_dir `list_dir.txt`: {missing.format('list_dir.txt')}",  # each call once, the same path or not
        f"tool: read_file `list_dir.txt`: {missing.format('list_dir.txt')}",
        "system: The turn ended without an answer (error): `the model asked for more than 4 tool rounds in one "
        "turn`.",
        "user: What port does config.toml set?",
        f"tool: list_dir `list_dir`: {missing.format('list_dir')}",
    ]
