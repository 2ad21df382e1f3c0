"""benchmarks/RESULTS.md holds only what the benchmarks wrote: each section is exactly its script's rendering of the
figures its run recorded (so no figure or range is typed or carried by hand), a benchmark's section is replaced in
place, never doubled, and a figure is printed beside its target."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the scripts import `results` as the benchmarks run them
import results  # noqa: E402



def _script(path: Path):
    if path.stem in sys.modules:  # loaded by another test module already (tests/test_bench_quality.py)
        return sys.modules[path.stem]
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # a script's dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _rendering_scripts() -> dict[str, object]:
    """Section name -> the benchmark module that renders it."""
    owners = {}
    for path in sorted(BENCHMARKS.glob("bench_*.py")):
        module = _script(path)
        assert module.SECTIONS and callable(module.render), path.name
        for name in module.SECTIONS:
            assert name not in owners, f"two scripts write section {name}"
            owners[name] = module
    return owners


def test_every_section_is_its_scripts_rendering_of_its_recorded_figures() -> None:
    owners = _rendering_scripts()
    assert len(owners) >= 8
    sections = results.recorded()
    assert set(sections) == set(owners), "a section without its script, or a script without its section"
    text = results.RESULTS.read_text()
    assert text.startswith(results.HEADER)
    assert results.SECTION.sub("", text[len(results.HEADER):]).strip() == "", "text outside every section"
    for name, module in owners.items():
        figures, body = sections[name]
        assert figures is not None, f"section {name} records no figures"
        render = results.render_pending if figures.get("pending") else module.render
        assert body == results.section_text(render, figures), f"section {name} is not what its script renders"


def test_a_section_is_appended_once_then_replaced_in_place(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    results.write_section("quality", "## Quality\nold", path)
    results.write_section("storage", "## Storage\nfigures", path)
    results.write_section("quality", "## Quality\nnew", path)
    text = path.read_text()
    assert text.startswith(results.HEADER)
    assert text.count("<!-- section: quality -->") == 1 and "old" not in text and "new" in text
    assert text.index("## Quality") < text.index("## Storage")  # replaced where it was
    assert [p for p in tmp_path.iterdir() if p.name != "RESULTS.md"] == []  # no temporary file left


def test_a_bad_section_name_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    with pytest.raises(ValueError):
        results.write_section("Bad Name", "x", path)
    assert not path.exists()


def test_figures_are_printed_beside_their_target_recorded_and_a_miss_fails_the_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "RESULTS.md"
    figures = results.Figures("demo", lambda f: results.render_list("Demo (`bench_demo.py`)", "What it measures.", f))
    figures.add("ratio", 1.01, "<=", 1.3, detail="rounds: 1.00, 1.02")
    assert figures.write(path) == 0
    assert capsys.readouterr().out == "ratio: 1.010 (target <= 1.3: met; rounds: 1.00, 1.02)\n"
    (recorded, body) = results.recorded(path)["demo"]
    assert re.fullmatch(r"## Demo \(`bench_demo.py`\)\n\nMeasured \d{4}-\d\d-\d\d:\n\n"
                        r"- ratio: 1\.010 \(target <= 1\.3: met; rounds: 1\.00, 1\.02\)\n\nWhat it measures\.\n"
                        r"\nRun at commit `[0-9a-f]{12}`[^\n]*; machine load [^\n]* on \d+ CPUs\.\n", body)
    assert recorded["figures"][0]["value"] == 1.01
    figures.add("share", 7.5, "<", 5, unit="%", format=".1f")
    assert figures.write(path) == 1  # a missed target fails the benchmark
    assert "share: 7.5% (target < 5: **not met**)" in results.recorded(path)["demo"][1]


def test_a_pending_section_says_what_to_run(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    results.mark_pending("scale", "Scale (`bench_scale.py`)", "bench_scale.py", "its figures are now recorded", path)
    figures, body = results.recorded(path)["scale"]
    assert body == results.render_pending(figures)
    assert "run `python benchmarks/bench_scale.py` to measure it" in body


def test_a_section_records_its_runs_commit_and_load_and_says_them(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    results.publish("demo", lambda f: "## Demo\n", {"figures": []}, path)
    (figures, body) = results.recorded(path)["demo"]
    run = figures["measured_at"]
    assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]) and isinstance(run["dirty"], bool)
    assert len(run["load"]) == 3 and run["cpus"] == os.cpu_count()
    assert body.endswith(results.run_line(figures)) and f"commit `{run['commit'][:12]}`" in body
    assert "machine load" in body


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "code").mkdir()
    (root / "code" / "fast.py").write_text("x = 1\n")
    (root / "other.py").write_text("y = 1\n")
    (root / "benchmarks" / "bench_demo.py").write_text("SECTIONS = ('demo',)\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "one"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


def test_a_section_older_than_the_code_it_measures_is_flagged(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    path = root / "benchmarks" / "RESULTS.md"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    owners = {"demo": ("benchmarks/bench_demo.py", ("code",)), "old": ("benchmarks/bench_demo.py", ("code",)),
              "elsewhere": ("benchmarks/bench_demo.py", ("code",))}
    run = {"commit": commit, "dirty": False, "load": [0.0, 0.0, 0.0], "cpus": 2}
    results.write_section("demo", f"<!-- figures: {json.dumps({'measured_at': run})} -->\nfigures\n", path)
    results.write_section("old", "<!-- figures: {} -->\nfigures of a run that recorded nothing\n", path)
    unknown = {**run, "commit": "0" * 40}
    results.write_section("elsewhere", f"<!-- figures: {json.dumps({'measured_at': unknown})} -->\nfigures\n", path)
    flagged = results.stale(path, owners, root)
    assert set(flagged) == {"old", "elsewhere"}
    assert "recorded no commit" in flagged["old"] and "not in this repository" in flagged["elsewhere"]
    (root / "other.py").write_text("y = 2\n")  # code the section does not measure
    assert "demo" not in results.stale(path, owners, root)
    (root / "code" / "fast.py").write_text("x = 2\n")  # code it measures, changed in the working tree
    why = results.stale(path, owners, root)["demo"]
    assert f"changed since {commit[:12]} (code/fast.py)" in why and "run `python benchmarks/bench_demo.py`" in why


def test_every_benchmark_names_the_code_it_measures() -> None:
    root = BENCHMARKS.parent
    for name, module in results.scripts().items():
        assert module.MEASURES, f"{name} names no code it measures"
        missing = [m for m in module.MEASURES if not (root / m).exists()]
        assert not missing, f"{name} measures paths that do not exist: {missing}"


def test_a_reported_figure_has_no_target_to_miss(tmp_path: Path, capsys) -> None:
    figures = results.Figures("demo", lambda f: results.render_list("Demo", "What it measures.", f))
    figures.report("ratio", 1.07, "the target was retired", detail="raw 0.4 ms")
    assert figures.write(tmp_path / "RESULTS.md") == 0
    assert capsys.readouterr().out == "ratio: 1.070 (reported: the target was retired; raw 0.4 ms)\n"
