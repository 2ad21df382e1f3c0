"""The demo's own text about what it shows: it must describe every Summary the worker can write."""

from __future__ import annotations

from emelex_workers.demo.memory import summary_heading


def test_a_summary_that_names_no_model_is_described_as_rule_based() -> None:
    payload = {"text": "assistant: x", "provenance": {"job": "j", "model": None, "source": {}}}
    assert summary_heading(payload) == "The Summary replaces turns 1-4 (rule-based: no model call):"


def test_a_summary_that_names_its_model_is_described_with_it() -> None:
    model = "smollm2-135m-instruct@sha256:" + "0" * 64
    payload = {"text": "x", "provenance": {"job": "j", "model": model, "source": {}}}
    assert summary_heading(payload) == f"The Summary replaces turns 1-4 (model {model[:40]}...):"
