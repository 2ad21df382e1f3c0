"""'A Session has a live lease' is one SQL predicate (`sessions/holders.py: live_lease`), spelled nowhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import emelex_memory
from emelex_memory.sessions.holders import live_lease

ROOT = Path(emelex_memory.__file__).parent


def _sql_texts(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_no_module_but_holders_spells_the_live_lease_predicate() -> None:
    spelled = {
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if path != ROOT / "sessions" / "holders.py"
        for text in _sql_texts(path)
        if "'active'" in text and "expires_at >" in text
    }
    assert spelled == set()


def test_the_predicate_names_its_table_alias() -> None:
    assert live_lease() == "state = 'active' AND expires_at > ?"
    assert live_lease("l") == "l.state = 'active' AND l.expires_at > ?"
