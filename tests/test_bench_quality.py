"""benchmarks/bench_quality.py without a model: how it classifies an entry against the labelled set, and that a
missed target is printed and makes it exit 1 (tests/test_bench_results.py checks that RESULTS.md holds exactly
what its recorded figures render to)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
_SPEC = importlib.util.spec_from_file_location("bench_quality", BENCHMARKS / "bench_quality.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_quality"] = bench  # its dataclasses look their module up
_SPEC.loader.exec_module(bench)

LABELLED = {c["id"]: c for c in json.loads((BENCHMARKS / "quality" / "labelled.json").read_text())["conversations"]}


def test_an_entry_is_classified_by_the_labelled_sentences_it_states() -> None:
    labels = LABELLED["upload-timeouts"]["labels"] + LABELLED["editable-install"]["labels"]
    kinds = {text: bench.classify(text, labels, set()) for text in (
        "The Go server sets IdleTimeout to 5 seconds.",
        "Q: Where do the timeout settings live? A: In config/server.yaml.",
        "In config/server.yaml.",
        "We could add three automatic retries in the web client.",
        "Understood, no client retries.",
        "The upload pod is stuck in CrashLoopBackOff right now.",
        "A plain `pip install -e .",  # cut inside a code span
        "Deploys are done on Fridays.",
    )}
    assert list(kinds.values()) == ["superseded", "standalone", "fragment", "proposal_alone", "standalone",
                                    "episodic", "fragment", "unlabelled"]
    later = {bench._plain("Envoy keeps idle upstream connections open for 60 seconds, longer than the Go server does.")}
    assert bench.classify("Envoy keeps idle upstream connections open for 60 seconds, longer than the Go server does.",
                          labels, later) == "superseded"  # a later Session changed it


def test_confidence_separates_only_when_the_upper_half_is_more_often_right() -> None:
    assert bench.confidence_split([(0.9, True), (0.8, True), (0.5, False), (0.6, True)])["separates"]
    assert not bench.confidence_split([(0.9, False), (0.8, True), (0.5, True), (0.6, True)])["separates"]
    assert not bench.confidence_split([(0.7, True), (0.7, False)])["separates"]  # one value: nothing below it


def test_a_missed_target_is_printed_beside_its_figure_and_exits_1(tmp_path: Path, monkeypatch, capsys) -> None:
    figures = bench.recorded("quality")
    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(bench, "RESULTS", results)
    bench.publish("quality", figures)
    assert bench.main(["--render", "--no-write"]) == (1 if bench.misses(figures) else 0)
    broken = copy.deepcopy(figures)
    broken["labelled"]["kinds"]["superseded"] = 1
    bench.publish("quality", broken)
    assert bench.main(["--render"]) == 1
    out = capsys.readouterr().out
    assert "labelled: superseded values stated as current: 1  target 0 (**not met**)" in out
    assert "Result: **targets missed**" in results.read_text()
