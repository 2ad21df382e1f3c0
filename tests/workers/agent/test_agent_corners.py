"""Corners of the durable adapter a long-lived host or a busy store reaches: an adapter dropped without `close()`
gives its lease up, a database write lock held past the busy timeout as a tool returns never throws the tool's
known result away (and every error stays typed), and a resume refused by its model bind writes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_memory.errors import LeaseHeldError, ModelTamperedError, StoreBusyError
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import RegisteredTool, ToolOutput, ToolSpec
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings
from tests.support.agent import LABEL_SCHEMA, ScriptedBinding, answer, calls, scripted_model_file
from tests.support import table_rows

ROOT = Path(__file__).resolve().parents[3]

DROPPING_CHILD = """
import asyncio, gc, json, sys
from pathlib import Path
from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.settings import WorkerSettings
from tests.support.agent_crash_child import snapshot_of, tools_of
from tests.support.agent import ScriptedBinding

config = json.loads(sys.argv[1])
settings = WorkerSettings(home=Path(config["home"]))
store = MemoryStore.open(settings)
tools = tools_of(settings)
binding = ScriptedBinding([])

async def main():
    agent = await DurableAgentSession.create(store, config["workspace"], binding, tools, snapshot_of(binding, tools),
                                             ttl_s=config["ttl_s"])
    return agent.session_id  # the adapter is dropped here without close()

session = asyncio.run(main())
gc.collect()
print(session, flush=True)
sys.stdin.read()  # stay alive until the test is done
"""


def test_an_adapter_dropped_without_close_gives_its_lease_up(home, workspace) -> None:
    settings = WorkerSettings(home=home)
    MemoryStore.open(settings).close()
    child = subprocess.Popen(
        [sys.executable, "-c", DROPPING_CHILD, json.dumps({"home": str(home), "workspace": str(workspace),
                                                           "ttl_s": 1.5})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        session = child.stdout.readline().strip()
        assert session, "the child printed no Session"
        deadline = time.monotonic() + 15  # a renewal every TTL/3 would keep the lease held for ever
        with MemoryStore.open(settings) as store:
            while True:
                try:
                    with store.acquire_lease(session, workspace):
                        break
                except LeaseHeldError:
                    assert time.monotonic() < deadline, "the dropped adapter still renews its lease"
                    time.sleep(0.1)
        assert child.poll() is None  # the process that dropped it is still alive: no exit released it
    finally:
        child.stdin.close()
        child.wait(timeout=60)


LOCKER = """
import sys, time, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


class Locking:
    """A tool that returns right after another process took the store's write lock for `hold_s` seconds (as a
    long `maintain --vacuum` would), so the journal step recording its result meets a busy database."""

    def __init__(self, db: Path, hold_s: float) -> None:
        self.db, self.hold_s, self.runs, self.locker = db, hold_s, 0, None

    def run(self, invocation) -> ToolOutput:
        self.runs += 1
        self.locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(self.db), str(self.hold_s)],
                                       stdout=subprocess.PIPE, text=True)
        assert self.locker.stdout.readline().strip() == "locked"
        return ToolOutput(f"locked {invocation.arguments['label']}")

    def tools(self) -> dict[str, RegisteredTool]:
        spec = ToolSpec("lock", "Take the write lock.", LABEL_SCHEMA, self.run, approval="never")
        return {"lock": RegisteredTool(spec, "test", "0")}

    def finish(self) -> None:
        if self.locker is not None:
            self.locker.kill()
            self.locker.wait(timeout=60)


def busy_turn(db: Path, home: Path, workspace: Path, hold_s: float, ttl_s: float):
    """One turn whose tool returns while another process holds the write lock for `hold_s` (busy timeout 100 ms);
    the store, the Session, the turn's result (or its error) and the tool."""
    settings = WorkerSettings(home=home, busy_timeout_ms=100)
    tool = Locking(db, hold_s)
    tools = tool.tools()
    binding = ScriptedBinding([calls(("lock", {"label": "a"})), answer("done")])
    snapshot = build_snapshot(binding, tools, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.")
    store = MemoryStore.open_path(db, settings)

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, ttl_s=ttl_s)
        try:
            return agent.session_id, await agent.turn("go")
        except Exception as exc:
            return agent.session_id, exc
        finally:
            await agent.close()

    try:
        session, outcome = asyncio.run(main())
    finally:
        tool.finish()
    return store, session, outcome, tool


def test_a_write_lock_held_past_the_busy_timeout_as_a_tool_returns_keeps_its_result(tmp_path, home, workspace):
    store, session, result, tool = busy_turn(tmp_path / "busy.sqlite3", home, workspace, hold_s=1.5, ttl_s=60.0)
    with store:
        assert not isinstance(result, BaseException), repr(result)
        assert (result.outcome, result.answer) == ("answer", "done")
        results = [e.payload for e in store.replay(session).events if e.kind == "tool_result"]
        assert [(r["outcome"], r["output"]) for r in results] == [("ok", "locked a")]
        assert tool.runs == 1


def test_a_write_lock_held_past_the_lease_is_a_typed_error(tmp_path, home, workspace):
    store, session, error, tool = busy_turn(tmp_path / "busy.sqlite3", home, workspace, hold_s=4.0, ttl_s=1.0)
    with store:
        assert isinstance(error, StoreBusyError), repr(error)
        assert "resume the Session" in str(error)
        assert tool.runs == 1


@pytest.fixture(autouse=True)
def _no_agent_test_options(monkeypatch):
    monkeypatch.delenv("EMELEX_AGENT_TEST", raising=False)


def tampered_model(settings: WorkerSettings, tmp_path: Path):
    """An installed model whose file changed since it was installed: binding it raises `ModelTamperedError`."""
    with ModelManager(settings) as manager:
        model = manager.install(scripted_model_file(tmp_path / "model"), name="scripted")
    os.utime(model.model_file, ns=(1, 1))
    return model


def test_a_resume_refused_by_its_model_bind_leaves_nothing(home, workspace, tmp_path, settings) -> None:
    tools = Locking(tmp_path / "unused", 0).tools()
    binding = ScriptedBinding([])
    snapshot = build_snapshot(binding, tools, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.")
    with MemoryStore.open(settings) as store:
        async def create():
            agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot)
            await agent.close()
            return agent.session_id

        interrupted = asyncio.run(create())
        with store.acquire_lease(interrupted, workspace) as lease:  # a turn a crash left open
            list(lease.replay_all())
            journal.open_turn(store, lease, "go")
        empty = store.create_session(workspace).id  # no history, no snapshot yet
        model = tampered_model(settings, tmp_path)
        for session in (interrupted, empty):
            before = without_leases(table_rows(store.path))
            with pytest.raises(ModelTamperedError):
                asyncio.run(DurableAgentSession.resume(store, session, workspace, binding, tools, snapshot,
                                                       model=model))
            assert without_leases(table_rows(store.path)) == before, session
        assert journal.read_journal(store, interrupted) is not None
        assert journal.stored_snapshot(store, empty) is None


def without_leases(rows: dict) -> dict:
    return {table: r for table, r in rows.items() if table != "session_leases"}
