"""What `emelex chat` shows before a person approves a call, in a real subprocess on the scripted binding: the diff of
a file's change (every line a replacement would remove, shown removed), the command and its working directory, and
each proposal once: an identical call proposed twice in one round is folded (said so), asked and run once."""

from __future__ import annotations

from pathlib import Path

from ...support.agent import answer, calls
from .test_chat_cli import chat, env, events  # noqa: F401  (env is a fixture)

NOTES = "Mon: garden\nTue: bike\nWed: books\nThu: rain\n"


def test_the_approval_prompt_shows_the_diff_of_a_replacement_not_its_json(env, home, workspace, tmp_path) -> None:
    (workspace / "journal.txt").write_text(NOTES)
    out = chat(env, workspace, "replace my journal\ny\n", [
        calls(("write_file", {"path": "journal.txt", "content": "shipped", "replace": True})), answer("done")],
        tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    asked = out.stdout.split("approve this call?")[0]
    assert "write_file journal.txt (replaces the whole file):\n--- a/journal.txt\n+++ b/journal.txt" in asked
    for line in NOTES.splitlines():
        assert f"\n-{line}\n" in asked, asked
    assert '"content"' not in asked.split("-> write_file")[-1].split("\n", 1)[1]  # the prompt is no JSON
    assert (workspace / "journal.txt").read_text() == "shipped"


def test_an_edit_is_shown_as_its_diff_and_appends_keeping_the_file(env, home, workspace, tmp_path) -> None:
    (workspace / "journal.txt").write_text(NOTES)
    out = chat(env, workspace, "add shipped to my journal\ny\n", [
        calls(("edit_file", {"path": "journal.txt", "new": "Fri: shipped"})), answer("added")], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    asked = out.stdout.split("approve this call?")[0]
    assert "edit_file journal.txt (append):" in asked and "\n+Fri: shipped\n" in asked and " Thu: rain" in asked
    assert (workspace / "journal.txt").read_text() == NOTES + "Fri: shipped\n"


def test_a_command_is_shown_with_its_working_directory(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "run it\nn\n", [calls(("run_command", {"command": "npm test"})), answer("denied")],
               tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert f"run_command: $ npm test\n  in {workspace}\napprove this call?" in out.stdout


def test_an_identical_call_proposed_twice_in_a_round_is_shown_asked_and_run_once(env, home, workspace,
                                                                                   tmp_path) -> None:
    """Even with another call between the two (which may change what the first saw), the second is folded into
    the first: one proposal line saying so, one approval prompt, one effect, no "repeated" outcome line; the
    transcript keeps both calls, the second answered from the first."""
    effects = tmp_path / "effects"
    out = chat(env, workspace, "go\ny\ny\n", [
        calls(("effect", {"label": "a"}), ("effect", {"label": "b"}), ("effect", {"label": "a"})), answer("done")],
        effects)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count('-> effect {"label": "a"}') == 1
    assert '-> effect {"label": "a"} (proposed 2 times in this round; it runs once)' in out.stdout
    assert out.stdout.count("approve this call?") == 2
    assert "repeated" not in out.stdout
    assert [line.split()[1] for line in effects.read_text().splitlines()] == ["a", "b"]
    results = [p for k, p in events(home) if k == "tool_result"]
    assert [r["outcome"] for r in results] == ["ok", "ok", "repeated"]
    assert results[2]["earlier_call_id"] == results[0]["call_id"]
