"""The SIGKILL matrix: a real process running a durable agent turn is killed right after each commit point; a fresh
process then recovers. No tool ever runs twice, reconciliation is exactly as specified, recover without the flag
changes nothing and exits non-zero, the crashed run queued no distillation, and workers skip the open journal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_memory.agent.recovery import recover_session
from emelex_memory.errors import UnknownEffectsError
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.settings import WorkerSettings
from tests.support import agent as agent_support
from tests.support.agent_crash_child import snapshot_of, tools_of
from tests.support.agent import answer, calls
from tests.support import table_rows, wait_until

ROOT = Path(__file__).resolve().parents[3]
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
OUTPUTS = [calls(("effect", {"label": "a"}), ("effect", {"label": "b"})), answer("done")]
BATCH = ["user", "tool_calls", "tool_result", "tool_result"]

# point -> (outcomes of the reconciled batch, or None when no batch is journaled; the turn's closing events;
# effect lines the crashed run left; whether a started call has an unknown effect)
MATRIX = {
    "input recorded": ("open_turn", None, ["user", "turn_failed"], 0, False),
    "during inference": ("generation", None, ["user", "turn_failed"], 0, False),
    "batch planned": ("plan_batch", ["not_executed", "not_executed"], BATCH + ["turn_failed"], 0, False),
    "call started": ("start_call", ["unknown_effect", "not_executed"], BATCH + ["turn_failed"], 0, True),
    "inside the tool": ("tool", ["unknown_effect", "not_executed"], BATCH + ["turn_failed"], 1, True),
    "completed with another pending": ("complete_call", ["ok", "not_executed"], BATCH + ["turn_failed"], 1, False),
    "batch published": ("publish_batch", ["ok", "ok"], BATCH + ["turn_failed"], 2, False),
    "answer recorded": ("close_answer", ["ok", "ok"], BATCH + ["assistant", "audit"], 2, False),
    "before release": ("finish_session", ["ok", "ok"], BATCH + ["assistant", "audit"], 2, False),
}


class Later:
    """A clock an hour ahead: the killed process's lease has expired for it."""

    def __call__(self) -> float:
        return time.time() + 3600


def crash(tmp_path: Path, point: str, *, ttl_s: float = 60.0) -> tuple[WorkerSettings, str, Path, Path, dict]:
    """Run the child up to `point`, SIGKILL it there; return (settings, session ID, workspace, effects log, env)."""
    home, workspace, effects = tmp_path / "home", tmp_path / "ws", tmp_path / "effects.log"
    workspace.mkdir(exist_ok=True)
    marker = tmp_path / "stopped"
    opts = {"outputs": OUTPUTS, "effects": str(effects)}
    if point == "generation":
        opts.update(generating=str(marker), hold_generation=str(tmp_path / "never"))
    if point == "tool":
        opts.update(tool_started=str(marker), hold_tool=str(tmp_path / "never"), hold_label="a")
    env = {**os.environ, agent_support.ENV: json.dumps(opts), "PYTHONPATH": str(ROOT), "EMELEX_HOME": str(home)}
    config = {"home": str(home), "workspace": str(workspace), "point": point, "marker": str(marker),
              "session_file": str(tmp_path / "session"), "ttl_s": ttl_s}
    child = subprocess.Popen([sys.executable, "-m", "tests.support.agent_crash_child", json.dumps(config)], cwd=ROOT,
                             env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"the child never reached {point}: {child.stderr.read().decode()[-2000:]}")
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stderr.close()
    env[agent_support.ENV] = json.dumps({"effects": str(effects)})
    return WorkerSettings(home=home), (tmp_path / "session").read_text(), workspace, effects, env


