"""Versioned workspace Knowledge: `remember`, `recall`, `get_knowledge`, `knowledge_history`, `pin`, `unpin`, `forget`.

Scope is the known workspace (see `sessions/workspaces.py`) the caller's directory is,
never its path spelling, so Knowledge from one workspace is invisible from
another, and a new directory that reuses a deleted one's inode number is a
new workspace. A directory at the path where another known workspace was last
seen (a re-clone) is refused with `WorkspaceReplacedError` naming the rebind
command, not shown as empty. Every call checks the caller's current workspace identity
inside its transaction: a path that now names another directory, or an
identity from another workspace, writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import apsw

from ..core.cursors import check_position
from ..errors import (
    InvalidInputError,
    InvalidKnowledgeError,
    KnowledgeForgottenError,
    KnowledgeNotFoundError,
    KnowledgePinnedError,
    SessionNotFoundError,
)
from .source_digest import source_bytes, source_digest
from .values import (
    MAX_CONTENT_BYTES,
    MAX_KEY_BYTES,
    VERSION_COLUMNS,
    KnowledgeEntry,
    KnowledgeHistoryPage,
    KnowledgePage,
    KnowledgeSource,
    KnowledgeVersion,
    decode_cursor,
    encode_cursor,
    validate_confidence,
    validate_content,
    validate_key,
    validate_source,
    version_from_row,
)
from ..sessions.workspaces import WorkspaceLike, workspace_scope

if TYPE_CHECKING:
    from ..store import MemoryStore

Scope = int  # the ID of a known workspace
SourceColumns = tuple  # (session rowid, uuid, first seq, last seq, digest), all None without provenance
NO_SOURCE: SourceColumns = (None, None, None, None, None)
ROW_OVERHEAD = 256  # generous per-row byte estimate on top of key and content
MIN_PAGE_BYTES = MAX_KEY_BYTES + MAX_CONTENT_BYTES + ROW_OVERHEAD  # a page must fit one largest entry
_ENTRY_COLUMNS = f"k.id, k.key, k.pinned, k.created_at, k.updated_at, {VERSION_COLUMNS}"
_ENTRY_JOIN = "FROM knowledge k JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version = k.head_version"


def entry_from_row(row: tuple) -> KnowledgeEntry:
    """Build a `KnowledgeEntry` from a row selected with `_ENTRY_COLUMNS`."""
    _, key, pinned, created, updated = row[:5]
    return KnowledgeEntry(key, bool(pinned), version_from_row(key, row[5:]), created, updated)


class KnowledgeMixin:
    """`MemoryStore` methods for versioned workspace Knowledge."""

    # -- mutations --------------------------------------------------------------------

    def remember(
        self: MemoryStore,
        workspace: WorkspaceLike,
        key: str,
        content: str,
        *,
        confidence: float = 1.0,
        source: KnowledgeSource | None = None,
        new_workspace: bool = False,
    ) -> KnowledgeVersion:
        """Upsert `key` in the caller's workspace by appending an immutable version; return the newest version.

        A directory that is no known workspace yet becomes one, except when
        another known workspace was last seen at its path (a re-clone, say):
        that raises `WorkspaceReplacedError` naming the rebind command, unless
        `new_workspace` says the directory is a new, unrelated workspace.

        `confidence` is in [0, 1]. Optional `source` provenance must name a
        Session of the same workspace, a seq range within its transcript and
        that range's `source_digest`; it is verified inside the transaction.
        Remembering exactly the current content, confidence and source appends
        nothing. A tombstoned key is revived by a new version.
        """
        key, content = validate_key(key), validate_content(content)
        confidence, source = validate_confidence(confidence), validate_source(source)
        with self._write() as conn:
            scope = workspace_scope(conn, workspace, write=True, create_at=self.clock(), new_workspace=new_workspace)
            src = self._source_columns(conn, source, scope)
            return self._upsert_version(conn, scope, key, content, confidence, "user", src)

    def forget(self: MemoryStore, workspace: WorkspaceLike, key: str) -> KnowledgeVersion:
        """Tombstone `key` in the caller's workspace; return the tombstone version.

        The tombstone keeps the retired version's confidence and provenance;
        recall no longer shows the entry and `maintain` deletes it after the
        grace period. Raises `KnowledgePinnedError` for a pinned entry and
        `KnowledgeNotFoundError` when the key is unknown here. Forgetting a
        tombstoned entry changes nothing.
        """
        key = validate_key(key)
        with self._write() as conn:
            row = self._entry_row(conn, workspace_scope(conn, workspace, write=True), key)
            if row[3]:
                raise KnowledgePinnedError(
                    f"Knowledge {key!r} is pinned; unpin it (`emelex memory knowledge unpin`) before forgetting it"
                )
            return self._tombstone_version(conn, row, key, "user")

    def pin(self: MemoryStore, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Pin `key`: automatic distillation and retention will neither change, tombstone nor delete it.

        Raises `KnowledgeNotFoundError` when the key is unknown here and
        `KnowledgeForgottenError` when the entry is a tombstone (remember it again first).
        """
        return self._set_pin(workspace, key, True)

    def unpin(self: MemoryStore, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Remove the pin from `key`, making it subject to distillation and retention again."""
        return self._set_pin(workspace, key, False)

    def _set_pin(self: MemoryStore, workspace: WorkspaceLike, key: str, pinned: bool) -> KnowledgeEntry:
        key = validate_key(key)
        with self._write() as conn:
            row = self._entry_row(conn, workspace_scope(conn, workspace, write=True), key)
            if row[2] is not None and pinned:
                raise KnowledgeForgottenError(f"Knowledge {key!r} is forgotten; remember it again before pinning it")
            conn.execute("UPDATE knowledge SET pinned = ? WHERE id = ?", (int(pinned), row[0]))
            return self._entry_by_id(conn, row[0])

    # -- reads ------------------------------------------------------------------------

    def recall(
        self: MemoryStore,
        workspace: WorkspaceLike,
        *,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
        include_tombstones: bool = False,
    ) -> KnowledgePage:
        """Page through the workspace's Knowledge by key with a stable `(key, id)` cursor, bounded in items and bytes.

        Tombstoned entries are excluded unless `include_tombstones`.
        `max_bytes` must fit at least one largest entry.
        """
        limit, max_bytes = self._page_limits(limit, max_bytes, min_bytes=MIN_PAGE_BYTES)
        where, params = "", ()
        if cursor is not None:
            if not isinstance(cursor, str):
                raise InvalidInputError("a Knowledge cursor must be a string from a previous page")
            where, params = "AND (k.key, k.id) > (?, ?)", decode_cursor(cursor)
        live = "" if include_tombstones else "AND k.tombstoned_at IS NULL"
        with self._read() as conn:
            scope = workspace_scope(conn, workspace)
            if scope is None:
                return KnowledgePage([], None)
            rows = conn.execute(
                f"SELECT {_ENTRY_COLUMNS} {_ENTRY_JOIN} WHERE k.workspace_id = ? {live} "
                f"{where} ORDER BY k.key, k.id LIMIT ?",
                (scope, *params, limit + 1),
            ).fetchall()
        entries, total, last = [], 0, None
        for row in rows[:limit]:
            total += row[-1] + ROW_OVERHEAD
            if total > max_bytes:
                break
            entries.append(entry_from_row(row))
            last = row
        more = len(entries) < len(rows)
        return KnowledgePage(entries, encode_cursor(last[1], last[0]) if more and last else None)

    def get_knowledge(self: MemoryStore, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Return one entry of the workspace, tombstoned or not; raise `KnowledgeNotFoundError` if there is none."""
        key = validate_key(key)
        with self._read() as conn:
            row = self._entry_row(conn, workspace_scope(conn, workspace), key)
            return self._entry_by_id(conn, row[0])

    def knowledge_history(
        self: MemoryStore,
        workspace: WorkspaceLike,
        key: str,
        after_version: int = 0,
        *,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> KnowledgeHistoryPage:
        """Read the versions of one entry after `after_version` (exclusive), oldest first, bounded in items and bytes.

        Versions older than the retention limits may have been pruned by
        `maintain`, so the first version returned can be later than 1.
        """
        limit, max_bytes = self._page_limits(limit, max_bytes, min_bytes=MIN_PAGE_BYTES)
        check_position(after_version, "after_version")
        key = validate_key(key)
        with self._read() as conn:
            entry_id = self._entry_row(conn, workspace_scope(conn, workspace), key)[0]
            rows = conn.execute(
                f"SELECT {VERSION_COLUMNS} FROM knowledge_versions v WHERE v.knowledge_id = ? AND v.version > ? "
                "ORDER BY v.version LIMIT ?",
                (entry_id, after_version, limit + 1),
            ).fetchall()
        versions, total = [], 0
        for row in rows[:limit]:
            total += row[-1] + ROW_OVERHEAD
            if total > max_bytes:
                break
            versions.append(version_from_row(key, row))
        done = len(versions) == len(rows)
        return KnowledgeHistoryPage(versions, versions[-1].version if versions else after_version, done)

    def knowledge_source(self: MemoryStore, session_id: str, first_seq: int, last_seq: int) -> KnowledgeSource:
        """Build provenance for events `first_seq..last_seq` of a Session by computing their source digest.

        The range must exist and hold at most `knowledge_source_max_bytes`;
        raises `InvalidKnowledgeError` otherwise.
        """
        probe = validate_source(KnowledgeSource(session_id, first_seq, last_seq, "0" * 64))
        with self._read() as conn:
            rowid = self._session_rowid(conn, session_id)
            self._check_source_size(conn, rowid, probe)
            digest = source_digest(conn, rowid, session_id, first_seq, last_seq)
        if digest is None:
            raise InvalidKnowledgeError(
                f"Session {session_id} has no events {first_seq}..{last_seq}; cite events it has"
            )
        return KnowledgeSource(session_id, first_seq, last_seq, digest)

    # -- internals shared with distillation and maintain ------------------------------------------

    def _entry_row(self: MemoryStore, conn: apsw.Connection, scope: Scope | None, key: str) -> tuple:
        """`(id, head_version, tombstoned_at, pinned)` of `key` in `scope`, or raise `KnowledgeNotFoundError`
        (also when `scope` is None: the directory is no known workspace)."""
        row = conn.execute(
            "SELECT id, head_version, tombstoned_at, pinned FROM knowledge WHERE workspace_id = ? AND key = ?",
            (scope, key),
        ).fetchone()
        if row is None:
            raise KnowledgeNotFoundError(
                f"no Knowledge {key!r} in this workspace; list it with `emelex memory knowledge list`"
            )
        return row

    def _entry_by_id(self: MemoryStore, conn: apsw.Connection, entry_id: int) -> KnowledgeEntry:
        row = conn.execute(f"SELECT {_ENTRY_COLUMNS} {_ENTRY_JOIN} WHERE k.id = ?", (entry_id,)).fetchone()
        return entry_from_row(row)

    def _source_columns(
        self: MemoryStore, conn: apsw.Connection, source: KnowledgeSource | None, scope: Scope
    ) -> SourceColumns:
        """Inside a transaction: verify provenance against the transcript; return the columns to store."""
        if source is None:
            return NO_SOURCE
        row = conn.execute(
            "SELECT id, workspace_id, last_seq FROM session_heads WHERE uuid = ?", (source.session_id,)
        ).fetchone()
        if row is None:
            raise SessionNotFoundError(f"provenance names Session {source.session_id!r}, which does not exist")
        rowid, workspace_id, last_seq = row
        if workspace_id != scope:
            raise InvalidKnowledgeError(f"provenance Session {source.session_id} belongs to another workspace")
        if source.last_seq > last_seq:
            raise InvalidKnowledgeError(
                f"provenance range ends at seq {source.last_seq} but Session {source.session_id} ends at {last_seq}"
            )
        self._check_source_size(conn, rowid, source)
        digest = source_digest(conn, rowid, source.session_id, source.first_seq, source.last_seq)
        if digest != source.digest:
            raise InvalidKnowledgeError(
                f"provenance digest does not match events {source.first_seq}..{source.last_seq} of Session "
                f"{source.session_id}; recompute it with source_digest"
            )
        return (rowid, source.session_id, source.first_seq, source.last_seq, source.digest)

    def _check_source_size(self: MemoryStore, conn: apsw.Connection, rowid: int, source: KnowledgeSource) -> None:
        size = source_bytes(conn, rowid, source.first_seq, source.last_seq)
        if size > self.settings.knowledge_source_max_bytes:
            raise InvalidKnowledgeError(
                f"events {source.first_seq}..{source.last_seq} of Session {source.session_id} hold {size} bytes, "
                "over knowledge_source_max_bytes; cite a narrower range"
            )

    def _upsert_version(
        self: MemoryStore,
        conn: apsw.Connection,
        scope: Scope,
        key: str,
        content: str,
        confidence: float,
        origin: str,
        src: SourceColumns,
    ) -> KnowledgeVersion:
        """Inside a transaction: append an upsert version unless it would repeat the live head; return the head."""
        now = self.clock()
        row = conn.execute(
            "SELECT k.id, k.head_version, v.tombstone, v.content, v.confidence, v.source_session_uuid, "
            "v.source_first_seq, v.source_last_seq, v.source_digest "
            f"{_ENTRY_JOIN} WHERE k.workspace_id = ? AND k.key = ?",
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
                return self._version(conn, entry_id, key, head)
            version = head + 1
            conn.execute(
                "UPDATE knowledge SET head_version = ?, tombstoned_at = NULL, updated_at = ? WHERE id = ?",
                (version, now, entry_id),
            )
        size = len(key.encode("utf-8")) + len(content.encode("utf-8"))
        self._insert_version(conn, entry_id, version, content, size, confidence, origin, src, now)
        return self._version(conn, entry_id, key, version)

    def _tombstone_version(
        self: MemoryStore, conn: apsw.Connection, row: tuple, key: str, origin: str
    ) -> KnowledgeVersion:
        """Inside a transaction: tombstone the entry `row` (from `_entry_row`), keeping its confidence and source."""
        entry_id, head, tombstoned_at, _pinned = row
        if tombstoned_at is not None:
            return self._version(conn, entry_id, key, head)
        now = self.clock()
        confidence, *src = conn.execute(
            "SELECT confidence, source_session_id, source_session_uuid, source_first_seq, source_last_seq, "
            "source_digest FROM knowledge_versions WHERE knowledge_id = ? AND version = ?",
            (entry_id, head),
        ).fetchone()
        conn.execute(
            "UPDATE knowledge SET head_version = ?, tombstoned_at = ?, updated_at = ? WHERE id = ?",
            (head + 1, now, now, entry_id),
        )
        self._insert_version(conn, entry_id, head + 1, None, len(key.encode("utf-8")), confidence, origin, src, now)
        return self._version(conn, entry_id, key, head + 1)

    @staticmethod
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
    ) -> None:
        conn.execute(
            "INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, origin, "
            "source_session_id, source_session_uuid, source_first_seq, source_last_seq, source_digest, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entry_id, version, int(content is None), content, size, confidence, origin, *src, now),
        )

    @staticmethod
    def _version(conn: apsw.Connection, entry_id: int, key: str, version: int) -> KnowledgeVersion:
        row = conn.execute(
            f"SELECT {VERSION_COLUMNS} FROM knowledge_versions v WHERE v.knowledge_id = ? AND v.version = ?",
            (entry_id, version),
        ).fetchone()
        return version_from_row(key, row)
