"""Importing another agent's history: one run of a source becomes events of one Session, in one transaction.

A run is the lines of a source not imported before. The first run of a source creates its Session in the workspace
it was recorded in; a later run (the file grew) appends to the same Session. Each run records where it came from (an
`imports` row: format, source key, path, line range, the digest of the source through its last line, the events it
wrote), so the importer can tell an unchanged source (nothing to do), a grown one (read on from `byte_end`) and a
rewritten one (refused). Inside the transaction the run re-checks that the newest recorded run is the one the
importer planned from, so two importers of one file cannot both append it; a Session that is leased or has an open
agent journal is not appended to. Distillation is queued in the same transaction, like a closed chat's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import apsw

from ..core.jsonbound import encode_canonical_text
from ..errors import ImportConflictError, InvalidEventError, LeaseHeldError, OpenJournalError
from ..sessions.holders import live_holder, open_journal
from ..sessions.identity import WorkspaceIdentity, not_the_workspace
from ..sessions.transcript import SUMMARY_KIND, session_head
from ..sessions.workspaces import WORKSPACE_COLUMNS, identity_of, register_workspace, settle_workspace
from ..core.settings import Settings
from ..sessions.writing import insert_rows
from .records import ImportedEvent, ImportRecord, ImportSource

RECORD_COLUMNS = (
    "s.uuid, i.format, i.source_key, i.path, i.first_line, i.last_line, i.byte_end, i.prefix_digest, i.first_seq, "
    "i.last_seq, i.skipped, i.cut, i.imported_at"
)
_LATEST = (
    f"SELECT {RECORD_COLUMNS} FROM imports i JOIN sessions s ON s.id = i.session_id "
    "WHERE i.format = ? AND i.source_key = ? ORDER BY i.last_line DESC, i.id DESC LIMIT 1"
)


def latest_import(conn: apsw.Connection, format: str, key: str) -> ImportRecord | None:
    """The newest committed run of source (`format`, `key`), or None when it was never imported (or its Session was
    deleted since)."""
    row = conn.execute(_LATEST, (format, key)).fetchone()
    return None if row is None else ImportRecord(*row)


def _check_kind(kind: object) -> str:
    if not isinstance(kind, str) or not kind.isidentifier() or not kind.islower() or not 1 <= len(kind) <= 32:
        raise InvalidEventError(f"an imported event has kind {kind!r}; kinds are lowercase identifiers of 1-32 chars")
    if kind == SUMMARY_KIND:
        raise InvalidEventError("an imported history cannot hold Summary events; they are the compaction worker's")
    return kind


def _session_for(
    conn: apsw.Connection, found: WorkspaceIdentity, latest: ImportRecord | None, title: str | None, first_at: float,
    now: float, new_workspace: bool,
) -> tuple[int, str, bool]:
    """(rowid, Session ID, created) of the Session this run goes into, checking the workspace and that the Session
    is not in use."""
    if latest is None:
        workspace_id, _ = register_workspace(conn, found, now, new_workspace=new_workspace)
        session_id = str(uuid.uuid4())
        rowid = conn.execute(
            "INSERT INTO sessions (uuid, title, workspace_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
            "RETURNING id",
            (session_id, title, workspace_id, first_at, now),
        ).fetchone()[0]
        return rowid, session_id, True
    rowid = conn.execute("SELECT id FROM sessions WHERE uuid = ?", (latest.session_id,)).fetchone()[0]
    row = conn.execute(
        f"SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE id = (SELECT workspace_id FROM sessions WHERE id = ?)",
        (rowid,),
    ).fetchone()
    if not found.same_directory(identity_of(row)):
        raise not_the_workspace(found.path, latest.session_id, row[0], identity_of(row))
    settle_workspace(conn, row, found)
    held = live_holder(conn, rowid, now)
    if held:
        raise LeaseHeldError(
            f"Session {latest.session_id} (imported from {latest.path}) is leased by {held[0]}; nothing was imported: "
            "import again once it is released"
        )
    if conn.execute(f"SELECT {open_journal('?')}", (rowid,)).fetchone()[0]:
        raise OpenJournalError(
            f"Session {latest.session_id} (imported from {latest.path}) has an open agent turn; nothing was imported: "
            f"run `emelex memory sessions recover {latest.session_id}` first"
        )
    return rowid, latest.session_id, False


def write_run(
    conn: apsw.Connection,
    settings: Settings,
    found: WorkspaceIdentity,
    source: ImportSource,
    planned_from: ImportRecord | None,
    events: Iterable[ImportedEvent],
    *,
    title: str | None,
    now: float,
    new_workspace: bool = False,
) -> tuple[ImportRecord, bool]:
    """Inside a write transaction: append the run's `events` (consumed as they come, so a long history is never
    held whole) to the source's Session, creating it on the first run, and record the run; return the record and
    whether the Session was created.

    Raises `ImportConflictError` when the newest recorded run of the source is not `planned_from` (another import
    ran meanwhile), and the workspace and lease errors of `_session_for`; an event whose payload is not JSON within
    `max_event_bytes` raises `InvalidEventError` (the caller cuts large texts first). The caller's transaction then
    rolls back and nothing is written.
    """
    latest = latest_import(conn, source.format, source.key)
    if latest != planned_from:
        raise ImportConflictError(
            f"{source.path} was imported by another run meanwhile (or its Session was deleted); nothing was imported "
            "by this one: import it again"
        )
    if planned_from is not None and source.first_line != planned_from.last_line + 1:
        raise ImportConflictError(
            f"this run of {source.path} starts at line {source.first_line}, not after line {planned_from.last_line} "
            "where the last one ended; nothing was imported"
        )
    iterator = iter(events)
    first = next(iterator, None)
    rowid, session_id, created = _session_for(
        conn, found, latest, title, first.created_at if first is not None else now, now, new_workspace
    )
    seq, turn, byte_end, media_end = session_head(conn, rowid)
    position = -1
    if seq:
        position = conn.execute("SELECT position FROM events WHERE session_id = ? AND seq = ?", (rowid, seq)).fetchone()[0]
    first_seq = seq + 1
    batch: list[tuple[Any, ...]] = []
    for event in _chain(first, iterator):
        kind = _check_kind(event.kind)
        text, size = encode_canonical_text(
            event.payload, max_bytes=settings.max_event_bytes, max_depth=settings.max_json_depth,
            what=f"the imported {kind} event"
        )
        seq += 1
        if event.new_turn or turn == 0:
            turn, position = turn + 1, 0
        else:
            position += 1
        byte_end += size
        batch.append((rowid, seq, turn, position, kind, text, size, byte_end, media_end, float(event.created_at)))
        if len(batch) >= 256:
            insert_rows(conn, batch)
            batch.clear()
    if batch:
        insert_rows(conn, batch)
    last_seq = seq if seq >= first_seq else None
    record = ImportRecord(
        session_id, source.format, source.key, source.path, source.first_line, source.last_line, source.byte_end,
        source.prefix_digest, first_seq if last_seq is not None else None, last_seq, source.skipped, source.cut, now,
    )
    conn.execute(
        "INSERT INTO imports (session_id, format, source_key, path, first_line, last_line, byte_end, prefix_digest, "
        "first_seq, last_seq, skipped, cut, imported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (rowid, record.format, record.key, record.path, record.first_line, record.last_line, record.byte_end,
         record.prefix_digest, record.first_seq, record.last_seq, record.skipped, record.cut, now),
    )
    conn.execute("UPDATE sessions SET updated_at = max(updated_at, ?) WHERE id = ?", (now, rowid))
    return record, created


def _chain(first: ImportedEvent | None, rest: Iterable[ImportedEvent]) -> Iterable[ImportedEvent]:
    if first is not None:
        yield first
        yield from rest
