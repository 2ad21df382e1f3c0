"""A migration that rebuilds a referenced table runs with foreign keys off and checks them before it commits."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import ForeignKeyViolationError, StoreError
from emelex_memory.core.migrations import Migration, applied, migrate

from ..support import table_rows

BASE = Migration("m001_toy", """
CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL) STRICT;
CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent (id) ON DELETE CASCADE) STRICT;
INSERT INTO parent VALUES (1, 'a'), (2, 'b');
INSERT INTO child VALUES (10, 1), (11, 2);
""")
REBUILD_SQL = """
CREATE TABLE parent_new (id INTEGER PRIMARY KEY, name TEXT NOT NULL, extra INTEGER NOT NULL DEFAULT 0) STRICT;
INSERT INTO parent_new (id, name) SELECT id, name FROM parent;
DROP TABLE parent;
ALTER TABLE parent_new RENAME TO parent;
"""


def _connect(db: Path) -> apsw.Connection:
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


@pytest.mark.parametrize("rebuilds", [True, False])
def test_rebuilding_a_referenced_table_keeps_its_children_only_with_foreign_keys_off(
    tmp_path: Path, rebuilds: bool
) -> None:
    conn = _connect(tmp_path / "toy.sqlite3")
    migrate(conn, (BASE, Migration("m002_rebuild", REBUILD_SQL, rebuilds_tables=rebuilds)))
    children = conn.execute("SELECT id, parent_id FROM child ORDER BY id").fetchall()
    assert children == ([(10, 1), (11, 2)] if rebuilds else [])  # without the flag, DROP TABLE cascades
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    conn.close()


def test_a_broken_reference_stops_the_rebuild_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "toy.sqlite3"
    conn = _connect(db)
    migrate(conn, (BASE,))
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("INSERT INTO child VALUES (12, 99)")  # references no parent
    conn.execute("PRAGMA foreign_keys = ON")
    before = table_rows(db)
    with pytest.raises(ForeignKeyViolationError, match=r"child row 12 -> parent\); nothing was changed"):
        migrate(conn, (BASE, Migration("m002_rebuild", REBUILD_SQL, rebuilds_tables=True)))
    assert applied(conn) == ["m001_toy"] and conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    conn.close()
    assert table_rows(db) == before


def test_a_rebuild_inside_an_open_transaction_is_refused(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "toy.sqlite3")
    migrate(conn, (BASE,))
    with conn:  # foreign keys cannot be switched off in here, so the rebuild must not run
        with pytest.raises(StoreError, match="must run outside a transaction"):
            migrate(conn, (BASE, Migration("m002_rebuild", REBUILD_SQL, rebuilds_tables=True)))
    assert conn.execute("SELECT count(*) FROM child").fetchone()[0] == 2
    conn.close()
