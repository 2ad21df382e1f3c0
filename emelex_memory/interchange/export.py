"""Reading the store out for an export: every record of one consistent snapshot, streamed.

`export_records` runs in one read transaction (a WAL snapshot: writers in other processes go on, unseen), reading rows
a page at a time, so an export of any size holds one page and one Session's Summary records and import runs in
memory. Records come in the order an import reads them back: the assets events link, then each Session (its Summary
records and import runs with it) followed by its events, then each Knowledge entry with its versions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import apsw

from ..assets.refs import AssetRef
from ..core.database import Database
from ..core.producer import producer_from
from .history import RECORD_COLUMNS
from .records import ExportedEntry, ExportedEvent, ExportedSession, ExportedSummary, ExportedVersion, ImportRecord

PAGE = 500  # rows read per statement


@dataclass(frozen=True)
class ExportedAsset:
    """An asset that an exported event links: read its bytes with `store.open_asset(ref)`."""

    ref: AssetRef


@dataclass(frozen=True)
class ExportCounts:
    """How many records of each type the export holds (read first, for progress)."""

    assets: int
    sessions: int
    events: int
    entries: int
    versions: int


_SESSIONS = (
    "SELECT s.id, s.uuid, s.title, w.path, s.created_at, s.updated_at, "
    "(SELECT count(*) FROM events WHERE session_id = s.id), sn.snapshot, sn.digest, sn.created_at, "
    "(SELECT min(id) FROM events WHERE session_id = s.id), (SELECT max(id) FROM events WHERE session_id = s.id) "
    "FROM sessions s JOIN workspaces w ON w.id = s.workspace_id LEFT JOIN session_snapshots sn ON sn.session_id = s.id "
    "WHERE s.id > ? ORDER BY s.id LIMIT ?"
)
_SUMMARIES = (
    "SELECT e.seq, j.uuid, j.source_key, j.source, j.result, j.created_at, j.updated_at, j.finished_at, "
    "(SELECT seq FROM events WHERE id = m.base_event_id), m.through_seq, m.source_count, m.first_event_id, "
    "m.last_event_id, hex(m.source_digest), hex(m.summary_digest), m.model_ref, m.created_at, m.reverted_at, "
    "m.producer FROM summaries m JOIN events e ON e.id = m.event_id JOIN jobs j ON j.id = m.job_id "
    "WHERE m.session_id = ? ORDER BY e.seq"
)
_IMPORTS = (
    f"SELECT {RECORD_COLUMNS} FROM imports i JOIN sessions s ON s.id = i.session_id WHERE i.session_id = ? "
    "ORDER BY i.id"
)
_EVENTS = (
    "SELECT id, seq, turn, position, kind, payload, created_at, asset_refs FROM events WHERE session_id = ? AND seq > ? "
    "ORDER BY seq LIMIT ?"
)
_ENTRIES = (
    "SELECT k.id, w.path, k.key, k.pinned, k.tombstoned_at, k.created_at, k.updated_at FROM knowledge k "
    "JOIN workspaces w ON w.id = k.workspace_id WHERE k.id > ? ORDER BY k.id LIMIT ?"
)
_VERSIONS = (
    "SELECT version, content, confidence, origin, source_session_uuid, source_first_seq, source_last_seq, "
    "source_digest, created_at, client, said_at, producer FROM knowledge_versions WHERE knowledge_id = ? "
    "ORDER BY version"
)


def export_counts(conn: apsw.Connection) -> ExportCounts:
    """The record counts of an export of the store as `conn` sees it now."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM assets WHERE links > 0), (SELECT count(*) FROM sessions), "
        "(SELECT count(*) FROM events), (SELECT count(*) FROM knowledge k JOIN workspaces w ON w.id = k.workspace_id "
        "WHERE w.path IS NOT NULL), (SELECT count(*) FROM knowledge_versions)"
    ).fetchone()
    return ExportCounts(*row)


def _refs(text: str | None) -> tuple[AssetRef, ...]:
    return tuple(AssetRef(d, s, k) for d, s, k in json.loads(text)) if text else ()


