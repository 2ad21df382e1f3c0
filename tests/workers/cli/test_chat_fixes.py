"""`emelex chat` defects found by a user walkthrough, each through the real CLI in a subprocess: a chat Session
keeps its model from removal, a chat killed by a closed stdout or SIGTERM releases its lease, a resume picks the
Session's own model, `--new-workspace`, and a refused chat creates nothing."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess

from ...support.agent import answer, scripted_model_file
from .test_chat_cli import EMELEX, Live, chat, env, events, wait_for_file  # noqa: F401  (env is a fixture)


def session_of(out: subprocess.CompletedProcess) -> str:
    return out.stdout.split()[1].rstrip(";")


def test_a_chat_sessions_model_cannot_be_removed(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "/exit\n", [], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    removed = subprocess.run([*EMELEX, "models", "remove", "scripted"], env=env, capture_output=True, text=True)
    assert removed.returncode == 1 and session_of(out)[:8] in removed.stderr, removed.stderr
    resumed = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session_of(out))
    assert resumed.returncode == 0, resumed.stderr


def test_sigterm_during_a_turn_releases_the_lease_at_once(env, home, workspace, tmp_path) -> None:
    generating = tmp_path / "generating"
    live = Live(env, workspace, {"outputs": [answer("never")], "generating": str(generating),
                                 "hold_generation": str(tmp_path / "never"), "effects": str(tmp_path / "effects")})
    session = live.session
    live.type("go")
    wait_for_file(generating)
    live.process.send_signal(signal.SIGTERM)
    assert live.wait() == 143
    assert f"Session {session}'s lease is released" in live.process.stderr.read()
    resumed = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session)
    assert resumed.returncode == 0, resumed.stderr  # no "leased by": the lease is free; the turn was reconciled
    assert [k for k, _ in events(home)] == ["context", "user", "turn_failed"]


def test_a_closed_stdout_releases_the_lease(env, home, workspace, tmp_path) -> None:
    process = subprocess.Popen(
        [*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted"],
        env={**env, "EMELEX_AGENT_TEST": json.dumps({"outputs": [answer("a long answer " * 50)]})},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    session = process.stdout.readline().split()[1].rstrip(";")
    process.stdout.close()  # `emelex chat | head -1`
    process.stdin.write("hello\n")
    process.stdin.close()
    assert process.wait(timeout=60) == 141
    stderr = process.stderr.read()
    assert "Traceback" not in stderr and f"Session {session}'s lease is released" in stderr, stderr
    resumed = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session)
    assert resumed.returncode == 0, resumed.stderr


def test_a_resume_refused_by_a_dead_holders_lease_says_so_and_when_it_frees(env, home, workspace, tmp_path) -> None:
    env = {**env, "EMELEX_SESSION_LEASE_TTL_S": "600"}
    live = Live(env, workspace, {"outputs": []})
    session = live.session
    live.process.kill()
    live.process.wait(timeout=60)
    resumed = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session)
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert f"is leased by {live.process.pid}@" in resumed.stderr and "but that process is gone" in resumed.stderr
    assert "its lease frees in " in resumed.stderr, resumed.stderr


def test_a_resume_uses_the_sessions_own_model_and_a_wrong_model_names_the_flag(env, home, workspace,
                                                                               tmp_path) -> None:
    other = scripted_model_file(tmp_path / "other", "other.gguf")
    other.write_bytes(other.read_bytes() + b"\0")  # a different snapshot
    subprocess.run([*EMELEX, "models", "install", str(other), "--name", "other"], env=env, check=True,
                   capture_output=True)
    session = session_of(chat(env, workspace, "/exit\n", [], tmp_path / "effects"))
    options = {**env, "EMELEX_DEFAULT_MODEL": "other", "EMELEX_AGENT_TEST": json.dumps({"outputs": []})}
    resumed = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--resume", session], input="/exit\n",
                             env=options, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    wrong = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--resume", session, "--model", "other"],
                           input="/exit\n", env=options, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "model scripted" in wrong.stderr and "`--model scripted`" in wrong.stderr, wrong.stderr


def test_a_new_directory_at_an_old_workspaces_path_needs_chat_new_workspace(env, home, workspace, tmp_path) -> None:
    assert chat(env, workspace, "/exit\n", [], tmp_path / "effects").returncode == 0
    shutil.rmtree(workspace)
    workspace.mkdir()
    refused = chat(env, workspace, "/exit\n", [], tmp_path / "effects")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "`emelex chat --new-workspace`" in refused.stderr and "knowledge remember" not in refused.stderr
    started = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--new-workspace")
    assert started.returncode == 0, started.stderr


def test_a_chat_refused_for_its_model_creates_nothing(env, tmp_path, workspace) -> None:
    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    refused = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace)], input="", capture_output=True,
                             text=True, env={**env, "EMELEX_HOME": str(fresh)}, timeout=120)
    assert refused.returncode == 1 and "is installed under" in refused.stderr and "Traceback" not in refused.stderr
    assert list(fresh.rglob("*")) == []
    missing = tmp_path / "missing"
    refused = subprocess.run([*EMELEX, "chat", "--workspace", str(missing)], input="", capture_output=True,
                             text=True, env={**env, "EMELEX_HOME": str(fresh)}, timeout=120)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert list(fresh.rglob("*")) == []
