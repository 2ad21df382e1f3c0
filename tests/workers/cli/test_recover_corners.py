"""`emelex memory sessions recover` on a live Session says it is in use (instead of advising
--accept-unknown-effects), and recovers a Session whose workspace was renamed through --workspace."""

from __future__ import annotations

import subprocess
import time

from ...support.agent import answer, calls
from .test_chat_cli import EMELEX, Live, events, wait_for_file
from .test_chat_cli import env  # noqa: F401  (a fixture)


def recover(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EMELEX, "memory", "sessions", "recover", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_recover_of_a_session_whose_tool_runs_right_now_says_it_is_live(env, home, workspace, tmp_path) -> None:
    effects, started, hold = tmp_path / "effects", tmp_path / "started", tmp_path / "hold"
    live = Live(env, workspace, {"outputs": [calls(("effect", {"label": "a"})), answer("done")],
                                 "effects": str(effects), "tool_started": str(started), "hold_tool": str(hold)})
    session = live.session
    live.type("go")
    live.expect("approve this call?")
    live.type("y")
    wait_for_file(started)
    refused = recover(env, session)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "is live and in use" in refused.stderr and "--accept-unknown-effects" not in refused.stderr + \
        refused.stdout, refused.stderr
    hold.touch()
    live.expect("done")
    live.type("/exit")
    assert live.wait() == 0
    assert [k for k, _ in events(home)][-2:] == ["assistant", "audit"]


def test_recover_takes_the_renamed_workspace(env, home, workspace, tmp_path) -> None:
    env = {**env, "EMELEX_SESSION_LEASE_TTL_S": "2"}
    effects, started = tmp_path / "effects", tmp_path / "started"
    live = Live(env, workspace, {"outputs": [calls(("effect", {"label": "a"}))], "effects": str(effects),
                                 "tool_started": str(started), "hold_tool": str(tmp_path / "never")})
    session = live.session
    live.type("go")
    live.expect("approve this call?")
    live.type("y")
    wait_for_file(started)
    live.process.kill()
    live.process.wait(timeout=60)
    renamed = tmp_path / "renamed"
    workspace.rename(renamed)
    deadline = time.monotonic() + 60
    while True:  # the killed chat's lease expires after its 2 s TTL
        done = recover(env, session, "--accept-unknown-effects", "--workspace", str(renamed))
        if "is leased by" not in done.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done.returncode == 0, done.stderr
    assert "unknown_effect" in done.stdout
    assert [p.get("outcome", p.get("reason")) for k, p in events(home) if k in ("tool_result", "turn_failed")] == [
        "unknown_effect", "interrupted"]