def _summary(row: tuple) -> ExportedSummary:
    (seq, job_uuid, source_key, source, result, created, updated, finished, base_seq, through, count, first, last,
     src_digest, sum_digest, model_ref, made, reverted, producer) = row
    job = {"id": job_uuid, "source_key": source_key, "source": json.loads(source), "result": json.loads(result or "{}"),
           "created_at": created, "updated_at": updated, "finished_at": finished}
    return ExportedSummary(seq, job, base_seq, through, count, first, last, src_digest.lower(), sum_digest.lower(),
                           model_ref, made, reverted, producer_from(producer))


def _sessions(conn: apsw.Connection) -> Iterator[tuple[int, ExportedSession]]:
    after = 0
    while True:
        rows = conn.execute(_SESSIONS, (after, PAGE)).fetchall()
        for rowid, uuid, title, path, created, updated, count, snapshot, digest, snap_at, low, high in rows:
            summaries = tuple(_summary(r) for r in conn.execute(_SUMMARIES, (rowid,)))
            runs = tuple(ImportRecord(*r) for r in conn.execute(_IMPORTS, (rowid,)))
            snap = None if snapshot is None else {"snapshot": snapshot, "digest": digest, "created_at": snap_at}
            ids = None if low is None else (low, high)
            yield rowid, ExportedSession(uuid, title, path, created, updated, snap, count, summaries, ids, runs)
        if len(rows) < PAGE:
            return
        after = rows[-1][0]


def _events(conn: apsw.Connection, rowid: int) -> Iterator[ExportedEvent]:
    after = 0
    while True:
        rows = conn.execute(_EVENTS, (rowid, after, PAGE)).fetchall()
        for event_id, seq, turn, position, kind, payload, created, refs in rows:
            yield ExportedEvent(event_id, seq, turn, position, kind, payload, created, _refs(refs))
        if len(rows) < PAGE:
            return
        after = rows[-1][1]


def _entries(conn: apsw.Connection) -> Iterator[ExportedEntry]:
    after = 0
    while True:
        rows = conn.execute(_ENTRIES, (after, PAGE)).fetchall()
        for entry_id, path, key, pinned, tombstoned, created, updated in rows:
            if path is None:  # Knowledge of a workspace never seen at a path: nothing to name it by
                continue
            versions = tuple(
                ExportedVersion(v, content, conf, origin, None if s_uuid is None else (s_uuid, s_first, s_last, s_dig),
                                made, client, said, producer_from(producer))
                for v, content, conf, origin, s_uuid, s_first, s_last, s_dig, made, client, said, producer
                in conn.execute(_VERSIONS, (entry_id,))
            )
            yield ExportedEntry(path, key, bool(pinned), tombstoned, created, updated, versions)
        if len(rows) < PAGE:
            return
        after = rows[-1][0]


def export_records(db: Database) -> Iterator[ExportCounts | ExportedAsset | ExportedSession | ExportedEvent
                                              | ExportedEntry]:
    """Every record of an export of `db`, from one snapshot: first the `ExportCounts`, then each linked asset, each
    Session followed by its events, then each Knowledge entry. Consume it on the thread that started it (it holds the
    store's read lock and snapshot until it is exhausted or closed)."""
    with db.read() as conn:
        conn.execute("BEGIN DEFERRED")
        try:
            yield export_counts(conn)
            after = ("", "")
            while True:
                rows = conn.execute(
                    "SELECT digest, media_kind, size FROM assets WHERE links > 0 AND (digest, media_kind) > (?, ?) "
                    "ORDER BY digest, media_kind LIMIT ?", (*after, PAGE),
                ).fetchall()
                for digest, kind, size in rows:
                    yield ExportedAsset(AssetRef(digest, size, kind))
                if len(rows) < PAGE:
                    break
                after = rows[-1][:2]
            for rowid, session in _sessions(conn):
                yield session
                yield from _events(conn, rowid)
            yield from _entries(conn)
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")
