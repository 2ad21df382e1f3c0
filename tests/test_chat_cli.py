"""`emelex chat` driven through standard input in a real subprocess, on the scripted binding of the agent test
plugin: a turn with an approved tool call, careless input, denial and abort, /tools, /compact, a failed resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, Settings

from .agent_support import agent_plugin_distribution, answer, calls, scripted_model_file

ROOT = Path(__file__).resolve().parent.parent
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]


@pytest.fixture
def env(tmp_path: Path, home: Path) -> dict[str, str]:
    dist = agent_plugin_distribution(tmp_path / "dist")
    values = {**os.environ, "EMELEX_HOME": str(home), "PYTHONPATH": f"{dist}{os.pathsep}{ROOT}"}
    model = scripted_model_file(tmp_path / "model")
    subprocess.run([*EMELEX, "models", "install", str(model), "--name", "scripted"],
                   env=values, check=True, capture_output=True)
    return values


def chat(env: dict, workspace: Path, stdin: str, outputs: list, effects: Path, *args: str) -> subprocess.CompletedProcess:
    options = {"outputs": outputs, "effects": str(effects)}
    return subprocess.run(
        [*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted", *args],
        input=stdin, env={**env, "EMELEX_AGENT_TEST": json.dumps(options)}, capture_output=True, text=True,
        timeout=120)


def events(home: Path) -> list:
    with MemoryStore.open(Settings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        return [(e.kind, e.payload) for e in store.replay(session.id).events]


def test_a_chat_turn_runs_an_approved_tool_and_streams_the_answer(env, home, workspace, tmp_path) -> None:
    effects = tmp_path / "effects"
    script = [calls(("effect", {"label": "one"})), answer('done: "one"')]
    out = chat(env, workspace, "\n   \n/nonsense\n/tools disable nope\nplease\nmaybe\ny\n/exit\n", script, effects)
    assert out.returncode == 0, out.stderr
    assert "unknown command '/nonsense'" in out.stdout and "no tool named 'nope'" in out.stdout
    assert "please answer y, n or a" in out.stdout and 'done: "one"' in out.stdout
    assert effects.read_text().count(" one\n") == 1
    kinds = [k for k, _ in events(home)]
    assert kinds == ["user", "tool_calls", "tool_result", "assistant", "audit"]


def test_denied_and_aborted_calls_never_run(env, home, workspace, tmp_path) -> None:
    effects = tmp_path / "effects"
    script = [calls(("effect", {"label": "a"})), answer("ok"), calls(("effect", {"label": "b"}))]
    out = chat(env, workspace, "first\nn\nsecond\na\n", script, effects)
    assert out.returncode == 0, out.stderr
    assert not effects.exists()
    results = [p["outcome"] for k, p in events(home) if k == "tool_result"]
    assert results == ["denied", "not_executed"]
    assert "[turn aborted" in out.stdout


def test_tools_can_be_listed_disabled_and_enabled_and_a_disabled_tool_is_refused(env, home, workspace, tmp_path) -> None:
    effects = tmp_path / "effects"
    script = [calls(("effect", {"label": "x"})), answer("fine")]
    out = chat(env, workspace, "/tools\n/tools disable effect\n/tools\ngo\n/tools enable effect\n/exit\n", script,
               effects)
    assert out.returncode == 0, out.stderr
    assert "effect         disabled" in out.stdout and "read_file" in out.stdout
    assert not effects.exists()
    (result,) = [p for k, p in events(home) if k == "tool_result"]
    assert result["outcome"] == "error" and "disabled" in result["output"]


def test_compact_only_queues_and_says_what_to_do_next(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "/compact\n", [], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "nothing to compact" in out.stdout or "emelex memory work" in out.stdout


def test_a_resume_in_another_workspace_fails_before_the_model_loads(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "/exit\n", [], tmp_path / "effects")
    session = out.stdout.split()[1].rstrip(";")
    other = tmp_path / "other"
    other.mkdir()
    again = chat(env, other, "", [], tmp_path / "effects", "--resume", session)
    assert again.returncode == 1 and again.stderr.startswith("error: ") and "Traceback" not in again.stderr
