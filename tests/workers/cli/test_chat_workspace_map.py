"""`emelex chat` records the workspace map before a new Session's first round, and a resumed Session replays that
record byte for byte, never a fresh map, however the workspace changed since."""

from __future__ import annotations

import asyncio
import subprocess

from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.workspace_map import workspace_map, workspace_map_source
from emelex_workers.settings import WorkerSettings

from ...support.agent import ScriptedBinding, answer
from .test_chat_cli import chat, env  # noqa: F401  (env is a fixture)


def session_of(out: subprocess.CompletedProcess) -> str:
    return out.stdout.split()[1].rstrip(";")


def raw_events(home) -> list[tuple[str, str]]:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        return [(e.kind, e.payload_json) for e in store.replay(session.id).events]


def test_a_chat_records_the_map_once_and_a_resume_replays_it_byte_identically(env, home, workspace, tmp_path) -> None:
    (workspace / "config.ini").write_text("port = 8080\n")
    made = chat(env, workspace, "hello\n/exit\n", [answer("hi")], tmp_path / "effects")
    assert made.returncode == 0, made.stderr
    first = raw_events(home)
    assert [kind for kind, _ in first] == ["context", "user", "assistant", "audit"]
    assert "config.ini (12 bytes)" in first[0][1] and '"source":"workspace_map"' in first[0][1]
    (workspace / "config.ini").unlink()
    (workspace / "new.txt").write_text("new")
    again = chat(env, workspace, "again\n/exit\n", [answer("ok")], tmp_path / "effects", "--resume",
                 session_of(made))
    assert again.returncode == 0, again.stderr
    after = raw_events(home)
    assert [kind for kind, _ in after] == ["context", "user", "assistant", "audit", "user", "assistant", "audit"]
    assert after[0] == first[0]  # the recorded text, byte for byte


def test_the_model_sees_the_recorded_map_after_a_resume_not_the_changed_workspace(store, workspace) -> None:
    (workspace / "config.ini").write_text("port = 8080\n")
    binding = ScriptedBinding([answer("hi"), answer("ok")])
    snap = build_snapshot(binding, {}, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.",
                          context=("workspace_map",))
    sources = {"workspace_map": workspace_map_source}
    original = workspace_map(workspace)["text"]

    async def first() -> str:
        agent = await DurableAgentSession.create(store, workspace, binding, {}, snap, context_sources=sources)
        assert (await agent.turn("hello")).context[0]["text"] == original
        await agent.close()
        return agent.session_id

    async def resumed(session: str) -> None:
        asked = []
        agent = await DurableAgentSession.resume(store, session, workspace, binding, {}, snap, context_sources={
            "workspace_map": lambda request: asked.append(request) or workspace_map_source(request)})
        assert (await agent.turn("again")).answer == "ok"
        await agent.close()
        assert asked == []

    session = asyncio.run(first())
    (workspace / "config.ini").unlink()
    (workspace / "new.txt").write_text("new")
    asyncio.run(resumed(session))
    assert binding.rounds[-1]["messages"][1] == {"role": "system", "content": original}
    assert "new.txt" not in str(binding.rounds[-1]["messages"]) and "config.ini (12 bytes)" in original
