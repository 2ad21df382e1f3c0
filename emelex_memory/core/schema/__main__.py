"""`python -m emelex_memory.core.schema [PATH]`: write the current schema to PATH (default docs/schema.sql)."""

from __future__ import annotations

import sys
from pathlib import Path

from .reference import schema_text


def main(argv: list[str]) -> None:
    """Write `schema_text()` to `argv[0]`, or to docs/schema.sql when no path is given."""
    target = Path(argv[0] if argv else "docs/schema.sql")
    target.write_text(schema_text(), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
