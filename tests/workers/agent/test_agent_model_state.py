"""The adapter's two saved-state calls: a binding's optional `load_session_state` on resume and `save_session_state`
at a clean close, both on the model thread, with the lease held (so `maintain` keeps the state while it is used)."""

from __future__ import annotations

import asyncio
import threading

from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from tests.support.agent import ScriptedBinding, answer


class StateBinding(ScriptedBinding):
    """A scripted binding that records its saved-state calls: the method, its thread and whether the lease was held."""

    def __init__(self, outputs) -> None:
        super().__init__(outputs)
        self.state_calls: list[tuple[str, str, bool]] = []

    def save_session_state(self, store: MemoryStore, lease) -> str:
        held = lease.renew() > 0  # raises LeaseLostError once released
        self.state_calls.append(("save", threading.current_thread().name, held))
        return "saved"

    def load_session_state(self, store: MemoryStore, session_id: str) -> str:
        with store.db.read() as conn:
            held = conn.execute("SELECT count(*) FROM session_leases l JOIN sessions s ON s.id = l.session_id "
                                "WHERE s.uuid = ? AND l.state = 'active'", (session_id,)).fetchone()[0] == 1
        self.state_calls.append(("load", threading.current_thread().name, held))
        return "offered"


def _snapshot(binding):
    return build_snapshot(binding, {}, model_reference="test/scripted", model_snapshot_id="s" * 64,
                          system_prompt="Test agent.")


def test_a_clean_close_saves_the_state_and_a_resume_loads_it_on_the_model_thread(store: MemoryStore,
                                                                                 workspace) -> None:
    first, second = StateBinding([answer("one")]), StateBinding([answer("two")])

    async def main() -> None:
        agent = await DurableAgentSession.create(store, workspace, first, {}, _snapshot(first))
        await agent.turn("hello")
        await agent.close()
        resumed = await DurableAgentSession.resume(store, agent.session_id, workspace, second, {}, _snapshot(second))
        await resumed.turn("again")
        await resumed.close()

    asyncio.run(main())
    calls = [(method, thread.startswith("emelex-agent-model-"), held)
             for method, thread, held in first.state_calls + second.state_calls]
    assert calls == [("save", True, True), ("load", True, True), ("save", True, True)]
