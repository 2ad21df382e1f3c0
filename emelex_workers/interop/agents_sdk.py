"""OpenAI Agents SDK `SQLiteSession` databases: tables `agent_sessions` (session_id, created_at, updated_at) and
`agent_messages` (id, session_id, message_data: one Responses item as JSON, created_at "YYYY-MM-DD HH:MM:SS" UTC).

Each `session_id` is a source of its own (key: the database's absolute path and the ID), read in row-ID order: its
"lines" are its rows, numbered 1, 2, 3, ..., and `byte_end` records the last row ID read. The database records no
workspace, so `--workspace` is required. A row popped or rewritten after its import (`pop_item`) changes the digest
of the rows already read: that Session is refused, as a rewritten file is.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import apsw

from emelex_memory import EmelexError, ImportedEvent, ImportSource, SourceRewrittenError, UnreadableSourceError

from .events import Conversion, ImportOptions, SourceResult, imported_result, require_workspace
from .responses import feed_item

if TYPE_CHECKING:
    from emelex_memory import MemoryStore

FORMAT = "agents-sdk"
PAGE = 500


def _open(path: str) -> apsw.Connection:
    try:
        conn = apsw.Connection(f"file:{path}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        conn.execute("SELECT 1 FROM agent_messages LIMIT 1").fetchall()
    except apsw.Error as exc:
        raise UnreadableSourceError(
            f"{path} is not an OpenAI Agents SDK session database with an agent_messages table ({exc}); name one a "
            "SQLiteSession wrote"
        ) from None
    return conn


def _rows(conn: apsw.Connection, session_id: str, after: int, through: int | None) -> Iterator[tuple]:
    while True:
        rows = conn.execute(
            "SELECT id, message_data, created_at FROM agent_messages WHERE session_id = ? AND id > ? "
            + ("AND id <= ? " if through is not None else "") + "ORDER BY id LIMIT ?",
            (session_id, after, *(() if through is None else (through,)), PAGE),
        ).fetchall()
        yield from rows
        if len(rows) < PAGE:
            return
        after = rows[-1][0]


def _frame(row: tuple) -> bytes:
    return f"{row[0]}\n{row[2]}\n".encode() + str(row[1]).encode("utf-8", "surrogatepass") + b"\n"


def _feed(conv: Conversion, row: tuple, number: int, path: str, skip_damaged: bool) -> list[ImportedEvent]:
    try:
        item = json.loads(row[1])
    except (TypeError, ValueError, RecursionError):
        if not skip_damaged:
            raise UnreadableSourceError(
                f"{path}: agent_messages row {row[0]} is not JSON; nothing of its Session was imported: pass "
                "--skip-damaged to import the rest"
            ) from None
        conv.skipped += 1
        return []
    events = feed_item(conv, item, conv.when(row[2]), number)
    if events is None:
        conv.skipped += 1
        return []
    return events


def import_session(store: MemoryStore, conn: apsw.Connection, path: str, session_id: str,
                   options: ImportOptions) -> SourceResult:
    """Import what is new in Session `session_id` of the database `conn` at `path`."""
    key = f"{path}#{session_id}"
    latest = store.latest_import(FORMAT, key)
    h = hashlib.sha256()
    conv = Conversion(store.settings.max_event_bytes, title=session_id)
    number, start = 0, 0
    if latest is not None:
        for row in _rows(conn, session_id, 0, latest.byte_end):
            number += 1
            h.update(_frame(row))
            _feed(conv, row, number, path, True)
        if number != latest.last_line or h.hexdigest() != latest.prefix_digest:
            raise SourceRewrittenError(
                f"{path}: Session {session_id!r} changed in rows an earlier import read (Session {latest.session_id}); "
                "delete that Session (`emelex memory sessions delete`) to import it anew"
            )
        start = latest.byte_end
    at_start, first = copy.deepcopy(conv), number + 1
    events, end = 0, start
    for row in _rows(conn, session_id, start, None):
        number += 1
        h.update(_frame(row))
        events += len(_feed(conv, row, number, path, options.skip_damaged))
        end = row[0]
    if number < first:
        return SourceResult(path, FORMAT, "unchanged", session_id=latest and latest.session_id)
    workspace = require_workspace(options.workspace, f"{path} (Session {session_id!r})", named=True)
    source = ImportSource(FORMAT, key, path, first, number, end, h.hexdigest(), conv.skipped - at_start.skipped,
                          conv.cut - at_start.cut)

    def convert() -> Iterator[ImportedEvent]:
        n = first - 1
        for row in _rows(conn, session_id, start, end):
            n += 1
            yield from _feed(at_start, row, n, path, options.skip_damaged)
        if n != number:
            raise SourceRewrittenError(f"{path}: Session {session_id!r} changed while it was being imported; nothing "
                                       "was imported: import it again")

    outcome = store.import_history(workspace, source, convert(), planned_from=latest, title=session_id[:512],
                                   new_workspace=options.new_workspace)
    return imported_result(path, FORMAT, outcome, source)


def import_database(store: MemoryStore, path: str, options: ImportOptions) -> list[SourceResult]:
    """Import every Session of the Agents SDK database at `path`, each on its own; a refused one is reported as
    such and the others go on."""
    path = os.path.abspath(path)
    conn = _open(path)
    try:
        ids = [r[0] for r in conn.execute("SELECT DISTINCT session_id FROM agent_messages ORDER BY session_id")]
        results = []
        for session_id in ids:
            try:
                results.append(import_session(store, conn, path, str(session_id), options))
            except EmelexError as exc:
                results.append(SourceResult(path, FORMAT, "refused", str(exc)))
        return results
    finally:
        conn.close()