def effect_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EMELEX, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def resume_and_finish(settings: WorkerSettings, sid: str, workspace: Path, monkeypatch, env: dict) -> list:
    """Resume in this (fresh) process, run one more answered turn, close cleanly; return the replayed events."""
    monkeypatch.setenv(agent_support.ENV, env[agent_support.ENV])
    store = MemoryStore.open(settings, clock=Later())
    tools = tools_of(settings)
    binding = agent_support.ScriptedBinding([answer("after")])

    async def main():
        agent = await DurableAgentSession.resume(store, sid, workspace, binding, tools, snapshot_of(binding, tools))
        await agent.turn("and now?")
        await agent.close()

    try:
        asyncio.run(main())
        return store.replay(sid).events
    finally:
        store.close()


@pytest.mark.parametrize("name", list(MATRIX))
def test_sigkill_at_each_commit_point(name, tmp_path, monkeypatch):
    point, outcomes, closing, effects_left, unknown = MATRIX[name]
    settings, sid, workspace, effects, env = crash(tmp_path, point)
    assert len(effect_lines(effects)) == effects_left
    with MemoryStore.open(settings, clock=Later()) as store:
        assert store.list_jobs().jobs == []  # the crashed run queued no distillation
        open_turn = journal.read_journal(store, sid)
        if closing[-1] == "turn_failed":  # the journal is open: workers skip the Session though its lease expired
            assert open_turn is not None
            store.queue_distillation(sid)
            assert store.claim_job() is None
        else:
            assert open_turn is None
    db = settings.database_path
    if unknown:
        before = table_rows(db)
        shown = cli(env, "memory", "sessions", "show", sid)
        assert "UNKNOWN EFFECT" in shown.stdout
        refused = cli(env, "memory", "sessions", "recover", sid)
        assert refused.returncode != 0
        assert "call " in refused.stdout and "effect" in refused.stdout and "--accept-unknown-effects" in refused.stderr
        assert table_rows(db) == before  # changed nothing
        with pytest.raises(UnknownEffectsError):
            resume_and_finish(settings, sid, workspace, monkeypatch, env)  # ordinary resume fails closed
        assert table_rows(db) == {**before, "session_leases": table_rows(db)["session_leases"]}
        with MemoryStore.open(settings, clock=Later()) as store:
            recover_session(store, sid, accept_unknown_effects=True)
    events = resume_and_finish(settings, sid, workspace, monkeypatch, env)
    kinds = [e.kind for e in events]
    assert kinds == closing + ["user", "assistant", "audit"]
    if outcomes is not None:
        results = [e.payload for e in events if e.kind == "tool_result"]
        assert [r["outcome"] for r in results] == outcomes
        if "ok" in outcomes:
            assert results[0]["output"] == "did a"  # the completed result stays exact
    if closing[-1] == "turn_failed":
        assert events[len(closing) - 1].payload["reason"] == "interrupted"
    # No tool ran again: the effects log holds exactly what the crashed run did, each call once.
    lines = effect_lines(effects)
    assert len(lines) == effects_left and len({line.split()[0] for line in lines}) == len(lines)


def test_recover_with_the_flag_on_the_command_line(tmp_path):
    settings, sid, workspace, effects, env = crash(tmp_path, "tool", ttl_s=0.5)
    with MemoryStore.open(settings) as store:

        def expired() -> bool:
            with store.db.read() as conn:
                return conn.execute("SELECT expires_at FROM session_leases").fetchone()[0] <= time.time()

        wait_until(expired, "the killed process's lease expiring")  # a wait, not a timing assertion
    done = cli(env, "memory", "sessions", "recover", sid, "--accept-unknown-effects", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["outcome"] == "recovered"
    assert [r["outcome"] for r in out["results"]] == ["unknown_effect", "not_executed"]
    again = cli(env, "memory", "sessions", "recover", sid)
    assert again.returncode == 0 and "nothing to recover" in again.stdout
    with MemoryStore.open(settings) as store:
        assert store.list_jobs().jobs == []  # recovery queues no distillation
    assert len(effect_lines(effects)) == 1
