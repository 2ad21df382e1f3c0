"""`SessionLease`: the opaque, expiring authority to append to one Session.

There is at most one live lease per Session. A lease must replay the
Session's durable history before its first append, and every append re-checks,
inside its `BEGIN IMMEDIATE` transaction, the lease token and expiry, the
workspace identity and the raw sequence cursor the holder last saw.

Leaving a `with` block or dropping the object releases the lease best-effort
through a zero-wait connection: when the database is busy it returns at once
and lets expiry recover authority. `release()` and `fail()` are the durable,
explicit transitions.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from collections.abc import Iterator, Sequence
from stat import S_ISDIR
from typing import TYPE_CHECKING

from .assets_links import link_turn_assets, turn_assets
from .connection import connect
from .errors import (
    InvalidInputError,
    LeaseExpiredError,
    LeaseLostError,
    ReplayRequiredError,
    StaleCursorError,
    WorkspaceMissingError,
    WorkspaceReplacedError,
)
from .sessions import WorkspaceIdentity, rebind_advice
from .transcript import AppendedTurn, Event, NewEvent, ReplayPage, encode_turn

if TYPE_CHECKING:
    from .store import MemoryStore

MAX_FAILURE_CHARS = 2000

# What an append re-checks, in one statement: the workspace identity, the lease, and the head (newest seq, turn and
# byte_end, all None for an empty Session) read from the Session's newest event.
_AUTHORITY_SQL = (
    "SELECT w.path, w.device, w.inode, w.generation, w.birth_ns, l.token_hash, l.state, l.expires_at, "
    "e.seq, e.turn, e.byte_end FROM sessions s JOIN workspaces w ON w.id = s.workspace_id "
    "JOIN session_leases l ON l.session_id = s.id "
    "LEFT JOIN events e ON e.id = (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1) "
    "WHERE s.id = ?1"
)
_INSERT_SQL = (
    "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def token_digest(token: str) -> bytes:
    """The SHA-256 of a lease token, which is all the database stores."""
    return hashlib.sha256(token.encode("ascii")).digest()


def new_token() -> str:
    """A fresh opaque lease token."""
    return secrets.token_urlsafe(32)


def holder_label() -> str:
    """`pid@host`, recorded with a lease for diagnostics."""
    return f"{os.getpid()}@{socket.gethostname()}"[:200]


class SessionLease:
    """The live authority over one Session; obtain one with `MemoryStore.acquire_lease`."""

    def __init__(
        self,
        store: MemoryStore,
        session_rowid: int,
        session_id: str,
        token: str,
        expires_at: float,
        workspace: WorkspaceIdentity,
        workspace_id: int,
        pin: int,
    ) -> None:
        self._store = store
        self._rowid = session_rowid
        self.session_id = session_id
        self._token = token
        self._digest = token_digest(token)
        self.expires_at = expires_at
        self.workspace = workspace
        self.workspace_id = workspace_id
        # The workspace directory held open while the lease lives: an open inode cannot be freed, so its number
        # cannot be handed to a new directory, and a path that still has this device/inode still names it.
        self._pin: int | None = pin
        self._dev_ino = (workspace.device, workspace.inode)
        self._bound = (workspace.path, workspace.device, workspace.inode, workspace.generation, workspace.birth_ns)
        self._cursor = 0
        self._replayed = False
        self._ended = False

    def __repr__(self) -> str:
        return f"<SessionLease session={self.session_id} expires_at={self.expires_at:.3f} ended={self._ended}>"

    @property
    def token(self) -> str:
        """The opaque lease token."""
        return self._token

    @property
    def cursor(self) -> int:
        """The raw sequence cursor: the seq of the newest event this holder has seen or written."""
        return self._cursor

    @property
    def replayed(self) -> bool:
        """True once the holder has replayed to the end of durable history."""
        return self._replayed

    # -- reading --------------------------------------------------------------

    def replay(self, after_seq: int | None = None, *, limit: int | None = None, max_bytes: int | None = None) -> ReplayPage:
        """Read the next page of history after `after_seq` (default: this lease's cursor) and advance the cursor.

        Reaching the end (`page.done`) marks the lease as replayed, which
        `append_turn` requires. Limits are validated like `MemoryStore.replay`.
        """
        start = self._cursor if after_seq is None else after_seq
        page = self._store._replay_page(self._rowid, start, limit, max_bytes)
        if start <= self._cursor:  # contiguous with what this holder has seen
            self._cursor = max(self._cursor, page.next_cursor)
            self._replayed = self._replayed or page.done
        return page

    def replay_all(self) -> Iterator[Event]:
        """Yield every event from the start, page by page, leaving the lease replayed."""
        after = 0
        while True:
            page = self.replay(after)
            yield from page.events
            after = page.next_cursor
            if page.done:
                return

    # -- writing --------------------------------------------------------------

    def append_turn(self, events: Sequence[NewEvent], *, expected_seq: int | None = None) -> AppendedTurn:
        """Atomically append one turn: consecutive positions and seqs, one new turn ID.

        `expected_seq` is the raw cursor the caller last saw (default: this
        lease's cursor). Inside one `BEGIN IMMEDIATE` transaction the lease
        token and expiry, the workspace identity and the cursor are re-checked,
        and each event's `assets` are linked after checking them against the
        catalog and their files; any mismatch, invalid event or bad asset
        reference raises a typed error and writes nothing.
        """
        if not self._replayed:
            raise ReplayRequiredError(
                f"lease on Session {self.session_id} has not replayed its history; replay to the end first"
            )
        expected = self._cursor if expected_seq is None else expected_seq
        events = list(events)
        encoded = encode_turn(events, self._store.settings)
        linked = turn_assets(events)
        store = self._store
        rowid = self._rowid
        with store._write() as conn:
            row = conn.execute(_AUTHORITY_SQL, (rowid,)).fetchone()
            now = self._check_authority(row)
            last_seq = row[8] or 0
            if last_seq != expected:
                raise StaleCursorError(
                    f"Session {self.session_id} is at seq {last_seq} but the caller last saw {expected}; "
                    "replay from your cursor and retry"
                )
            turn = (row[9] or 0) + 1
            byte_end = row[10] or 0
            rows = []
            for i, e in enumerate(encoded):
                byte_end += e.size
                rows.append((rowid, last_seq + i + 1, turn, i, e.kind, e.payload, e.size, byte_end, now))
            conn.executemany(_INSERT_SQL, rows)
            # Rowids of an INTEGER PRIMARY KEY are max + 1, so under our write lock the turn's IDs are consecutive.
            last_id = conn.last_insert_rowid()
            ids = tuple(range(last_id - len(rows) + 1, last_id + 1))
            if linked:
                link_turn_assets(conn, store.asset_dir, rowid, last_seq + 1, linked, now)
        new_seq = last_seq + len(rows)
        self._cursor = new_seq
        return AppendedTurn(turn, last_seq + 1, new_seq, ids)

    def _check_authority(self, row: tuple | None) -> float:
        """Inside a write transaction: verify the lease token and expiry, and the workspace, of an `_AUTHORITY_SQL`
        row (None when the Session or its lease row is gone); return the store's time."""
        now = self._store.clock()
        if row is None or row[5] != self._digest or row[6] != "active":
            raise LeaseLostError(f"this lease on Session {self.session_id} is no longer held; acquire a new one")
        if row[7] <= now:
            raise LeaseExpiredError(f"the lease on Session {self.session_id} expired; acquire a new one and replay")
        try:
            st = os.stat(self.workspace.path)
        except OSError:
            raise WorkspaceMissingError(
                f"workspace {self.workspace.path} of Session {self.session_id} is gone or was renamed; "
                "release this lease, then acquire a new one with the directory's current path"
            ) from None
        if (st.st_dev, st.st_ino) != self._dev_ino or row[:5] != self._bound or self._pin is None:
            self._recheck_workspace(row, st)
        return now

    def _recheck_workspace(self, row: tuple, st: os.stat_result) -> None:
        """The slow path of `_check_authority`: raise unless the workspace is unchanged. Without the pinned
        directory (the lease was closed but is still active), the identity is read afresh."""
        ws = self.workspace
        if row[:5] != self._bound:
            raise WorkspaceReplacedError(
                f"workspace {self.workspace_id} of Session {self.session_id} was moved or rebound since this lease "
                "was taken; nothing was written; release this lease and acquire a new one"
            )
        if (st.st_dev, st.st_ino) == self._dev_ino and S_ISDIR(st.st_mode):
            if self._pin is not None or ws.same_directory(WorkspaceIdentity.inspect(ws.path)):
                return
        raise WorkspaceReplacedError(
            f"workspace {ws.path} of Session {self.session_id} was replaced by another directory; nothing was "
            f"written; release this lease, then, {rebind_advice(self.workspace_id, ws.path)}"
        )

    def _unpin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            os.close(pin)

    def renew(self, ttl_s: float | None = None) -> float:
        """Extend a live lease by `ttl_s` (default: the configured TTL) from now; return the new expiry."""
        ttl = self._store._lease_ttl(ttl_s)
        with self._store._write() as conn:
            now = self._check_authority(conn.execute(_AUTHORITY_SQL, (self._rowid,)).fetchone())
            conn.execute(
                "UPDATE session_leases SET expires_at = ? WHERE session_id = ?", (now + ttl, self._rowid)
            )
        self.expires_at = now + ttl
        return self.expires_at

    def release(self) -> None:
        """Durably release the lease (waiting out a busy database). Raises `LeaseLostError` if it was not held."""
        self._end("released", None)

    def fail(self, reason: str) -> None:
        """Durably end the lease as failed, recording a bounded `reason` for diagnostics."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("a lease failure needs a non-empty reason")
        self._end("failed", reason[:MAX_FAILURE_CHARS])

    def _end(self, state: str, failure: str | None) -> None:
        if self._ended:
            raise LeaseLostError(f"this lease on Session {self.session_id} has already ended")
        self._unpin()
        with self._store._write() as conn:
            changed = conn.execute(
                "UPDATE session_leases SET state = ?, ended_at = ?, failure = ? "
                "WHERE session_id = ? AND token_hash = ? AND state = 'active' RETURNING 1",
                (state, self._store.clock(), failure, self._rowid, self._digest),
            ).fetchall()
        self._ended = True
        if not changed:
            raise LeaseLostError(f"this lease on Session {self.session_id} was no longer held")

    # -- best-effort release on drop ----------------------------------------------

    def close(self) -> None:
        """Release best-effort through a zero-wait connection; never blocks, never raises.

        When the database is busy the lease stays active until it expires (or
        an explicit `release()` succeeds).
        """
        self._unpin()
        if self._ended:
            return
        try:
            conn = connect(self._store.path, busy_timeout_ms=0)
        except Exception:
            return
        try:
            with conn:
                conn.execute(
                    "UPDATE session_leases SET state = 'released', ended_at = ? "
                    "WHERE session_id = ? AND token_hash = ? AND state = 'active'",
                    (self._store.clock(), self._rowid, self._digest),
                )
            self._ended = True
        except Exception:
            pass  # busy or gone: expiry recovers authority
        finally:
            conn.close()

    def __enter__(self) -> SessionLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
