"""`Sessions` (`store.sessions`): creating, reading and listing Sessions, taking their lease, and replay."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from ..core.cursors import cursor_float, cursor_int
from ..core.database import Database
from ..core.id_prefix import resolve_id
from ..core.paging import Items, Page, take
from ..core.io_errors import restated
from ..core.utf8 import check_utf8, is_utf8
from ..errors import (
    CommitOutcomeUnknownError,
    InvalidInputError,
    LeaseHeldError,
    SessionNotFoundError,
)
from .identity import SESSION_COLUMNS, Session, WorkspaceIdentity, not_the_workspace, session_from_row
from .holders import holder_is_dead, holder_label, live_holder
from .leases import SessionLease, lease_ttl, new_token, token_digest
from .replay import replay_page
from .rows import session_rowid
from .transcript import ReplayPage
from .workspaces import (
    WORKSPACE_COLUMNS,
    WorkspaceLike,
    identity_of,
    register_workspace,
    settle_workspace,
    workspace_scope,
)

MAX_SESSION_ROW_BYTES = 8192  # bound of one Session's row in a page estimate (title <= 512 chars, path <= 4096 bytes)


@dataclass(frozen=True)
class SessionPage(Page[Session]):
    """A page of Sessions, newest first. Pass `next_cursor` back to continue; it is None after the last page."""

    sessions = Items[Session]()


class Sessions:
    """Sessions of one database (`store.sessions`); `MemoryStore` offers each method under the same name."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    # -- Sessions ---------------------------------------------------------------

    def create_session(
        self, workspace: str | os.PathLike[str], *, title: str | None = None, new_workspace: bool = False
    ) -> Session:
        """Create a Session in the canonical `workspace` directory: the known workspace that directory is, or a new
        one recorded with its identity (see `WorkspaceIdentity`).

        A directory at the path where another known workspace was last seen
        (a re-clone, say) raises `WorkspaceReplacedError` naming the rebind
        command, unless `new_workspace` says it is a new, unrelated workspace.
        """
        if title is not None and (not isinstance(title, str) or len(title) > 512):
            raise InvalidInputError("a Session title must be a string of at most 512 characters")
        check_utf8(title, "the Session title")
        found = WorkspaceIdentity.inspect(workspace)
        now = self._db.clock()
        session_id = str(uuid.uuid4())
        with self._db.write() as conn:
            workspace_id, ident = register_workspace(conn, found, now, new_workspace=new_workspace)
            conn.execute(
                "INSERT INTO sessions (uuid, title, workspace_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                (session_id, title, workspace_id, now, now),
            )
        return Session(session_id, title, ident, now, now, 0, 0, 0, workspace_id)

    def get_session(self, session_id: str) -> Session:
        """Return a snapshot of one Session; raise `SessionNotFoundError` if there is none."""
        row = None
        if is_utf8(session_id):
            with self._db.read() as conn:
                row = conn.execute(f"SELECT {SESSION_COLUMNS} FROM session_heads WHERE uuid = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no Session {session_id!r}; list them with `emelex memory sessions list`")
        return session_from_row(row)

    def list_sessions(
        self,
        *,
        workspace: WorkspaceLike | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> SessionPage:
        """Page through Sessions newest first with a stable `(created_at, id)` cursor, bounded in items and bytes;
        with `workspace`, only that workspace's (the known workspace its directory is, by identity; none when it is
        no known workspace, and the errors of `workspace_scope` when it was replaced)."""
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_SESSION_ROW_BYTES)
        clauses: list[str] = []
        params: tuple = ()
        if cursor is not None:
            try:
                created, rowid = cursor.split(":")
                clauses, params = ["(created_at, id) < (?, ?)"], (cursor_float(created), cursor_int(rowid))
            except (AttributeError, ValueError):
                raise InvalidInputError(f"bad Session cursor {cursor!r}; pass a next_cursor from a previous page") from None
        with self._db.read() as conn:
            if workspace is not None:
                scope = workspace_scope(conn, workspace)
                if scope is None:
                    return SessionPage([], None)
                clauses, params = [*clauses, "workspace_id = ?"], (*params, scope)
            where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
            rows = conn.execute(
                f"SELECT id, {SESSION_COLUMNS} FROM session_heads {where} ORDER BY created_at DESC, id DESC LIMIT ?",
                (*params, limit + 1),
            ).fetchall()
        taken, next_cursor = take(
            rows, limit, max_bytes,
            lambda row: 200 + len((row[2] or "").encode()) + len(row[3].encode()),  # generous per-row estimate
            lambda row: f"{row[8]!r}:{row[0]}",
        )
        return SessionPage([session_from_row(row[1:]) for row in taken], next_cursor)

    # -- leases and replay --------------------------------------------------------

    def acquire_lease(
        self, session_id: str, workspace: str | os.PathLike[str], *, ttl_s: float | None = None
    ) -> SessionLease:
        """Take the one live lease on a Session from `workspace` (its current path).

        Validates the workspace identity first (a renamed directory is
        accepted and the stored path updated; components the workspace did
        not record yet are recorded). Raises `WorkspaceReplacedError` when the
        directory is not the Session's workspace (`WorkspaceMissingError` when
        the workspace's recorded path names nothing), `LeaseHeldError` while
        another holder's lease is live; an expired lease is replaced (its
        holder's later writes are refused with `LeaseLostError`). The new
        lease must replay before appending. It keeps the directory open until
        it ends, so that its inode number cannot be reused meanwhile.
        """
        ttl = lease_ttl(self._db.settings, ttl_s)
        found, fd = WorkspaceIdentity.open(workspace)
        try:
            return self._acquire_lease(session_id, found, fd, ttl)
        except CommitOutcomeUnknownError as exc:
            os.close(fd)
            raise restated(
                exc, self._db.path, f"a lease on Session {session_id}",
                f"if it is durable, its token never reached you and the Session stays leased until it expires (at "
                f"most {ttl:g}s); acquire it again: a LeaseHeldError then means it was, and acquiring succeeds once "
                "that lease has expired",
            ) from exc.__cause__
        except BaseException:
            os.close(fd)
            raise

    def _acquire_lease(self, session_id: str, found: WorkspaceIdentity, fd: int, ttl: float) -> SessionLease:
        token = new_token()
        with self._db.write() as conn:
            rowid = session_rowid(conn, session_id)
            row = conn.execute(
                f"SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE id = (SELECT workspace_id FROM sessions WHERE id = ?)",
                (rowid,),
            ).fetchone()
            if not found.same_directory(identity_of(row)):
                raise not_the_workspace(found.path, session_id, row[0], identity_of(row))
            now = self._db.clock()
            held = live_holder(conn, rowid, now)
            if held and holder_is_dead(held[0]):
                raise LeaseHeldError(
                    f"Session {session_id} is leased by {held[0]}, but that process is gone (no such pid on this "
                    f"host); its lease frees in {held[1] - now:.0f}s, at "
                    f"{time.strftime('%H:%M:%S', time.localtime(held[1]))}, as nobody renews it: try again then"
                )
            if held:
                raise LeaseHeldError(
                    f"Session {session_id} is leased by {held[0]} for another {held[1] - now:.0f}s; "
                    "wait for it to finish or expire"
                )
            ident = settle_workspace(conn, row, found)
            epoch = conn.execute("SELECT workspace_epoch FROM sessions WHERE id = ?", (rowid,)).fetchone()[0]
            conn.execute(
                "INSERT INTO session_leases (session_id, token_hash, holder, state, acquired_at, expires_at) "
                "VALUES (?, ?, ?, 'active', ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
                "token_hash = excluded.token_hash, holder = excluded.holder, state = 'active', "
                "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, ended_at = NULL, failure = NULL",
                (rowid, token_digest(token), holder_label(), now, now + ttl),
            )
        return SessionLease(self._db, rowid, session_id, token, now + ttl, ident, row[0], epoch, fd)

    def replay(
        self, session_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> ReplayPage:
        """Read one page of a Session's transcript after `after_seq` (exclusive), bounded in items and bytes.

        `max_bytes` must be at least the per-event cap so every page can make
        progress. Read-only: this does not satisfy a lease's replay duty.
        """
        return replay_page(self._db, session_id, after_seq, limit, max_bytes)

    def resolve_session_id(self, prefix: str) -> str:
        """The full ID of the one Session whose ID is `prefix` or starts with it (at least 4 characters, any case).

        Raises `SessionNotFoundError` when none matches and `AmbiguousIdError`
        when the prefix is too short or matches several (listing them).
        """
        with self._db.read() as conn:
            return resolve_id(conn, "sessions", prefix, "Session", SessionNotFoundError,
                              "list them with `emelex memory sessions list`")
