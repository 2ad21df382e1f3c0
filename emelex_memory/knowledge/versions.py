"""Appending Knowledge versions inside a caller's transaction: what `remember`, `forget`, distillation and
retention all write through."""

from __future__ import annotations

import apsw

from .values import VERSION_COLUMNS, KnowledgeVersion, version_from_row

Scope = int  # the ID of a known workspace
SourceColumns = tuple  # (session rowid, uuid, first seq, last seq, digest), all None without provenance
NO_SOURCE: SourceColumns = (None, None, None, None, None)
ENTRY_JOIN = "FROM knowledge k JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version = k.head_version"


def upsert_version(
    conn: apsw.Connection,
    scope: Scope,
    key: str,
    content: str,
    confidence: float,
    origin: str,
    src: SourceColumns,
    now: float,
    said_at: float | None = None,
    client: str | None = None,
    producer: str | None = None,
) -> KnowledgeVersion:
    """Inside a transaction: append an upsert version at `now` unless it would repeat the live head; return the head.

    `said_at` is when its statement was said (None: the last event of the provenance range `src`, else `now`);
    `client` names the program that wrote it (an MCP client), None for Emelex's own callers; `producer` (stored
    JSON, `emelex_memory.core.producer`) the plugin whose distiller proposed it."""
    row = conn.execute(
        "SELECT k.id, k.head_version, v.tombstone, v.content, v.confidence, v.source_session_uuid, "
        "v.source_first_seq, v.source_last_seq, v.source_digest "
        f"{ENTRY_JOIN} WHERE k.workspace_id = ? AND k.key = ?",
        (scope, key),
    ).fetchone()
    if row is None:
        entry_id = conn.execute(
            "INSERT INTO knowledge (workspace_id, key, head_version, created_at, updated_at) "
            "VALUES (?, ?, 1, ?, ?) RETURNING id",
            (scope, key, now, now),
        ).fetchone()[0]
        version = 1
    else:
        entry_id, head = row[0], row[1]
        if not row[2] and (row[3], row[4], *row[5:]) == (content, confidence, *src[1:]):
            return version_at(conn, entry_id, key, head)
        version = head + 1
        conn.execute(
            "UPDATE knowledge SET head_version = ?, tombstoned_at = NULL, updated_at = ? WHERE id = ?",
            (version, now, entry_id),
        )
    size = len(key.encode("utf-8")) + len(content.encode("utf-8"))
    said = said_at if said_at is not None else source_time(conn, src, now)
    _insert_version(conn, entry_id, version, content, size, confidence, origin, src, now, said, client, producer)
    return version_at(conn, entry_id, key, version)


def tombstone_version(
    conn: apsw.Connection, row: tuple, key: str, origin: str, now: float, client: str | None = None,
    producer: str | None = None,
) -> KnowledgeVersion:
    """Inside a transaction: tombstone the entry `row` (id, head version, tombstoned_at, pinned) at `now`, keeping its
    confidence and source; `client` and `producer` as for `upsert_version`."""
    entry_id, head, tombstoned_at, _pinned = row
    if tombstoned_at is not None:
        return version_at(conn, entry_id, key, head)
    confidence, said, *src = conn.execute(
        "SELECT confidence, said_at, source_session_id, source_session_uuid, source_first_seq, source_last_seq, "
        "source_digest FROM knowledge_versions WHERE knowledge_id = ? AND version = ?",
        (entry_id, head),
    ).fetchone()
    conn.execute(
        "UPDATE knowledge SET head_version = ?, tombstoned_at = ?, updated_at = ? WHERE id = ?",
        (head + 1, now, now, entry_id),
    )
    _insert_version(conn, entry_id, head + 1, None, len(key.encode("utf-8")), confidence, origin, src, now, said,
                    client, producer)
    return version_at(conn, entry_id, key, head + 1)


def _insert_version(
    conn: apsw.Connection,
    entry_id: int,
    version: int,
    content: str | None,
    size: int,
    confidence: float,
    origin: str,
    src: SourceColumns,
    now: float,
    said_at: float,
    client: str | None = None,
    producer: str | None = None,
) -> None:
    conn.execute(
        "INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, origin, "
        "source_session_id, source_session_uuid, source_first_seq, source_last_seq, source_digest, created_at, "
        "said_at, client, producer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (entry_id, version, int(content is None), content, size, confidence, origin, *src, now, said_at, client,
         producer),
    )


def source_time(conn: apsw.Connection, src: SourceColumns, now: float) -> float:
    """When the provenance `src` was said: the time of its last event (`now` without provenance)."""
    if src[0] is None:
        return now
    row = conn.execute("SELECT created_at FROM events WHERE session_id = ? AND seq = ?", (src[0], src[3])).fetchone()
    return now if row is None else row[0]


def event_times(conn: apsw.Connection, src: SourceColumns) -> tuple[float, float] | None:
    """The times of the first and the last event of the provenance `src` (None without provenance)."""
    if src[0] is None:
        return None
    row = conn.execute("SELECT min(created_at), max(created_at) FROM events WHERE session_id = ? AND seq BETWEEN ? "
                       "AND ?", (src[0], src[2], src[3])).fetchone()
    return None if row[0] is None else (row[0], row[1])


def version_at(conn: apsw.Connection, entry_id: int, key: str, version: int) -> KnowledgeVersion:
    row = conn.execute(
        f"SELECT {VERSION_COLUMNS} FROM knowledge_versions v WHERE v.knowledge_id = ? AND v.version = ?",
        (entry_id, version),
    ).fetchone()
    return version_from_row(key, row)
