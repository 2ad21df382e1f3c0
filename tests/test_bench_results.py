"""benchmarks/results.py: a benchmark's section of the shared results file is replaced in place, never doubled;
every benchmark writes its figures there."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("bench_results", Path(__file__).parents[1] / "benchmarks" / "results.py")
results = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(results)


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


def test_every_benchmark_writes_its_own_section_of_the_results_file() -> None:
    benchmarks = Path(__file__).parents[1] / "benchmarks"
    text = (benchmarks / "RESULTS.md").read_text()
    scripts = sorted(benchmarks.glob("bench_*.py"))
    assert len(scripts) >= 7
    for script in scripts:
        code = script.read_text()
        assert "from results import" in code, script.name
        names = re.findall(r'(?:Figures|write_section)\(\s*"([a-z0-9-]+)"', code)
        assert names or "args.section" in code, script.name
        for name in names:
            assert f"<!-- section: {name} -->" in text, (script.name, name)


def test_figures_write_a_dated_section_with_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    figures = results.Figures("demo", "Demo (`bench_demo.py`)", "What it measures.")
    figures.add("ratio 1.01 (target <= 1.3)")
    figures.write(path)
    text = path.read_text()
    assert re.search(r"## Demo \(`bench_demo.py`\)\n\nMeasured \d{4}-\d\d-\d\d:\n\n- ratio 1.01 \(target <= 1.3\)\n", text)
    assert "What it measures." in text
