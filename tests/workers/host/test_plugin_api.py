"""The plugin API: every name docs/plugins.md lists imports from `emelex_workers.plugin_api`, and the module
exports nothing the page does not list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import emelex_workers.plugin_api as plugin_api

DOCS = Path(__file__).parents[3] / "docs" / "plugins.md"


def _documented() -> set[str]:
    text = DOCS.read_text()
    section = text[text.index("## The plugin API"):text.index("\n## ", text.index("## The plugin API") + 5)]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Za-z_]\w*)`", row)}


def test_every_documented_name_imports_from_the_plugin_api() -> None:
    names = _documented()
    assert {"KnowledgeCandidate", "TransientJobError", "PermanentJobError", "hookimpl"} <= names
    code = f"from emelex_workers.plugin_api import {', '.join(sorted(names))}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_plugin_api_exports_only_documented_names() -> None:
    assert set(plugin_api.__all__) == _documented()


def test_every_import_the_docs_show_works() -> None:
    """Each `from emelex_workers... import ...` line in the page's code imports."""
    lines = re.findall(r"^from (emelex_workers\.\w+(?:\.\w+)*) import ([^\n(]+)$", DOCS.read_text(), re.M)
    assert lines
    for module, names in lines:
        code = f"from {module} import {names}"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{code}: {out.stderr}"
