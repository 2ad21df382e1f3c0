"""The author's kit: `emelex plugins new` and its template, and `emelex_workers.plugin_testing`, which runs a
plugin's output through the worker's own checks and guards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    DeterministicOutputError,
    InvalidCandidateError,
    KnowledgeCandidate,
    PermanentJobError,
    PluginHookError,
)
from emelex_workers import plugin_testing as kit
from emelex_workers.cli import app
from emelex_workers.plugin_api import Distiller, Summarizer

CHAT = [("user", "Which database should the cache use?"), ("assistant", "We decided to use SQLite for the cache.")]


@pytest.fixture
def cli_home(home: Path, monkeypatch) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def test_a_new_plugin_from_the_template_passes_its_own_tests(cli_home: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plugins", "new", "notes", "--directory", str(tmp_path)])
    assert result.exit_code == 0, result.output
    package = tmp_path / "emelex-notes"
    assert result.output.startswith(f"created {package}: a summarizer, a distiller and a tool named 'notes'")
    assert sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file()) == [
        "README.md", "emelex_notes/__init__.py", "emelex_notes/plugin.py", "pyproject.toml", "tests/test_plugin.py"]
    assert 'notes = "emelex_notes.plugin"' in (package / "pyproject.toml").read_text()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=package,
                         capture_output=True, text=True, timeout=120, env={**_env(), "PYTHONPATH": str(package)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize("name", ["Notes", "1st", "my-plugin", "x" * 32, ""])
def test_a_bad_plugin_name_is_one_line_and_creates_nothing(cli_home: Path, tmp_path: Path, name: str) -> None:
    result = CliRunner().invoke(app, ["plugins", "new", name, "--directory", str(tmp_path)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: plugin name {name!r} is not a lowercase identifier")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("name", "suggested"), [("my-notes", "my_notes"), ("Notes", "notes"), ("1st", "st"),
                                               ("My Notes!", "my_notes"), ("x-y-", "x_y"),
                                               ("x" * 32, "x" * 31), ("", "notes"), ("9", "notes")])
def test_a_bad_plugin_name_suggests_the_nearest_good_one(cli_home: Path, tmp_path: Path, name: str,
                                                          suggested: str) -> None:
    result = CliRunner().invoke(app, ["plugins", "new", name, "--directory", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.endswith(f"; choose e.g. {suggested!r}\n"), result.output


@pytest.mark.parametrize("where", ["missing/deeper", "a-file"])
def test_a_folder_that_is_not_there_is_one_line_and_creates_nothing(cli_home: Path, tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("x")
    result = CliRunner().invoke(app, ["plugins", "new", "notes", "--directory", str(tmp_path / where)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output == f"error: {tmp_path / where} is not an existing folder: create it first, or pass another --directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_folder_that_cannot_be_written_is_one_line(cli_home: Path) -> None:
    """/proc refuses new files even to root: the error is one line, never an OSError's traceback."""
    result = CliRunner().invoke(app, ["plugins", "new", "notes", "--directory", "/proc"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: cannot write the plugin package in /proc: ")
    assert result.output.endswith("; choose a folder you can write to (--directory)\n")


def test_an_existing_folder_is_left_alone(cli_home: Path, tmp_path: Path) -> None:
    (tmp_path / "emelex-notes").mkdir()
    (tmp_path / "emelex-notes" / "mine.txt").write_text("keep")
    result = CliRunner().invoke(app, ["plugins", "new", "notes", "--directory", str(tmp_path)])
    assert result.exit_code == 1 and "already exists" in result.output and result.output.count("\n") == 1
    assert [p.name for p in (tmp_path / "emelex-notes").iterdir()] == ["mine.txt"]


# -- the kit applies the worker's checks ---------------------------------------------------------------------


def test_the_kit_builds_events_jobs_and_requests_in_one_line() -> None:
    request = kit.summary_request(CHAT, budget_tokens=50)
    assert [(e.seq, e.turn, e.kind, e.payload["text"]) for e in request.events] == [
        (1, 1, "user", CHAT[0][1]), (2, 1, "assistant", CHAT[1][1])]
    assert request.job.kind == "compaction" and request.job.source["summary_budget_tokens"] == 50
    data = kit.distill_request(CHAT).data
    assert data.events == request.events and (data.source.first_seq, data.source.last_seq) == (1, 2)


def test_a_summary_that_is_not_text_is_named_for_what_it_is() -> None:
    component = Summarizer("dicty", lambda request: {"text": "a summary"}, needs_model=False)
    with pytest.raises(PluginHookError, match=r"^summarizer 'dicty' of plugin '\S+' returned a dict, not the Summary "
                                              r"text \(a str\)$"):
        kit.run_summarizer(component, CHAT)


def test_the_kit_applies_the_budget_and_the_guards() -> None:
    long = Summarizer("long", lambda request: "The user asked: " + CHAT[0][1] * 20)
    with pytest.raises(PluginHookError, match="exceeded the Summary budget of 20 tokens"):
        kit.run_summarizer(long, CHAT, budget_tokens=20)
    invented = Summarizer("invented", lambda request: "Kubernetes clusters were discussed at length by Zorblax.",
                          needs_model=False)
    with pytest.raises(DeterministicOutputError, match="degenerate Summary"):
        kit.run_summarizer(invented, CHAT)


def test_a_model_free_plugin_that_calls_the_model_fails_for_good() -> None:
    def summarize(request):
        return request.model.chat([{"role": "user", "content": "hi"}], max_tokens=8)

    with pytest.raises(PermanentJobError, match="declared needs_model=False but called the model"):
        kit.run_summarizer(Summarizer("liar", summarize, needs_model=False), CHAT)


def test_the_test_model_answers_and_is_counted() -> None:
    def summarize(request):
        return request.model.chat([{"role": "user", "content": "summarize"}], max_tokens=64)

    model = kit.TestModel(["The user asked which database the cache should use."])
    run = kit.run_summarizer(Summarizer("llm", summarize), CHAT, model=model)
    assert run.model_calls == 1 and model.calls == [[{"role": "user", "content": "summarize"}]]


def test_the_kit_drops_and_counts_unfaithful_candidates_and_refuses_a_bad_batch() -> None:
    def distill(request):
        return [KnowledgeCandidate("db", "We decided to use SQLite for the cache", 0.8),
                KnowledgeCandidate("made-up", "The team deploys on Kubernetes every Friday night", 0.8)]

    run = kit.run_distiller(Distiller("d", distill), CHAT)
    assert [c.key for c in run.candidates] == ["db"] and run.rejected == {"rejected_unsupported": 1}
    with pytest.raises(InvalidCandidateError):
        kit.run_distiller(Distiller("bad", lambda request: ["not a candidate"]), CHAT)
