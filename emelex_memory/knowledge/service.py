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


import apsw

from ..core.cursors import check_position
from ..core.paging import take
from ..errors import (
    InvalidInputError,
    InvalidKnowledgeError,
    KnowledgeForgottenError,
    KnowledgeNotFoundError,
    KnowledgePinnedError,
    SessionNotFoundError,
)
from .source_digest import source_digest
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
    validate_client,
    validate_source,
    version_from_row,
)
from ..sessions.workspaces import WorkspaceLike, workspace_scope

from ..core.database import Database
from ..sessions.rows import range_bytes, session_rowid
from .versions import ENTRY_JOIN, NO_SOURCE, Scope, SourceColumns, tombstone_version, upsert_version

ROW_OVERHEAD = 256  # generous per-row byte estimate on top of key and content
MIN_PAGE_BYTES = MAX_KEY_BYTES + MAX_CONTENT_BYTES + ROW_OVERHEAD  # a page must fit one largest entry
ENTRY_COLUMNS = f"k.id, k.key, k.pinned, k.created_at, k.updated_at, {VERSION_COLUMNS}"
def entry_from_row(row: tuple) -> KnowledgeEntry:
    """Build a `KnowledgeEntry` from a row selected with `ENTRY_COLUMNS`."""
    _, key, pinned, created, updated = row[:5]
    return KnowledgeEntry(key, bool(pinned), version_from_row(key, row[5:]), created, updated)


def _row_size(row: tuple) -> int:
    """The byte estimate of an entry or version row (its `size` column is last) in a page."""
    return row[-1] + ROW_OVERHEAD


