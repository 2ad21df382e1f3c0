"""A chat Session stays resumable where nothing semantic changed: resume rebuilds the snapshot from the Session's
own recorded values (a chat made with a 2048-token window resumes under another setting), installing the same
model file again gives the same snapshot ID (old manifests keep their IDs), and a refusal names the field's old
and new value and a fix."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_memory.errors import SnapshotMismatchError
from emelex_memory.snapshots.installed import MANIFEST_NAME, read_installed, revalidate
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings

from ...support.agent import ScriptedBinding, scripted_model_file
from .test_chat_cli import EMELEX, chat, env  # noqa: F401  (env is a fixture)


def session_of(out: subprocess.CompletedProcess) -> str:
    return out.stdout.split()[1].rstrip(";")


def test_a_chat_made_with_another_context_size_resumes_with_its_own(env, home, workspace, tmp_path) -> None:
    small = {**env, "EMELEX_MODEL_MAX_CONTEXT_TOKENS": "2048"}
    made = chat(small, workspace, "/exit\n", [], tmp_path / "effects")
    assert made.returncode == 0, made.stderr
    session = session_of(made)
    resumed = chat(env, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session)  # the default window
    assert resumed.returncode == 0, resumed.stderr
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        assert journal.stored_snapshot(store, session).context_size == 2048


def test_installing_the_same_file_again_gives_the_same_snapshot_id(home, tmp_path) -> None:
    settings = WorkerSettings(home=home)
    source = scripted_model_file(tmp_path / "model")
    with ModelManager(settings) as manager:
        first = manager.install(source, name="scripted")
        manager.remove("scripted")
        copy = tmp_path / "elsewhere" / "copy.gguf"
        copy.parent.mkdir()
        copy.write_bytes(source.read_bytes())
        second = manager.install(copy, name="scripted")
    assert second.snapshot_id == first.snapshot_id and second.installed_at != first.installed_at
    assert revalidate(second).snapshot_id == first.snapshot_id


def test_a_manifest_of_the_first_format_keeps_its_snapshot_id(home, tmp_path) -> None:
    settings = WorkerSettings(home=home)
    with ModelManager(settings) as manager:
        model = manager.install(scripted_model_file(tmp_path / "model"), name="scripted")
    path = model.directory / MANIFEST_NAME
    value = json.loads(path.read_bytes())
    value["format"] = 1  # as every manifest written before identities left out the install time
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    path.write_bytes(data)
    legacy = read_installed(home, "scripted")
    assert legacy.snapshot_id == "sha256:" + hashlib.sha256(data).hexdigest()  # the whole manifest, as before


def test_a_refused_resume_names_the_old_and_new_value(store: MemoryStore, workspace) -> None:
    binding = ScriptedBinding([])
    made = build_snapshot(binding, {}, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.", seed=7)

    async def main() -> str:
        agent = await DurableAgentSession.create(store, workspace, binding, {}, made)
        await agent.close()
        return agent.session_id

    session = asyncio.run(main())
    now = build_snapshot(binding, {}, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.", seed=8)
    with pytest.raises(SnapshotMismatchError) as info:
        asyncio.run(DurableAgentSession.resume(store, session, workspace, binding, {}, now))
    assert info.value.field == "seed" and "seed 7" in str(info.value) and "has 8" in str(info.value)


def test_a_chat_resumes_after_backup_restore_and_reinstalling_the_same_model_file(env, home, workspace,
                                                                                  tmp_path) -> None:
    made = chat(env, workspace, "/exit\n", [], tmp_path / "effects")
    assert made.returncode == 0, made.stderr
    backup = tmp_path / "backup"
    subprocess.run([*EMELEX, "memory", "backup", str(backup)], env=env, check=True, capture_output=True)
    other = {**env, "EMELEX_HOME": str(tmp_path / "restored")}
    subprocess.run([*EMELEX, "memory", "restore", str(backup)], env=other, check=True, capture_output=True)
    subprocess.run([*EMELEX, "models", "install", str(scripted_model_file(tmp_path / "again")), "--name",
                    "scripted"], env=other, check=True, capture_output=True)
    resumed = chat(other, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session_of(made))
    assert resumed.returncode == 0, resumed.stderr


def test_a_tool_mismatch_names_the_recorded_and_the_registered_value(store: MemoryStore, workspace,
                                                                    settings) -> None:
    from emelex_workers.agent.tools import RegisteredTool, registered_tools
    from emelex_workers.host.manager import get_plugin_manager

    from ...support import agent as agent_support

    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    tools = {"peek": registered_tools(pm)["peek"]}
    binding = ScriptedBinding([])
    made = build_snapshot(binding, tools, model_reference="t/m", model_snapshot_id="s" * 64, system_prompt="T.")

    async def main() -> str:
        agent = await DurableAgentSession.create(store, workspace, binding, tools, made)
        await agent.close()
        return agent.session_id

    session = asyncio.run(main())
    newer = {"peek": RegisteredTool(tools["peek"].spec, tools["peek"].plugin, "9.9")}
    with pytest.raises(SnapshotMismatchError) as info:
        asyncio.run(DurableAgentSession.resume(store, session, workspace, binding, newer, made))
    message = str(info.value)
    assert "tools[peek].plugin_version" in message and f"recorded '{agent_support.VERSION}'" in message
    assert "registered now '9.9'" in message and "install the plugin version" in message
