"""The schema, in one folder: one `mNNN_<what>.sql` file per migration step, applied in the order of NNN.

A step's file name (without `.sql`) is the name `schema_migrations` records, so a file is never renamed, edited
or reordered once released: a change to the schema is a new file with the next number. The current tables as a
whole are in `docs/schema.sql`, generated from a migrated database by `python -m emelex_memory.core.schema`.
This package reads files only; it imports nothing (`core/migrations.py` runs the steps).
"""

from __future__ import annotations

import re
from pathlib import Path

FOLDER = Path(__file__).parent
STEP_FILE = re.compile(r"m(\d{3})_[a-z0-9_]+\.sql\Z")

# Steps that rebuild tables other tables reference (SQLite's create-copy-drop-rename procedure): the runner applies
# them with foreign keys off and commits only when `PRAGMA foreign_key_check` finds no violation.
REBUILDS_TABLES = frozenset({"m009_workspaces"})


def steps(folder: Path = FOLDER) -> tuple[tuple[str, str], ...]:
    """Every step in `folder` as `(name, sql)`, numbered 1, 2, 3, ... without a gap; the SQL exactly as the file's
    UTF-8 bytes spell it. A misnamed, duplicate or missing number is a `ValueError` (a packaging mistake)."""
    files = sorted(p for p in folder.iterdir() if p.suffix == ".sql")
    found = []
    for number, path in enumerate(files, start=1):
        match = STEP_FILE.match(path.name)
        if not match or int(match.group(1)) != number:
            raise ValueError(f"schema step {path.name!r} is not step m{number:03d}_<what>.sql")
        found.append((path.stem, path.read_bytes().decode("utf-8")))
    unknown = REBUILDS_TABLES - {name for name, _ in found}
    if unknown:
        raise ValueError(f"REBUILDS_TABLES names steps that do not exist: {sorted(unknown)}")
    return tuple(found)
