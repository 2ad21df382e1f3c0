"""docs/design.md links every guarantee to the test that proves it; each linked test must exist.

A link names a test file and function (`test_x.py::test_y`); the function is looked up in every file of that
name anywhere under tests/, so moving a test to another folder does not break the link."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
DESIGN = TESTS.parent / "docs" / "design.md"
LINK = re.compile(r"\[(test_\w+\.py)::(test_\w+)\]\(\.\./tests/[\w/]*?(test_\w+\.py)\)")


def _defined(file_name: str, function: str) -> bool:
    pattern = re.compile(rf"^\s*def {re.escape(function)}\(", re.M)
    return any(pattern.search(p.read_text(encoding="utf-8")) for p in TESTS.rglob(file_name))


def test_every_linked_test_exists() -> None:
    links = LINK.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(links) >= 40
    missing = [f"{f}::{t}" for f, t, target in links if f != target or not _defined(f, t)]
    assert not missing, f"docs/design.md links tests that do not exist: {missing}"


def test_every_test_link_is_well_formed() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    assert text.count("](../tests/") == len(LINK.findall(text))