class Knowledge:
    """`MemoryStore` methods for versioned workspace Knowledge."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    # -- mutations --------------------------------------------------------------------

    def remember(
        self,
        workspace: WorkspaceLike,
        key: str,
        content: str,
        *,
        confidence: float = 1.0,
        source: KnowledgeSource | None = None,
        new_workspace: bool = False,
        client: str | None = None,
        unless_pinned: bool = False,
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
        nothing. A tombstoned key is revived by a new version. `client` names
        the program that asked (an MCP client, "name version"), kept on the
        version; None for Emelex's own callers. With `unless_pinned` (a writer
        that leaves pinned entries to the user) a pinned entry raises
        `KnowledgePinnedError`, checked inside the writing transaction.
        """
        key, content = validate_key(key), validate_content(content)
        confidence, source = validate_confidence(confidence), validate_source(source)
        client = validate_client(client)
        with self._db.write() as conn:
            scope = workspace_scope(conn, workspace, write=True, create_at=self._db.clock(), new_workspace=new_workspace)
            src = self._source_columns(conn, source, scope)
            if unless_pinned and conn.execute("SELECT pinned FROM knowledge WHERE workspace_id = ? AND key = ?",
                                              (scope, key)).fetchone() == (1,):
                raise KnowledgePinnedError(
                    f"Knowledge {key!r} is pinned: the user changes it (`emelex memory knowledge unpin` first)"
                )
            return upsert_version(conn, scope, key, content, confidence, "user", src, self._db.clock(), client)

    def forget(self, workspace: WorkspaceLike, key: str, *, client: str | None = None) -> KnowledgeVersion:
        """Tombstone `key` in the caller's workspace; return the tombstone version.

        The tombstone keeps the retired version's confidence and provenance;
        recall no longer shows the entry and `maintain` deletes it after the
        grace period. Raises `KnowledgePinnedError` for a pinned entry and
        `KnowledgeNotFoundError` when the key is unknown here. Forgetting a
        tombstoned entry changes nothing. `client` as for `remember`.
        """
        key, client = validate_key(key), validate_client(client)
        with self._db.write() as conn:
            row = self._entry_row(conn, workspace_scope(conn, workspace, write=True), key)
            if row[3]:
                raise KnowledgePinnedError(
                    f"Knowledge {key!r} is pinned; unpin it (`emelex memory knowledge unpin`) before forgetting it"
                )
            return tombstone_version(conn, row, key, "user", self._db.clock(), client)

    def pin(self, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Pin `key`: automatic distillation and retention will neither change, tombstone nor delete it.

        Raises `KnowledgeNotFoundError` when the key is unknown here and
        `KnowledgeForgottenError` when the entry is a tombstone (remember it again first).
        """
        return self._set_pin(workspace, key, True)

    def unpin(self, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Remove the pin from `key`, making it subject to distillation and retention again."""
        return self._set_pin(workspace, key, False)

    def _set_pin(self, workspace: WorkspaceLike, key: str, pinned: bool) -> KnowledgeEntry:
        key = validate_key(key)
        with self._db.write() as conn:
            row = self._entry_row(conn, workspace_scope(conn, workspace, write=True), key)
            if row[2] is not None and pinned:
                raise KnowledgeForgottenError(f"Knowledge {key!r} is forgotten; remember it again before pinning it")
            conn.execute("UPDATE knowledge SET pinned = ? WHERE id = ?", (int(pinned), row[0]))
            return self._entry_by_id(conn, row[0])

    # -- reads ------------------------------------------------------------------------

    def recall(
        self,
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
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MIN_PAGE_BYTES)
        where, params = "", ()
        if cursor is not None:
            if not isinstance(cursor, str):
                raise InvalidInputError("a Knowledge cursor must be a string from a previous page")
            where, params = "AND (k.key, k.id) > (?, ?)", decode_cursor(cursor)
        live = "" if include_tombstones else "AND k.tombstoned_at IS NULL"
        with self._db.read() as conn:
            scope = workspace_scope(conn, workspace)
            if scope is None:
                return KnowledgePage([], None)
            rows = conn.execute(
                f"SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE k.workspace_id = ? {live} "
                f"{where} ORDER BY k.key, k.id LIMIT ?",
                (scope, *params, limit + 1),
            ).fetchall()
        taken, next_cursor = take(rows, limit, max_bytes, _row_size, lambda row: encode_cursor(row[1], row[0]))
        return KnowledgePage([entry_from_row(row) for row in taken], next_cursor)

    def get_knowledge(self, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Return one entry of the workspace, tombstoned or not; raise `KnowledgeNotFoundError` if there is none."""
        key = validate_key(key)
        with self._db.read() as conn:
            row = self._entry_row(conn, workspace_scope(conn, workspace), key)
            return self._entry_by_id(conn, row[0])

    def knowledge_history(
        self,
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
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MIN_PAGE_BYTES)
        check_position(after_version, "after_version")
        key = validate_key(key)
        with self._db.read() as conn:
            entry_id = self._entry_row(conn, workspace_scope(conn, workspace), key)[0]
            rows = conn.execute(
                f"SELECT {VERSION_COLUMNS} FROM knowledge_versions v WHERE v.knowledge_id = ? AND v.version > ? "
                "ORDER BY v.version LIMIT ?",
                (entry_id, after_version, limit + 1),
            ).fetchall()
        taken, _ = take(rows, limit, max_bytes, _row_size, lambda row: row[0])
        versions = [version_from_row(key, row) for row in taken]
        done = len(versions) == len(rows)
        return KnowledgeHistoryPage(versions, versions[-1].version if versions else after_version, done)

    def knowledge_source(self, session_id: str, first_seq: int, last_seq: int) -> KnowledgeSource:
        """Build provenance for events `first_seq..last_seq` of a Session by computing their source digest.

        The range must exist and hold at most `knowledge_source_max_bytes`;
        raises `InvalidKnowledgeError` otherwise.
        """
        probe = validate_source(KnowledgeSource(session_id, first_seq, last_seq, "0" * 64))
        with self._db.read() as conn:
            rowid = session_rowid(conn, session_id)
            self._check_source_size(conn, rowid, probe)
            digest = source_digest(conn, rowid, session_id, first_seq, last_seq)
        if digest is None:
            raise InvalidKnowledgeError(
                f"Session {session_id} has no events {first_seq}..{last_seq}; cite events it has"
            )
        return KnowledgeSource(session_id, first_seq, last_seq, digest)

    # -- internals shared with distillation and maintain ------------------------------------------

    def _entry_row(self, conn: apsw.Connection, scope: Scope | None, key: str) -> tuple:
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

    def _entry_by_id(self, conn: apsw.Connection, entry_id: int) -> KnowledgeEntry:
        row = conn.execute(f"SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE k.id = ?", (entry_id,)).fetchone()
        return entry_from_row(row)

    def _source_columns(
        self, conn: apsw.Connection, source: KnowledgeSource | None, scope: Scope
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

    def _check_source_size(self, conn: apsw.Connection, rowid: int, source: KnowledgeSource) -> None:
        size = range_bytes(conn, rowid, source.first_seq, source.last_seq)
        if size > self._db.settings.knowledge_source_max_bytes:
            raise InvalidKnowledgeError(
                f"events {source.first_seq}..{source.last_seq} of Session {source.session_id} hold {size} bytes, "
                "over knowledge_source_max_bytes; cite a narrower range"
            )
