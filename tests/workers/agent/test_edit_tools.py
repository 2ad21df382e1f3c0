"""Writes a person can see before approving them: edit_file replaces an exact text found once or appends a line,
and refuses (the file unchanged) when the text is missing or not unique; write_file replaces an existing file only
with replace: true; the previews an approval prompt shows are a unified diff of the change, or the command and its
working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emelex_workers.agent.protocol import ProposedCall
from emelex_workers.agent.tools import RegisteredTool, ToolInvocation, ToolOutput, run_tool
from emelex_workers.cli.chat_show import approval_text
from emelex_tools.plugin import tool_specs

from ...support import file_state

BUILTIN = {spec.name: RegisteredTool(spec, "tools", "test") for spec in tool_specs()}
NOTES = "Mon: garden\nTue: bike\nWed: books\nThu: rain\n"


def call(tool: str, workspace: Path, **arguments) -> ToolOutput:
    return run_tool(BUILTIN[tool], ToolInvocation("call-1", tool, arguments, workspace))


def shown(tool: str, workspace: Path, **arguments) -> str:
    return approval_text(ProposedCall(tool, arguments), BUILTIN[tool], workspace)


@pytest.fixture
def notes(workspace: Path) -> Path:
    (workspace / "journal.txt").write_text(NOTES)
    (workspace / "twice.txt").write_text("port = 1\nport = 1\n")
    (workspace / "bare.txt").write_text("no newline at the end")
    return workspace


def test_edit_file_replaces_the_exact_text_once_and_keeps_the_rest(notes: Path) -> None:
    out = call("edit_file", notes, path="journal.txt", old="Tue: bike", new="Tue: fixed the bike")
    assert not out.is_error, out.text
    assert (notes / "journal.txt").read_text() == NOTES.replace("Tue: bike", "Tue: fixed the bike")
    assert sorted(p.name for p in notes.iterdir()) == ["bare.txt", "journal.txt", "twice.txt"]  # no temporary file


def test_edit_file_without_old_appends_a_line_keeping_every_line(notes: Path) -> None:
    assert not call("edit_file", notes, path="journal.txt", new="Fri: shipped").is_error
    assert (notes / "journal.txt").read_text() == NOTES + "Fri: shipped\n"
    assert not call("edit_file", notes, path="bare.txt", new="second line\n").is_error
    assert (notes / "bare.txt").read_text() == "no newline at the end\nsecond line\n"


@pytest.mark.parametrize("arguments, says", [
    ({"path": "journal.txt", "old": "Sun: nothing", "new": "x"}, "the text to replace is not in journal.txt"),
    ({"path": "twice.txt", "old": "port = 1", "new": "port = 2"}, "occurs 2 times in twice.txt"),
    ({"path": "missing.txt", "new": "x"}, "does not exist"),
    ({"path": "journal.txt", "new": ""}, "nothing to append"),
])
def test_edit_file_refuses_a_text_not_found_or_not_unique_and_changes_nothing(notes: Path, arguments, says) -> None:
    before = file_state(notes)
    out = call("edit_file", notes, **arguments)
    assert out.is_error and says in out.text, out.text
    assert file_state(notes) == before


def test_write_file_over_an_existing_file_needs_replace_and_changes_nothing_without_it(notes: Path) -> None:
    before = file_state(notes)
    out = call("write_file", notes, path="journal.txt", content="shipped")
    assert out.is_error and "journal.txt exists; to change part of it use edit_file" in out.text
    assert file_state(notes) == before
    assert not call("write_file", notes, path="journal.txt", content="shipped\n", replace=True).is_error
    assert (notes / "journal.txt").read_text() == "shipped\n"
    assert not call("write_file", notes, path="new.txt", content="fresh\n").is_error


def test_the_approval_of_a_change_shows_its_unified_diff(notes: Path) -> None:
    """Every line a replacement removes is shown as removed; an append shows its added line; a new file shows its
    lines added; a refused or failing call says so; none of them touches the workspace."""
    before = file_state(notes)
    replaced = shown("write_file", notes, path="journal.txt", content="shipped\n", replace=True)
    assert replaced.startswith("write_file journal.txt (replaces the whole file):\n--- a/journal.txt\n+++ b/journal.txt")
    for line in NOTES.splitlines():
        assert f"\n-{line}\n" in replaced + "\n", replaced
    assert "\n+shipped" in replaced
    appended = shown("edit_file", notes, path="journal.txt", new="Fri: shipped")
    assert appended.startswith("edit_file journal.txt (append):") and "\n+Fri: shipped" in appended
    assert "\n-" not in appended.replace("\n--- ", "\n")
    edited = shown("edit_file", notes, path="journal.txt", old="Tue: bike", new="Tue: fixed")
    assert "\n-Tue: bike\n+Tue: fixed" in edited and "\n Mon: garden" in edited
    new = shown("write_file", notes, path="idea.txt", content="a bot\nthat waters\n")
    assert new.startswith("write_file idea.txt (new file):\n--- /dev/null\n+++ b/idea.txt") and "\n+that waters" in new
    assert "refused: the file exists and replace is not set" in shown("write_file", notes, path="journal.txt",
                                                                      content="x")
    assert "would fail: the text to replace occurs 2 times" in shown("edit_file", notes, path="twice.txt",
                                                                     old="port = 1", new="port = 2")
    assert file_state(notes) == before


def test_the_approval_of_a_command_shows_it_and_its_directory_and_other_tools_show_arguments(notes: Path) -> None:
    assert shown("run_command", notes, command="npm test") == f"run_command: $ npm test\n  in {notes}"
    assert shown("read_file", notes, path="journal.txt") == 'read_file {"path": "journal.txt"}'
    os.chmod(notes / "journal.txt", 0)  # a preview that cannot read shows the call's arguments instead
    try:
        text = shown("edit_file", notes, path="journal.txt", new="x")
    finally:
        os.chmod(notes / "journal.txt", 0o644)
    assert text == 'edit_file {"path": "journal.txt", "new": "x"}' or os.geteuid() == 0
