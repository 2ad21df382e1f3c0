"""Counting what a piece of work asks of the database: its write transactions, its reads and its SQL statements.

`Counted(store)` wraps the store's `Database` for the duration of a `with` block: every `db.write()` that is not
nested in another is one write transaction (`BEGIN IMMEDIATE`), every outermost `db.read()` one read (the lock held
around one or more statements, in one read transaction when the reader began one), and every statement the
connection runs is counted through its exec tracer (savepoints and transaction control included). Nothing else of
the store changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emelex_memory import MemoryStore


@dataclass
class Counts:
    """What one piece of work asked of the database."""

    writes: int = 0  # outermost write transactions
    reads: int = 0  # outermost read accesses (outside any write)
    statements: int = 0  # SQL statements run, transaction control included
    sql: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.writes} write transactions, {self.reads} reads, {self.statements} statements"


class _Counting:
    """A stand-in for one of the `Database`'s context managers that counts the outermost entries."""

    def __init__(self, inner: Any, counted: Counted, kind: str) -> None:
        self._inner, self._counted, self._kind = inner, counted, kind

    def __enter__(self) -> Any:
        counted = self._counted
        if counted.depth == 0:
            setattr(counted.counts, self._kind, getattr(counted.counts, self._kind) + 1)
        counted.depth += 1
        try:
            return self._inner.__enter__()
        except BaseException:
            counted.depth -= 1
            raise

    def __exit__(self, *exc: Any) -> Any:
        self._counted.depth -= 1
        return self._inner.__exit__(*exc)


class Counted:
    """`with Counted(store) as counts:` counts the work inside the block (`counts` is a `Counts`)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.counts = Counts()
        self.depth = 0

    def __enter__(self) -> Counts:
        db = self.store.db
        reader, writer = db.read(), db.write()
        db.read = lambda: _Counting(reader, self, "reads")  # type: ignore[method-assign]
        db.write = lambda: _Counting(writer, self, "writes")  # type: ignore[method-assign]
        self._previous_trace = db.conn.exec_trace

        def trace(_cursor: Any, sql: str, _bindings: Any) -> bool:
            self.counts.statements += 1
            self.counts.sql.append(sql)
            return True

        db.conn.exec_trace = trace
        return self.counts

    def __exit__(self, *exc: Any) -> None:
        db = self.store.db
        del db.read, db.write  # the class's methods again
        db.conn.exec_trace = self._previous_trace
