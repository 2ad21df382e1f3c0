"""The worker and model problems met during a run: a tampered or removed model, a lock timeout, a failing binding
or load release the job without consuming an attempt and stop the run (exit 1, one line); the model's context
window is capped by `model_max_context_tokens`; a distillation source over the budget is split, not failed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    MemoryStore,
    ModelNotInstalledError,
    ModelTamperedError,
    NewEvent,
    PluginHookError,
    SnapshotLockTimeoutError,
)
from emelex_memory.snapshots.installed import snapshot_mutation_lock
from emelex_workers.cli import app
from emelex_workers.hookspecs import hookimpl
from emelex_workers.models import ModelManager
from emelex_workers.host.manager import PluginInfo, get_plugin_manager
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings

from ...support.plugins import fake_model_file
from .test_work import env, jobs, seed  # noqa: F401 - the fixture and helpers of the worker tests


def assert_released_without_attempts(store: MemoryStore, why: str, runs: int = 1) -> None:
    found = jobs(store)
    assert found, "the seed queued jobs"
    for job in found.values():
        assert job.state == "pending" and job.attempts == 0, job
    diagnostics = [d for j in found.values() for d in j.diagnostics]
    assert len(diagnostics) == runs  # each run stopped after its first claim
    for d in diagnostics:
        assert d.event == "released" and d.message.startswith(f"model unavailable, no attempt consumed: {why}")


def tamper(settings: WorkerSettings) -> None:
    path = settings.home_dir / "models" / "fake" / "model.gguf"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(data), 0)
    finally:
        os.close(fd)


def test_a_tampered_model_releases_the_job_without_an_attempt_and_stops_the_run(env: WorkerSettings, workspace: Path):
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        tamper(env)
        for _ in range(2):  # every run stops the same way; nothing is ever counted
            with pytest.raises(ModelTamperedError, match="changed since it was installed"):
                work(store, env)
        assert_released_without_attempts(store, "ModelTamperedError", runs=2)
        assert store.session_model_refs(jobs(store)["compaction"].session_id).refs == []


def test_cli_exits_1_with_one_line_when_the_model_was_tampered_with(env: WorkerSettings, workspace: Path):
    with MemoryStore.open(env) as store:
        seed(store, workspace)
    tamper(env)
    result = CliRunner().invoke(app, ["memory", "work"])
    assert result.exit_code == 1 and result.stdout == ""
    _, started, released, error = result.stderr.splitlines()  # threads, the job's start and end, then the error
    assert started.startswith("[compaction] job ") and " released in " in released
    assert error.startswith("error: model file ") and "emelex models verify fake" in error
    with MemoryStore.open(env) as store:
        assert_released_without_attempts(store, "ModelTamperedError")


def test_a_model_removed_and_reinstalled_since_lookup_stops_the_run(env: WorkerSettings, workspace: Path, tmp_path):
    with ModelManager(env) as manager:
        stale = manager.get("fake")
        manager.remove("fake")
        other = fake_model_file(tmp_path / "again")
        other.write_bytes(other.read_bytes() + b"\0")  # another snapshot: the same file again keeps its ID
        manager.install(other, name="fake")
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        with pytest.raises(ModelNotInstalledError, match="no longer installed"):
            work(store, env, model=stale)
        assert_released_without_attempts(store, "ModelNotInstalledError")


def test_a_snapshot_lock_timeout_stops_the_run(env: WorkerSettings, workspace: Path):
    impatient = WorkerSettings(model_lock_timeout_s=0.05)
    with MemoryStore.open(impatient) as store:
        seed(store, workspace)
        with snapshot_mutation_lock(env.home_dir, timeout_s=1):  # another open file description: a real conflict
            with pytest.raises(SnapshotLockTimeoutError):
                work(store, impatient)
        assert_released_without_attempts(store, "SnapshotLockTimeoutError")
        assert work(store, impatient).counts["done"] == 2  # once the lock is free, the jobs run


class FailingBinding:
    """A plugin answering model_binding first; fails in the hook, at load (context_window), while counting or when
    closed, as configured. The binding is a separate object: registering a plugin may read its attributes (pluggy < 1.7 does)."""

    def __init__(self, where: str) -> None:
        self.where = where

    @hookimpl(tryfirst=True)
    def model_binding(self, model):
        if self.where == "hook":
            raise RuntimeError("cannot bind")
        return _Binding(self.where, model)


class _Binding:
    def __init__(self, where: str, model) -> None:
        self.where = where
        self.model = model

    @property
    def context_window(self) -> int:
        if self.where == "load":
            raise ValueError("Failed to load model from file")
        return 4096

    def count_tokens(self, text: str) -> int:
        if self.where == "count":
            raise RuntimeError("tokenizer broke")
        return len(text) // 4 + 1

    def chat(self, messages, *, max_tokens, json_schema=None) -> str:
        return "{}"

    def close(self) -> None:
        if self.where == "close":
            raise RuntimeError("close broke")


@pytest.mark.parametrize("where, message", [
    ("hook", "plugin 'failing' failed in hook model_binding: RuntimeError: cannot bind"),
    ("load", "the model binding of plugin 'failing' failed to load model 'fake': ValueError: Failed to load model"),
])
def test_a_binding_or_load_failure_names_the_plugin_and_stops_the_run(env, workspace, where, message):
    pm = get_plugin_manager(env)
    pm.add_plugin(FailingBinding(where), PluginInfo("failing", "test", "0", "test", False))
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        with pytest.raises(PluginHookError) as raised:
            work(store, env, pm=pm)
        assert str(raised.value).startswith(message)
        assert_released_without_attempts(store, "PluginHookError")


def test_a_tokenizer_failure_is_a_counted_job_failure_naming_the_plugin(env: WorkerSettings, workspace: Path):
    pm = get_plugin_manager(env)
    pm.add_plugin(FailingBinding("count"), PluginInfo("failing", "test", "0", "test", False))
    with MemoryStore.open(env) as store:
        seed(store, workspace, compact=False)
        report = work(store, env, pm=pm)
        job = jobs(store)["distill"]
        assert report.counts["retrying"] == 1 and job.attempts == 1
        assert "the model binding of plugin 'failing' failed to count tokens: RuntimeError: tokenizer broke" in (
            job.diagnostics[-1].message)


def test_a_binding_that_fails_to_close_names_the_plugin_after_the_jobs_were_recorded(
    env: WorkerSettings, workspace: Path
):
    pm = get_plugin_manager(env)
    pm.add_plugin(FailingBinding("close"), PluginInfo("failing", "test", "0", "test", False))
    with MemoryStore.open(env) as store:
        seed(store, workspace, compact=False)
        with pytest.raises(PluginHookError) as raised:
            work(store, env, pm=pm)
        assert str(raised.value).startswith(
            "the model binding of plugin 'failing' failed to close the model: RuntimeError: close broke")
        assert jobs(store)["distill"].state != "claimed"  # its outcome was recorded before the binding was closed


def test_the_context_window_is_capped_and_a_long_session_is_distilled_in_parts(
    env: WorkerSettings, workspace: Path, monkeypatch
):
    monkeypatch.setenv("EMELEX_MODEL_MAX_CONTEXT_TOKENS", "1280")  # the fake allocates 4096: 256 tokens to distill
    settings = WorkerSettings()
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            for i in range(12):
                lease.append_turn([NewEvent("user", {"text": f"question {i}: " + "why " * 40}),
                                   NewEvent("assistant", {"text": f"answer {i} is {i * i}."})])
            store.finish_session(lease)
        report = work(store, settings)
        distills = store.list_jobs(kind="distill").jobs
        assert report.counts == {"done": len(distills), "retrying": 0, "failed": 0, "released": 0, "lost": 0}
        leaves = sorted((j.source["first_seq"], j.source["last_seq"]) for j in distills if "split_into" not in j.result)
        assert len(leaves) > 1 and leaves[0][0] == 1 and leaves[-1][1] == 24  # the parts cover every event once
        assert all(a[1] + 1 == b[0] for a, b in zip(leaves, leaves[1:]))
        entries = {e.key for e in store.recall(workspace).entries}
        assert entries == {f"fact-{seq}" for seq in range(2, 25, 2)}  # the fake distils every assistant event
