"""What a new user meets first: `sessions list` (and every other listing) on a new Home is an empty list (exit 0,
nothing created), `emelex
--help` names the first step, a mistyped command of any group or a mistyped chat command gets "did you mean", an
interrupted turn counts the round it interrupted, and `/compact --force` queues compaction below the threshold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from ...support.agent import answer
from .test_chat_cli import EMELEX, chat, env, wait_for_file  # noqa: F401  (env is a fixture)
from .test_chat_screen import STATS


def emelex(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EMELEX, *args], env={**os.environ, "EMELEX_HOME": str(home)}, capture_output=True,
                          text=True, timeout=60)


def test_sessions_list_on_a_new_home_is_empty_and_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = emelex(home, "memory", "sessions", "list")
    assert (out.returncode, out.stdout, out.stderr) == (0, "no Sessions\n", "")
    listed = emelex(home, "memory", "sessions", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["sessions"] == []
    assert not home.exists()


@pytest.mark.parametrize("args, said, key", [
    (("jobs", "list"), "no jobs", "jobs"), (("jobs", "failed"), "no failed jobs", "jobs"),
    (("knowledge", "list"), "no Knowledge in this workspace", "entries"),
    (("knowledge", "history", "deploy.port"), "no versions of deploy.port", "versions"),
    (("assets", "list"), "no assets", "assets"), (("workspaces", "list"), "no known workspaces", "workspaces")])
def test_every_listing_on_a_new_home_is_empty_and_creates_nothing(tmp_path: Path, args, said, key) -> None:
    home = tmp_path / "home"
    out = emelex(home, "memory", *args)
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{said}\n", "")
    listed = emelex(home, "memory", *args, "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)[key] == []
    assert not home.exists()


def test_the_help_names_the_first_step(tmp_path: Path) -> None:
    out = emelex(tmp_path / "home", "--help")
    assert out.returncode == 0
    assert "First step: `emelex models install --default` (the embedded model), then `emelex chat`" in \
        " ".join(out.stdout.split())


@pytest.mark.parametrize("args, guess", [(("memroy",), "memory"), (("memory", "sessoins"), "sessions"),
                                         (("modles",), "models"), (("memory", "knowlege"), "knowledge")])
def test_a_mistyped_command_of_any_group_gets_did_you_mean(tmp_path: Path, args, guess) -> None:
    out = emelex(tmp_path / "home", *args)
    assert out.returncode == 2
    assert f"No such command '{args[-1]}'. Did you mean '{guess}'?" in out.stderr
    assert not (tmp_path / "home").exists()


def test_a_mistyped_chat_command_gets_did_you_mean(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "/exti\n/tool\n/compcat --force\n", [], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "unknown command '/exti'; did you mean /exit?" in out.stdout
    assert "unknown command '/tool'; did you mean /tools?" in out.stdout
    assert "unknown command '/compcat --force'; did you mean /compact?" in out.stdout


def test_compact_force_queues_below_the_threshold(env, home, workspace, tmp_path) -> None:
    outputs = [answer(f"answer {n}") for n in range(6)]
    lines = "".join(f"question {n}\n" for n in range(6))
    out = chat(env, workspace, lines + "/compact\n/compact --force\n", outputs, tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "nothing to compact" in out.stdout
    assert "compaction queued (job " in out.stdout.split("nothing to compact")[1]


def test_an_interrupted_turn_counts_the_round_it_interrupted(env, home, workspace, tmp_path) -> None:
    generating, hold = tmp_path / "generating", tmp_path / "hold"
    process = subprocess.Popen(
        [*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted"],
        env={**env, "EMELEX_AGENT_TEST": json.dumps({"outputs": [answer("never")], "generating": str(generating),
                                                     "hold_generation": str(hold)})},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        process.stdin.write("go\n")
        process.stdin.flush()
        wait_for_file(generating)
        process.send_signal(signal.SIGINT)
        process.stdin.close()
        out = process.stdout.read()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert "[turn interrupted" in out
    (stats,) = STATS.findall(out)
    assert stats[:2] == ("1", "0"), out
