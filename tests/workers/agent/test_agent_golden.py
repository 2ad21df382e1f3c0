"""Sessions made with `emelex-tools/1`, `/2` and `/3` before turn policies: today's code runs their scripted chats with
the same rounds, byte for byte (what each round showed the model and the schema it was generated under), records the
same events, and resumes the Sessions the old code recorded showing the model exactly what it showed then
(`tests/support/golden_agent.py` says how the record was made)."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.agent import journal
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.cli.chat import _resumed_snapshot
from emelex_workers.settings import WorkerSettings
from tests.support.agent import ScriptedBinding
from tests.support.golden_agent import FILES, SCENARIOS, _parts, _write, expand, run_scenario

GOLDEN = json.loads((Path(__file__).parent / "golden_sessions.json").read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_chat_of_each_older_protocol_runs_its_rounds_as_it_did(name: str, tmp_path: Path) -> None:
    now, then = run_scenario(name, tmp_path), GOLDEN[name]
    for n, (round_now, round_then) in enumerate(zip(now["rounds"], then["rounds"], strict=True)):
        assert expand(now, round_now["messages"]) == expand(then, round_then["messages"]), f"round {n + 1}"
        assert round_now["schema"] == round_then["schema"], f"round {n + 1}"
    assert now["results"] == then["results"]
    assert now["events"] == then["events"]
    assert (now["snapshot"], now["digest"]) == (then["snapshot"], then["digest"])
    assert expand(now, now["resumed"]["messages"]) == expand(then, then["resumed"]["messages"])
    assert now["resumed"]["schema"] == then["resumed"]["schema"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_session_the_old_code_recorded_resumes_exactly(name: str, tmp_path: Path) -> None:
    then = GOLDEN[name]
    workspace, settings = tmp_path / "workspace", WorkerSettings(home=tmp_path / "home", plugins_autoload=False)
    workspace.mkdir()
    _write(workspace)
    if any(e["kind"] == "tool_result" and e["payload"]["tool"] == "write_file" for e in then["events"]):
        (workspace / "hello.txt").write_text("hi there")  # what its write_file call wrote
    stored = SessionSnapshot.from_json(json.loads(json.dumps(then["snapshot"]).replace("<tmp>", str(tmp_path))))
    binding = ScriptedBinding([], window=4096)
    tools, _, sources = _parts(settings, binding, then["protocol"])
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            list(lease.replay_all())
            journal.record_snapshot(store, lease, stored)
            events = json.loads(json.dumps(then["events"]).replace("<tmp>", str(tmp_path)))
            for _, turn in itertools.groupby(events, key=lambda e: e["turn"]):
                lease.append_turn([NewEvent(e["kind"], e["payload"]) for e in turn])
            lease.release()

        class Installed:  # what `emelex chat --resume` found installed: the Session's own model
            reference = stored.model_reference

        snapshot = _resumed_snapshot(stored, binding, tools, Installed)
        assert snapshot.digest == then["digest"]

        async def resume() -> tuple[list, dict]:
            agent = await DurableAgentSession.resume(store, session.id, workspace, binding, tools, snapshot,
                                                     context_sources=sources)
            try:
                return agent.agent.messages, agent.agent.round_schema(workspace)
            finally:
                await agent.close()

        messages, schema = asyncio.run(resume())
    assert json.loads(json.dumps(messages).replace(str(tmp_path), "<tmp>")) == \
        expand(then, then["resumed"]["messages"])
    assert schema == then["resumed"]["schema"]
    assert set(FILES) <= {p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file()}
