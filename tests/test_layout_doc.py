"""docs/layout.md says where everything is: each folder of the two packages, each built-in plugin package and each
folder of the tests is named (in backquotes, as `name/`) in the section about its part of the tree, so a folder
added without its line fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"
# the part of the tree, and the heading of the section of docs/layout.md that names its folders
PARTS = {
    "emelex_memory": "## The core: `emelex_memory/`",
    "emelex_workers": "## The workers: `emelex_workers/`",
    "plugins": "## The built-in plugins: `plugins/`",
    "tests": "## The tests: `tests/`",
}


def _section(heading: str) -> str:
    text = LAYOUT.read_text(encoding="utf-8")
    assert heading in text, f"docs/layout.md has no section {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _folders(part: str) -> list[str]:
    """Every folder under `part` that holds Python code or SQL, relative to `part` (`core/schema`, `workers/cli`)."""
    base = ROOT / part
    return sorted(
        str(d.relative_to(base)) for d in base.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(f.suffix in (".py", ".sql") for f in d.iterdir())
    )


@pytest.mark.parametrize("part", sorted(PARTS))
def test_every_folder_is_named_in_its_section_of_docs_layout(part: str) -> None:
    section = _section(PARTS[part])
    named = set(re.findall(r"`([^`]+)/`", section))
    missing = [folder for folder in _folders(part) if folder not in named]
    assert not missing, f"docs/layout.md ({PARTS[part]}) does not name {', '.join(f'`{m}/`' for m in missing)}"


def test_the_check_sees_the_folders() -> None:
    assert {"core", "core/schema", "sessions", "search"} <= set(_folders("emelex_memory"))
    assert {"search", "plugins/openai", "workers/agent", "support"} <= set(_folders("tests"))
    assert {"emelex_openai", "emelex_tools"} <= set(_folders("plugins"))
