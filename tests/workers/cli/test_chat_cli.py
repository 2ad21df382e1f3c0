"""`emelex chat` driven through standard input in a real subprocess, on the scripted binding of the agent test
plugin: a turn with an approved tool call, careless input, denial and abort, /tools, /compact, a failed resume,
Ctrl-C (SIGINT) during generation and during a tool, a second Ctrl-C and the recovery after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_workers.settings import WorkerSettings

from ...support.agent import agent_plugin_distribution, answer, calls, scripted_model_file
from ...support import table_rows

ROOT = Path(__file__).resolve().parents[3]
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]


@pytest.fixture
def env(tmp_path: Path, home: Path) -> dict[str, str]:
    dist = agent_plugin_distribution(tmp_path / "dist")
    values = {**os.environ, "EMELEX_HOME": str(home), "PYTHONPATH": f"{dist}{os.pathsep}{ROOT}"}
    model = scripted_model_file(tmp_path / "model")
    subprocess.run([*EMELEX, "models", "install", str(model), "--name", "scripted"],
                   env=values, check=True, capture_output=True)
    return values


def chat(env: dict, workspace: Path, stdin: str, outputs: list, effects: Path, *args: str,
         **more: str) -> subprocess.CompletedProcess:
    options = {"outputs": outputs, "effects": str(effects), **more}
    return subprocess.run(
        [*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted", *args],
        input=stdin, env={**env, "EMELEX_AGENT_TEST": json.dumps(options)}, capture_output=True, text=True,
        timeout=120)


def events(home: Path) -> list:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        return [(e.kind, e.payload) for e in store.replay(session.id).events]


def test_a_chat_turn_runs_an_approved_tool_and_streams_the_answer(env, home, workspace, tmp_path) -> None:
    effects = tmp_path / "effects"
    script = [calls(("effect", {"label": "one"})), answer('done: "one"')]
    out = chat(env, workspace, "\n   \n/nonsense\n/tools disable nope\nplease\nmaybe\ny\n/exit\n", script, effects)
    assert out.returncode == 0, out.stderr
    assert "unknown command '/nonsense'" in out.stdout and "no tool named 'nope'" in out.stdout
    assert "please answer y, n or a" in out.stdout and 'done: "one"' in out.stdout
    assert '-> effect {"label": "one"}' in out.stdout and "<- effect: ok\n     did one" in out.stdout
    assert effects.read_text().count(" one\n") == 1
    kinds = [k for k, _ in events(home)]
    assert kinds == ["context", "user", "tool_calls", "tool_result", "assistant", "audit"]


def test_denied_and_aborted_calls_never_run(env, home, workspace, tmp_path) -> None:
    effects = tmp_path / "effects"
    script = [calls(("effect", {"label": "a"})), answer("ok"), calls(("effect", {"label": "b"}))]
    out = chat(env, workspace, "first\nn\nsecond\na\n", script, effects)
    assert out.returncode == 0, out.stderr
    assert not effects.exists()
    results = [p["outcome"] for k, p in events(home) if k == "tool_result"]
    assert results == ["denied", "not_executed"]
    assert "[turn aborted" in out.stdout
    assert "<- effect: denied" in out.stdout and "<- effect: not executed" in out.stdout


def test_tools_can_be_listed_disabled_and_enabled_and_a_disabled_tool_is_refused(
    env, home, workspace, tmp_path
) -> None:
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
    bound = tmp_path / "bound"
    out = chat(env, workspace, "/exit\n", [], tmp_path / "effects", bound=str(bound))
    session = out.stdout.split()[1].rstrip(";")
    assert bound.exists()  # the marker shows a model load
    bound.unlink()
    other = tmp_path / "other"
    other.mkdir()
    again = chat(env, other, "", [], tmp_path / "effects", "--resume", session, bound=str(bound))
    assert again.returncode == 1 and again.stderr.startswith("error: ") and "Traceback" not in again.stderr
    assert "workspace" in again.stderr
    assert not bound.exists(), "the model was loaded before the workspace was checked"


def test_a_resume_on_a_home_without_a_store_says_so_and_creates_nothing(env, home, workspace, tmp_path) -> None:
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    out = chat(env, workspace, "", [], tmp_path / "effects", "--resume", "abcd1234")
    assert out.returncode == 1 and out.stderr.startswith("error: no store at ") and "Traceback" not in out.stderr
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before


class Live:
    """`emelex chat` as a live subprocess: lines are typed one at a time and its output is awaited (bounded)."""

    def __init__(self, env: dict, workspace: Path, options: dict, *args: str) -> None:
        self.process = subprocess.Popen(
            [*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted", *args],
            env={**env, "EMELEX_AGENT_TEST": json.dumps(options)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.output = ""
        self._lock = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for char in iter(lambda: self.process.stdout.read(1), ""):
            with self._lock:
                self.output += char
                self._lock.notify_all()

    def expect(self, text: str) -> None:
        """Wait (at most 60 s) until the output contains `text`."""
        with self._lock:
            assert self._lock.wait_for(lambda: text in self.output, timeout=60), self.output

    def type(self, line: str) -> None:
        """Type one line."""
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the chat process."""
        self.process.send_signal(signal.SIGINT)

    def wait(self) -> int:
        """Close its input; its exit status (waited for at most 60 s)."""
        self.process.stdin.close()
        return self.process.wait(timeout=60)

    @property
    def session(self) -> str:
        """The Session ID from the chat's first line."""
        self.expect("; commands:")
        return self.output.split()[1].rstrip(";")


