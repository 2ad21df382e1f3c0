"""benchmarks/results.py: a benchmark's section of the shared results file is replaced in place, never doubled."""

from __future__ import annotations

import importlib.util
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
