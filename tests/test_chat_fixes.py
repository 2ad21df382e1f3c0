"""`emelex chat` defects found by a user walkthrough, each through the real CLI in a subprocess: a chat Session
keeps its model from removal, a chat killed by a closed stdout or SIGTERM releases its lease, a resume picks the
Session's own model, `--new-workspace`, and a refused chat creates nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .test_chat_cli import EMELEX, chat, env  # noqa: F401  (env is a fixture)


def session_of(out: subprocess.CompletedProcess) -> str:
    return out.stdout.split()[1].rstrip(";")


def test_a_chat_sessions_model_cannot_be_removed(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "/exit\n", [], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    removed = subprocess.run([*EMELEX, "models", "remove", "scripted"], env=env, capture_output=True, text=True)
    assert removed.returncode == 1 and session_of(out)[:8] in removed.stderr, removed.stderr
    resumed = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session_of(out))
    assert resumed.returncode == 0, resumed.stderr
