"""Corners of `emelex chat` in a real subprocess: SIGTERM while a tool runs keeps the lease until the tool returned
(and records its result); a workspace renamed during a live chat does not poison it; a failed turn never shows
its call as "ok" and releases the lease."""

from __future__ import annotations

import signal
import time

import apsw

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_workers.settings import WorkerSettings

from ...support.agent import answer, calls
from .test_chat_cli import Live, chat, events, wait_for_file
from .test_chat_cli import env  # noqa: F401  (a fixture)


def lease_row(home, session: str) -> tuple[str, float | None]:
    """The state and end time of the Session's lease row."""
    conn = apsw.Connection(str(home / "memory" / "emelex.sqlite3"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute(
            "SELECT l.state, l.ended_at FROM session_leases l JOIN sessions s ON s.id = l.session_id "
            "WHERE s.uuid = ?", (session,)).fetchone()
    finally:
        conn.close()


def test_sigterm_while_a_tool_runs_keeps_the_lease_until_the_tool_returned(env, home, workspace, tmp_path) -> None:
    effects, started, hold, done = (tmp_path / name for name in ("effects", "started", "hold", "done"))
    live = Live(env, workspace, {"outputs": [calls(("effect", {"label": "a"})), answer("never asked for")],
                                 "effects": str(effects), "tool_started": str(started), "hold_tool": str(hold),
                                 "tool_done": str(done)})
    session = live.session
    live.type("go")
    live.expect("approve this call?")
    live.type("y")
    wait_for_file(started)
    live.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while lease_row(home, session)[0] == "active" and "waiting for the running tool" not in live.output:
        assert time.monotonic() < deadline, live.output
        time.sleep(0.05)
    assert lease_row(home, session)[0] == "active"  # the tool still runs: the lease is still held
    hold.touch()
    assert live.wait() == 143
    state, ended_at = lease_row(home, session)
    assert state == "released" and ended_at >= float(done.read_text())  # released only after the tool returned
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (call,) = journal.read_journal(store, session).calls
    assert (call.state, call.result["outcome"], call.result["output"]) == ("completed", "ok", "did a")  # kept
    resumed = chat(env, workspace, "/exit\n", [], effects, "--resume", session)
    assert resumed.returncode == 0, resumed.stderr
    assert [(k, p.get("outcome", p.get("reason"))) for k, p in events(home)] == [
        ("context", None), ("user", None), ("tool_calls", None), ("tool_result", "ok"), ("turn_failed", "interrupted")]
    assert len(effects.read_text().splitlines()) == 1


def test_a_workspace_renamed_during_a_live_chat_stays_its_workspace(env, home, workspace, tmp_path) -> None:
    renamed = tmp_path / "renamed"
    script = [calls(("run_command", {"command": f"mv {workspace} {renamed}"})), answer("moved"),
              calls(("run_command", {"command": "pwd"})), answer("still here")]
    out = chat(env, workspace, "move it\ny\nwhere now\ny\n/exit\n", script, tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "<- run_command: ok" in out.stdout and f"     exit code 0\n     {renamed}" in out.stdout, out.stdout
    assert "still here" in out.stdout and "Traceback" not in out.stderr
    outcomes = [p.get("outcome") for k, p in events(home) if k == "tool_result"]
    assert outcomes == ["ok", "ok"]
    assert lease_row(home, out.stdout.split()[1].rstrip(";"))[0] == "released"


def test_a_turn_whose_result_cannot_be_recorded_is_not_shown_ok_and_releases_the_lease(env, home, workspace,
                                                                                     tmp_path) -> None:
    script = [calls(("run_command", {"command": f"rm -r {workspace}"})), answer("never")]
    out = chat(env, workspace, "remove it\ny\n/exit\n", script, tmp_path / "effects")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "<- run_command: ok" not in out.stdout
    assert "is gone" in out.stderr, out.stderr
    assert lease_row(home, out.stdout.split()[1].rstrip(";"))[0] == "released"
