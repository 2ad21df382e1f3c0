"""docs/cli.md is generated from the command line's `--help` and must not drift from it."""

from __future__ import annotations

from pathlib import Path

from emelex_workers.cli import reference

CLI_MD = Path(__file__).parents[3] / "docs" / "cli.md"


def test_docs_cli_md_is_the_generated_reference() -> None:
    assert CLI_MD.read_text(encoding="utf-8") == reference.render(), (
        "docs/cli.md is out of date: run `make docs` (python -m emelex_workers.cli.reference docs/cli.md)")


def test_the_reference_has_every_command_with_its_options() -> None:
    text = reference.render()
    for path in ("emelex memory work", "emelex memory sessions show", "emelex models install", "emelex plugins list",
                 "emelex memory compaction redo", "emelex memory workspaces rebind"):
        assert f"## `{path}`\n\n```text\nUsage: {path} " in text, path
    assert "--max-seconds SECONDS" in text and "--json" in text