def wait_for_file(path: Path) -> None:
    """Wait (at most 60 s) until `path` exists."""
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_ctrl_c_during_generation_interrupts_the_turn_and_the_chat_goes_on(env, home, workspace, tmp_path) -> None:
    generating, hold = tmp_path / "generating", tmp_path / "hold"
    live = Live(env, workspace, {"outputs": [answer("second answer")], "generating": str(generating),
                                 "hold_generation": str(hold), "effects": str(tmp_path / "effects")})
    live.type("first")
    wait_for_file(generating)
    live.interrupt()
    live.expect("[turn interrupted: the turn was interrupted]")
    hold.touch()
    live.type("second")
    live.expect("second answer")
    live.type("/exit")
    assert live.wait() == 0, live.process.stderr.read()
    assert [k for k, _ in events(home)] == ["context", "user", "turn_failed", "user", "assistant", "audit"]


def test_ctrl_c_during_a_tool_waits_for_it(env, home, workspace, tmp_path) -> None:
    effects, started, hold = tmp_path / "effects", tmp_path / "started", tmp_path / "hold"
    live = Live(env, workspace, {"outputs": [calls(("effect", {"label": "a"})), answer("never asked for")],
                                 "effects": str(effects), "tool_started": str(started), "hold_tool": str(hold)})
    live.type("go")
    live.expect("approve this call?")
    live.type("y")
    wait_for_file(started)
    live.interrupt()
    live.expect("waiting for the running tool")
    hold.touch()
    live.expect("[turn interrupted")
    live.type("/exit")
    assert live.wait() == 0, live.process.stderr.read()
    assert [(k, p.get("outcome", p.get("reason"))) for k, p in events(home)] == [
        ("context", None), ("user", None), ("tool_calls", None), ("tool_result", "ok"), ("turn_failed", "interrupted")]
    assert len(effects.read_text().splitlines()) == 1


def test_a_second_ctrl_c_exits_poisoned_and_resume_fails_closed_until_recovered(env, home, workspace,
                                                                               tmp_path) -> None:
    effects, started = tmp_path / "effects", tmp_path / "started"
    env = {**env, "EMELEX_SESSION_LEASE_TTL_S": "5"}
    options = {"outputs": [calls(("effect", {"label": "a"}))], "effects": str(effects),
               "tool_started": str(started), "hold_tool": str(tmp_path / "never")}
    live = Live(env, workspace, options)
    session = live.session
    live.type("go")
    live.expect("approve this call?")
    live.type("y")
    wait_for_file(started)
    live.interrupt()
    live.expect("waiting for the running tool")
    live.interrupt()
    assert live.wait() == 130
    assert f"then run `emelex memory sessions recover {session} --accept-unknown-effects`" in live.output
    db = home / "memory" / "emelex.sqlite3"
    assert not [row for row in table_rows(db)["session_leases"] if "active" in row]  # it gave its lease back
    before = table_rows(db)
    before.pop("session_leases")  # the failed resume takes over the expired lease and releases it
    resumed = resume_once_the_lease_expired(env, workspace, session, effects)
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    assert f"`emelex memory sessions recover {session} --accept-unknown-effects`" in resumed.stderr
    after = table_rows(db)
    after.pop("session_leases")
    assert after == before
    subprocess.run([*EMELEX, "memory", "sessions", "recover", session, "--accept-unknown-effects"], env=env,
                   check=True, capture_output=True)
    resumed = chat(env, workspace, "/exit\n", [], effects, "--resume", session)
    assert resumed.returncode == 0, resumed.stderr
    outcomes = [p.get("outcome", p.get("reason")) for k, p in events(home) if k in ("tool_result", "turn_failed")]
    assert outcomes == ["unknown_effect", "interrupted"]
    assert len(effects.read_text().splitlines()) == 1


def resume_once_the_lease_expired(env: dict, workspace: Path, session: str, effects: Path):
    """`emelex chat --resume SESSION`, retried (for at most 60 s) while the killed chat's lease is still live."""
    deadline = time.monotonic() + 60
    while True:
        resumed = chat(env, workspace, "/exit\n", [], effects, "--resume", session)
        if "is leased by" not in resumed.stderr or time.monotonic() > deadline:
            return resumed
        time.sleep(0.5)


def test_compact_when_due_queues_the_job_and_says_what_to_do_next(env, home, workspace, tmp_path) -> None:
    turns = "".join(f"{'question %d ' % n * 200}\n" for n in range(8))
    out = chat(env, workspace, turns + "/compact\n", [answer("ok")] * 8, tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    session = out.stdout.split()[1].rstrip(";")
    assert (f"/exit, run `emelex memory work`, then `emelex chat --resume {session}`") in out.stdout
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (job,) = [j for j in store.list_jobs().jobs if j.kind == "compaction"]
    assert job.state == "pending"


def test_end_of_input_at_an_approval_prompt_aborts_the_turn_and_ends_the_chat(env, home, workspace, tmp_path) -> None:
    effects = tmp_path / "effects"
    out = chat(env, workspace, "go\n", [calls(("effect", {"label": "a"}))], effects)
    assert out.returncode == 0, out.stderr
    assert "[turn aborted" in out.stdout and "closed" in out.stdout
    assert not effects.exists()
