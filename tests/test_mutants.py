"""scripts/mutants.toml, the mutation check of docs/design.md (`make mutants`), stays true to the contract and the
code: every promise has a breaking change, each change still applies to exactly one place, and each names tests
its promise links. Running the mutants is `make mutants`; this only keeps the list from going stale."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
mutants = sys.modules.setdefault("mutants", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(mutants)


def test_every_promise_has_a_mutant_that_applies_and_names_its_linked_tests() -> None:
    listed = mutants.load()
    assert len(mutants.guarantees()) >= 30
    assert mutants.problems(listed) == []


def test_every_named_test_exists() -> None:
    for m in mutants.load():
        for node in m.tests:
            path, _, name = node.partition("::")
            assert re.search(rf"^\s*def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), node


def test_a_guarantee_without_a_mutant_and_a_stale_line_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(
        "## Part\n\n- **Kept.** text [test_a.py::test_kept](../tests/test_a.py)\n"
        "- **Forgotten.** text [test_a.py::test_other](../tests/test_a.py)\n")
    (tmp_path / "code.py").write_text("x = 1\nx = 1\n")
    listed = [mutants.Mutant("Kept.", "code.py", "x = 1", "x = 2", ("tests/test_a.py::test_kept",), ""),
              mutants.Mutant("Kept.", "code.py", "y = 1", "y = 2", ("tests/test_a.py::test_other",), "")]
    wrong = mutants.problems(listed, tmp_path)
    assert any("occurs 2 times" in w for w in wrong) and any("occurs 0 times" in w for w in wrong)
    assert any("must be ones 'Kept.' links" in w for w in wrong)
    assert "no mutant breaks the guarantee 'Forgotten.'" in wrong
