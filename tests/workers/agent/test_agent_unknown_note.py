"""A recorded unknown effect stays visible to the model for the Session's life: after compaction hides its
`tool_result` behind a Summary that forgot it, a resumed agent still shows the call with its safety note."""

from __future__ import annotations

import asyncio
import json

from emelex_memory import MemoryStore, compaction_handler, run_one_job
from emelex_memory.agent import journal
from emelex_memory.agent.recovery import recover_session
from emelex_memory.compaction.policy import CompactionPolicy
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from tests.support import agent as agent_support
from tests.support.agent import ScriptedBinding, answer

SAFETY_NOTE = "this call may have run; its effect is unknown; do not repeat it unless the user asks"


def test_an_unknown_effect_survives_compaction_in_what_the_model_sees(store: MemoryStore, workspace, settings,
                                                                      tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(agent_support.ENV, json.dumps({"effects": str(tmp_path / "effects")}))
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    tools = {name: t for name, t in registered_tools(pm).items() if name in ("effect", "peek")}
    binding = ScriptedBinding([])
    snapshot = build_snapshot(binding, tools, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.")

    async def create() -> str:
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot)
        await agent.close()
        return agent.session_id

    session = asyncio.run(create())
    with store.acquire_lease(session, workspace) as lease:  # a process that died inside the tool
        list(lease.replay_all())
        journal.open_turn(store, lease, "run the effect a")
        journal.plan_batch(store, lease, 1, "{}", [("c1", "effect", {"label": "a"})])
        journal.start_call(store, lease, "c1")
    recover_session(store, session, accept_unknown_effects=True)
    with store.acquire_lease(session, workspace) as lease:
        list(lease.replay_all())
        for n in range(6):
            journal.open_turn(store, lease, f"question {n} " + "x" * 600)
            journal.close_answer(store, lease, f"answer {n}", {"event": "answer", "rounds": 1, "calls": 0,
                                                               "model": "t/m"})
    queued = store.queue_compaction(session, context_window=2048, policy=CompactionPolicy(preserve_turns=1),
                                    force=True)
    assert queued.job is not None, queued.reason
    done = run_one_job(store, compaction_handler(lambda events, job: "The user asked to run the effect a."))
    assert done.status == "done"
    view = store.replay(session).events
    assert "unknown_effect" not in json.dumps([e.payload for e in view if e.kind == "tool_result"])  # hidden

    resumed_binding = ScriptedBinding([answer("ok")])

    async def resume() -> None:
        agent = await DurableAgentSession.resume(store, session, workspace, resumed_binding, tools,
                                                 build_snapshot(resumed_binding, tools, model_reference="t/m",
                                                                model_snapshot_id="s" * 64, system_prompt="T."))
        await agent.turn("what now?")
        await agent.close()

    asyncio.run(resume())
    seen = json.dumps(resumed_binding.rounds[0]["messages"])
    assert SAFETY_NOTE in seen and '{\\"label\\":\\"a\\"}' in seen and "c1" in seen, seen
