"""A `run_command` child that outlives its chat, in real processes: the chat (on the scripted binding of the agent test
plugin, with the real built-in `run_command`) is killed with SIGKILL, or left at a second Ctrl-C, while the command
runs. The journal recorded the command's process group, start time and boot before the command ran, so `emelex
memory sessions recover --accept-unknown-effects` and `emelex chat --resume` refuse to settle the call while the
command runs, naming it and changing nothing; once it has ended, recover says so and settles it; `--stop-running`
stops it first (and its effect never happens)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from emelex_memory import MemoryStore, Settings
from emelex_memory.agent.journal import read_journal
from emelex_memory.agent.processes import status

from ...support import table_rows
from ...support.agent import answer, calls
from .test_chat_cli import EMELEX, Live, events, resume_once_the_lease_expired
from .test_chat_cli import env  # noqa: F401  (a fixture)

DEADLINE_S = 60.0


def recover(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EMELEX, "memory", "sessions", "recover", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def recover_once_the_lease_expired(env: dict, *args: str) -> subprocess.CompletedProcess:
    """`recover`, tried again (for at most 60 s) while the killed chat's lease is still live."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        done = recover(env, *args)
        if "is leased by" not in done.stderr or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def _command(tmp_path: Path) -> str:
    """A command whose effect (the marker file) happens only once the test creates the `go` file."""
    return f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done; touch {tmp_path}/marker"


def _started(home: Path, session: str):
    """Wait until the journal shows the run_command call started with its process recorded; the record."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        with MemoryStore.open(Settings(home=home)) as store:
            turn = read_journal(store, session)
        recorded = [p for c in (turn.calls if turn else ()) if c.state == "started" for p in c.processes]
        if recorded:
            return recorded[0]
        assert time.monotonic() < deadline, "the command's process was never recorded"
        time.sleep(0.05)


def _ended(record) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while status(record).running:
        assert time.monotonic() < deadline, "the command never ended"
        time.sleep(0.05)


def _chat_running_the_command(env: dict, home: Path, workspace: Path, tmp_path: Path):
    command = _command(tmp_path)
    live = Live(env, workspace, {"outputs": [calls(("run_command", {"command": command})), answer("ran it")],
                                 "effects": str(tmp_path / "effects")})
    session = live.session
    live.type(f"Run `{command}`")
    live.expect("approve this call?")
    live.type("y")
    return live, session, _started(home, session), command


def test_a_command_outliving_a_killed_chat_is_never_settled_while_it_runs(env, home, workspace, tmp_path) -> None:
    env = {**env, "EMELEX_SESSION_LEASE_TTL_S": "2"}  # the killed chat's lease expires soon: resume may try
    live, session, record, command = _chat_running_the_command(env, home, workspace, tmp_path)
    assert record.pgid == record.pid and record.start is not None and record.boot is not None
    assert record.label == command
    live.process.send_signal(signal.SIGKILL)
    live.process.wait(timeout=DEADLINE_S)
    assert status(record).running  # the command outlived its chat
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    refused = recover(env, session, "--accept-unknown-effects")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.startswith(f"error: Session {session} has a tool call still running: process group "
                                     f"{record.pgid} (`{command}`)"), refused.stderr
    assert f"`emelex memory sessions recover {session} --stop-running`" in refused.stderr
    assert f"its process group {record.pgid} (`{command}`): RUNNING" in refused.stdout
    resumed = resume_once_the_lease_expired(env, workspace, session, tmp_path / "effects")
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert f"still running: process group {record.pgid}" in resumed.stderr
    before.pop("session_leases")  # the refused resume took the dead chat's lease over and released it
    after = table_rows(db)
    after.pop("session_leases")
    assert after == before and not (tmp_path / "marker").exists()
    (tmp_path / "go").touch()
    _ended(record)
    assert (tmp_path / "marker").exists()
    unaccepted = recover_once_the_lease_expired(env, session)
    assert unaccepted.returncode == 1 and f"its process group {record.pgid} (`{command}`): it has ended" in \
        unaccepted.stderr, unaccepted.stderr
    done = recover(env, session, "--accept-unknown-effects")
    assert done.returncode == 0, done.stderr
    assert f"run_command: unknown_effect (its process group {record.pgid} (`{command}`): it has ended)" in done.stdout
    assert [p.get("outcome", p.get("reason")) for k, p in events(home) if k in ("tool_result", "turn_failed")] == [
        "unknown_effect", "interrupted"]


def test_stop_running_stops_the_command_before_its_effect(env, home, workspace, tmp_path) -> None:
    env = {**env, "EMELEX_SESSION_LEASE_TTL_S": "2"}
    live, session, record, command = _chat_running_the_command(env, home, workspace, tmp_path)
    live.process.send_signal(signal.SIGKILL)
    live.process.wait(timeout=DEADLINE_S)
    stopped = recover(env, session, "--stop-running")
    assert stopped.returncode == 1, stopped.stderr  # stopped, but its effect stays unknown until accepted
    assert f"stopped its process group {record.pgid} (`{command}`): it was stopped" in stopped.stdout
    assert "started but recorded no result" in stopped.stderr and not status(record).running
    done = recover_once_the_lease_expired(env, session, "--accept-unknown-effects")
    assert done.returncode == 0, done.stderr
    (tmp_path / "go").touch()
    time.sleep(0.3)  # what the command would need to make its effect, had it still run
    assert not (tmp_path / "marker").exists()


def test_a_second_ctrl_c_during_the_command_says_what_keeps_running(env, home, workspace, tmp_path) -> None:
    live, session, record, command = _chat_running_the_command(env, home, workspace, tmp_path)
    live.interrupt()
    live.expect("waiting for the running tool")
    live.interrupt()
    assert live.wait() == 130
    assert (f"exiting now; `run_command`'s process group {record.pgid} (`{command}`) keeps running: wait for it to "
            f"end, or stop it with `emelex memory sessions recover {session} --stop-running`") in live.output
    assert status(record).running
    refused = recover(env, session, "--accept-unknown-effects")  # at once: the chat gave its lease back
    assert refused.returncode == 1 and "still running" in refused.stderr, refused.stderr
    done = recover(env, session, "--stop-running", "--accept-unknown-effects")
    assert done.returncode == 0, done.stderr
    assert f"stopped its process group {record.pgid}" in done.stdout and not status(record).running
