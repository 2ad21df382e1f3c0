"""Sessions a person finds again, through the real `emelex chat` on the scripted binding: a title from the first
message, `--continue` (the latest chat Session of this workspace, printing its last turns), a bare `--resume`
listing this workspace's recent chat Sessions to choose from, and `-p` answering once for a script (its exit status
saying whether the turn answered)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from emelex_memory import MemoryStore, Settings

from ...support.agent import answer
from .test_chat_cli import EMELEX, chat, env  # noqa: F401  (env is a fixture)


def sessions(home: Path) -> list:
    with MemoryStore.open(Settings(home=home)) as store:
        return store.list_sessions().sessions


def run(env: dict, workspace: Path, stdin: str, outputs: list, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted", *args],
                          input=stdin, env={**env, "EMELEX_AGENT_TEST": json.dumps({"outputs": outputs})},
                          capture_output=True, text=True, timeout=120)


def test_a_chat_session_is_titled_by_its_first_message(env, home, workspace, tmp_path) -> None:
    long = "what does   the readme say about installing this on a machine without network access at all please"
    out = chat(env, workspace, f"{long}\nand then?\n", [answer("one"), answer("two")], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    (session,) = sessions(home)
    assert session.title == "what does the readme say about installing this on a..."
    listed = subprocess.run([*EMELEX, "memory", "sessions", "list"], env=env, capture_output=True, text=True)
    assert "what does the readme say about installing this on a..." in listed.stdout


def test_continue_resumes_the_latest_chat_of_this_workspace_and_prints_its_last_turns(env, home, workspace,
                                                                                       tmp_path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    assert run(env, workspace, "first question\n", [answer("the first answer")]).returncode == 0
    assert run(env, workspace, "second question\n", [answer("the second answer")]).returncode == 0
    assert run(env, other, "elsewhere\n", [answer("not here")]).returncode == 0
    titles = {s.title: s.id for s in sessions(home)}
    out = run(env, workspace, "a follow-up\n", [answer("continued")], "--continue")
    assert out.returncode == 0, out.stderr
    assert f"session {titles['second question']}" in out.stdout
    assert "--- this Session so far ---\n> second question\nthe second answer\n---" in out.stdout
    assert "first question" not in out.stdout and "not here" not in out.stdout
    with MemoryStore.open(Settings(home=home)) as store:
        texts = [e.payload.get("text") for e in store.replay(titles["second question"]).events if e.kind == "user"]
    assert texts == ["second question", "a follow-up"]


def test_continue_without_a_chat_here_says_so_and_creates_nothing(env, home, workspace, tmp_path) -> None:
    assert run(env, workspace, "hello\n", [answer("hi")]).returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    before = [s.id for s in sessions(home)]
    out = run(env, empty, "", [], "-c")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "no chat Session in" in out.stderr and "start one with `emelex chat`" in out.stderr
    assert [s.id for s in sessions(home)] == before


def test_a_bare_resume_lists_this_workspaces_chats_to_choose_from(env, home, workspace, tmp_path) -> None:
    for text in ("older one", "newer one"):
        assert run(env, workspace, f"{text}\n", [answer(f"answer to {text}")]).returncode == 0
    ids = {s.title: s.id for s in sessions(home)}
    out = run(env, workspace, "x\n3\n2\nwhat next\n", [answer("resumed")], "--resume")
    assert out.returncode == 0, out.stderr
    listing = out.stdout.split("resume which one?")[0]
    assert listing.index("newer one") < listing.index("older one")
    assert f"[{ids['newer one'][:8]}]" in listing
    assert out.stdout.count("please answer a number from 1 to 2") == 2
    assert f"session {ids['older one']}" in out.stdout and "> older one\nanswer to older one" in out.stdout
    none = run(env, workspace, "\n", [], "--resume", "--model", "scripted")
    assert none.returncode == 0 and "no Session chosen; nothing was resumed" in none.stdout


def test_p_answers_once_for_a_script_and_its_status_says_whether_it_answered(env, home, workspace) -> None:
    out = run(env, workspace, "", [answer("the answer")], "-p", "what is it?")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "the answer"
    assert "session " in out.stderr and "1 round" in out.stderr
    (session,) = sessions(home)
    assert session.title == "what is it?"
    failed = run(env, workspace, "", ['{"answer": '], "-p", "and now?")  # a round the model cut short
    assert failed.returncode == 1
    assert "[turn error" in failed.stdout
