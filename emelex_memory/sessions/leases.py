"""`SessionLease`: the opaque, expiring authority to append to one Session.

There is at most one live lease per Session. A lease must replay the
Session's durable history before its first append, and every append re-checks,
inside its `BEGIN IMMEDIATE` transaction, the lease token and expiry, the
workspace identity and the raw sequence cursor the holder last saw.

`release()` and `fail()` are the durable, explicit transitions. Leaving a
`with` block releases durably too, through the store's own connection and its
bounded busy wait, so an interrupted holder (`KeyboardInterrupt` in the block)
does not leave the Session locked for a whole TTL. Only a lease dropped without
either (garbage collection) is released best-effort through a zero-wait
connection: when the database is busy that returns at once and lets expiry
recover authority.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from stat import S_ISDIR
from typing import NamedTuple, TypeVar

import apsw

from ..assets.folder import open_asset_folder
from ..assets.links import check_replay_media, check_view_media, link_turn_assets, turn_assets
from ..core.connection import connect
from ..core.database import Database
from ..errors import (
    CommitOutcomeUnknownError,
    InvalidInputError,
    LeaseExpiredError,
    LeaseLostError,
    OpenJournalError,
    ReplayRequiredError,
    StaleCursorError,
    StoreClosedError,
    WorkspaceMissingError,
    WorkspaceReplacedError,
)
from ..core.io_errors import file_error, restated
from ..core.settings import Settings
from .holders import open_journal
from .identity import WorkspaceIdentity, rebind_advice
from .replay import replay_page
from .transcript import AppendedTurn, Event, NewEvent, ReplayPage, encode_turn, media_of
from .writing import Head, insert_checked_turn, insert_turn

MAX_FAILURE_CHARS = 2000
T = TypeVar("T")

# What an append re-checks, in one statement: the Session's workspace and the epoch of its row (m011: every change of
# the workspace row bumps it, so equal numbers mean the row the lease verified is unchanged), the lease, and the head
# (newest seq, turn, byte_end and media_end, all 0 for an empty Session) read from the Session's newest event, and
# whether the Session has an open agent journal.
_AUTHORITY_SQL = (
    "SELECT s.workspace_id, s.workspace_epoch, l.token_hash, l.state, l.expires_at, coalesce(e.seq, 0), "
    "coalesce(e.turn, 0), coalesce(e.byte_end, 0), coalesce(e.media_end, 0), "
    f"{open_journal('s.id')} FROM sessions s JOIN session_leases l ON l.session_id = s.id "
    "LEFT JOIN events e ON e.id = (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1) "
    "WHERE s.id = ?1"
)


class _Authority(NamedTuple):
    """A row of `_AUTHORITY_SQL`: the Session's workspace row and epoch, its lease, its head (zeros when it has no
    event) and whether it has an open agent journal."""

    workspace_id: int
    workspace_epoch: int
    token_hash: bytes
    state: str
    expires_at: float
    head: Head
    journal_open: int

    @classmethod
    def read(cls, conn: apsw.Connection, session_rowid: int) -> _Authority | None:
        """The Session's row (None when the Session or its lease row is gone)."""
        row = conn.execute(_AUTHORITY_SQL, (session_rowid,)).fetchone()
        return None if row is None else cls(*row[:5], Head(*row[5:9]), row[9])
def token_digest(token: str) -> bytes:
    """The SHA-256 of a lease token, which is all the database stores."""
    return hashlib.sha256(token.encode("ascii")).digest()


def new_token() -> str:
    """A fresh opaque lease token."""
    return secrets.token_urlsafe(32)


def lease_ttl(settings: Settings, ttl_s: float | None) -> float:
    """A lease's TTL: `ttl_s`, or the configured one for None; refused outside (0, 86400] seconds."""
    ttl = settings.session_lease_ttl_s if ttl_s is None else ttl_s
    if not 0 < ttl <= 86_400:
        raise InvalidInputError(f"lease TTL must be between 0 and 86400 seconds, got {ttl}")
    return ttl


class SessionLease:
    """The live authority over one Session; obtain one with `MemoryStore.acquire_lease`."""

    def __init__(
        self,
        db: Database,
        session_rowid: int,
        session_id: str,
        token: str,
        expires_at: float,
        workspace: WorkspaceIdentity,
        workspace_id: int,
        epoch: int,
        pin: int,
        *,
        replayed: bool = False,
    ) -> None:
        """A lease `MemoryStore.acquire_lease` (or `create_agent_session`) just took: the Session's row ID and public
        ID, the token, its expiry, the verified workspace (its row ID, and the Session's epoch of it) and the open
        descriptor of its directory (`pin`, closed when the lease ends). `replayed`: the Session was created empty
        in the lease's own transaction, so there is nothing to replay before the first append."""
        self._db = db
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
        self._path = workspace.path
        self._epoch = epoch  # the Session's workspace_epoch when the lease verified the workspace row
        self._cursor = 0
        self._head: Head | None = None  # the Session's newest event as this lease last wrote it
        self._replayed = replayed
        self._ended = False
        self._media = 0  # bytes of media in the replay view this holder has read (from the start) or appended
        # A `finish_session` of this lease raised CommitOutcomeUnknownError: the store's next finish completes it.
        self.finish_outcome_unknown = False

    def __repr__(self) -> str:
        return f"<SessionLease session={self.session_id} expires_at={self.expires_at:.3f} ended={self._ended}>"

    @property
    def db(self) -> Database:
        """The `Database` of the store that acquired this lease (its clock, its transactions)."""
        return self._db

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
        The media of the whole replay, counted across the pages read from the
        start, is capped at 256 MiB: a page that takes it over raises
        `ReplayMediaCapError` and does not advance the cursor.
        """
        start = self._cursor if after_seq is None else after_seq
        page = replay_page(self._db, self._rowid, start, limit, max_bytes)
        if start <= self._cursor:  # contiguous with what this holder has seen
            seen = self._cursor
            media = page.media_bytes if start == seen else media_of(e for e in page.events if e.seq > seen)
            if media:
                check_replay_media(self._media + media, self.session_id)
                self._media += media
            self._cursor = max(self._cursor, page.next_cursor)
            self._replayed = self._replayed or page.done
        return page

    def replay_all(self) -> Iterator[Event]:
        """Yield every event from the start, page by page, leaving the lease replayed.

        Raises `ReplayMediaCapError` when the events refer to more than
        256 MiB of media in all.
        """
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

        Refused with `OpenJournalError` (nothing written) while the Session
        has an open agent journal: only the journal's own steps append then,
        so no other writer can slip events into an agent turn.

        `expected_seq` is the raw cursor the caller last saw (default: this
        lease's cursor). Inside one `BEGIN IMMEDIATE` transaction the lease
        token and expiry, the workspace identity and the cursor are re-checked,
        and each event's `assets` are linked after checking them against the
        catalog and their files; any mismatch, invalid event or bad asset
        reference raises a typed error and writes nothing; so does a turn
        that would take the media of the Session's replay view (its newest
        Summary and the events after it) over 256 MiB (`AssetMediaCapError`).

        Only when the COMMIT itself fails in its I/O is the outcome unknown:
        `CommitOutcomeUnknownError`, after which the lease must replay again
        before its next append (its cursor stays where it was). Replay to the
        end, then retry with `expected_seq` set to that cursor: the turn was
        committed exactly when the retry raises `StaleCursorError`.
        """
        return self._append(events, expected_seq, journaled=False)

    def append_journaled(self, events: Sequence[NewEvent], *, expected_seq: int | None = None) -> AppendedTurn:
        """`append_turn` for a step of the Session's open agent turn: the agent journal appends a published tool batch
        with it, inside its own transaction (`agent/journal.py: publish_batch`), while the turn stays open. It checks
        and writes exactly as `append_turn` does, except that the open journal does not refuse it."""
        return self._append(events, expected_seq, journaled=True)

    def _append(self, events: Sequence[NewEvent], expected_seq: int | None, *, journaled: bool) -> AppendedTurn:
        if not self._replayed:
            raise ReplayRequiredError(
                f"lease on Session {self.session_id} has not replayed its history; replay to the end first"
            )
        expected = self._cursor if expected_seq is None else expected_seq
        events = list(events)
        encoded = encode_turn(events, self._db.settings)
        linked = turn_assets(events)
        media = {position: sum(ref.size for ref in refs) for position, refs in linked} if linked else None
        db = self._db
        rowid = self._rowid
        count = len(encoded)
        head = self._head
        try:
            with db.write() as conn:
                # The common case in one statement: the INSERT itself checks what `_AUTHORITY_SQL` reads against what
                # this lease expects (`_checked_insert_sql`). Only when it inserts nothing does the full check run,
                # raising the typed error of whatever changed, or finding the head the lease did not know.
                new = None
                if head is not None and head.seq == expected and not linked and self._same_workspace():
                    now = db.clock()
                    new = insert_checked_turn(conn, rowid, encoded, head, now, workspace_id=self.workspace_id,
                                              epoch=self._epoch, token_digest=self._digest, journaled=journaled)
                if new is None:
                    row = _Authority.read(conn, rowid)
                    now = self._check_authority(row)
                    if row.journal_open and not journaled:
                        raise OpenJournalError(
                            f"Session {self.session_id} has an open agent turn; only its agent appends until the turn "
                            f"closes: resume the agent, or run `emelex memory sessions recover {self.session_id}`"
                        )
                    if row.head.seq != expected:
                        raise StaleCursorError(
                            f"Session {self.session_id} is at seq {row.head.seq} but the caller last saw {expected}; "
                            "replay from your cursor and retry"
                        )
                    if media:
                        check_view_media(conn, rowid, row.head.media_end + sum(media.values()), self.session_id)
                    new = insert_turn(conn, rowid, encoded, row.head, now, media)
                # Rowids of an INTEGER PRIMARY KEY are max + 1, so under our write lock the turn's IDs are consecutive.
                last_id = conn.last_insert_rowid()
                ids = tuple(range(last_id - count + 1, last_id + 1))
                if linked:
                    with open_asset_folder(db) as folder:
                        link_turn_assets(conn, folder, rowid, expected + 1, linked, now)
        except CommitOutcomeUnknownError as exc:
            self._replayed = False  # the cursor check makes the retry safe once the holder has looked again
            self._head = None
            raise restated(
                exc, db.path, f"a turn to Session {self.session_id}",
                f"replay this lease to the end, then append the turn again with expected_seq={expected} (a "
                "StaleCursorError then means it was committed)",
            ) from exc.__cause__
        self._cursor = new.seq
        self._head = new
        if media:
            self._media += sum(media.values())
        return AppendedTurn(new.turn, expected + 1, new.seq, ids)

    def _same_workspace(self) -> bool:
        """Whether the workspace path still names the directory this lease holds open (`_check_authority` checks
        that, and the rest, fully)."""
        try:
            st = os.stat(self._path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._dev_ino and self._pin is not None

    def check_authority(self, conn: apsw.Connection) -> float:
        """Inside a write transaction on this lease's store (`conn`): re-check what `append_turn` re-checks (replayed,
        lease token and expiry, workspace identity, the Session still at this lease's cursor), raising the same typed
        errors; return the store's time. For writes that go with a Session but append no events (the agent journal)."""
        if not self._replayed:
            raise ReplayRequiredError(
                f"lease on Session {self.session_id} has not replayed its history; replay to the end first"
            )
        row = _Authority.read(conn, self._rowid)
        now = self._check_authority(row)
        if row.head.seq != self._cursor:
            raise StaleCursorError(
                f"Session {self.session_id} is at seq {row.head.seq} but this lease last saw {self._cursor}; "
                "replay and retry"
            )
        return now

    def _check_authority(self, row: _Authority | None) -> float:
        """Inside a write transaction: verify the lease token and expiry, and the workspace, of an `_AUTHORITY_SQL`
        row (None when the Session or its lease row is gone); return the store's time."""
        now = self._db.clock()
        if row is None or row.token_hash != self._digest or row.state != "active":
            raise LeaseLostError(f"this lease on Session {self.session_id} is no longer held; acquire a new one")
        if row.expires_at <= now:
            raise LeaseExpiredError(f"the lease on Session {self.session_id} expired; acquire a new one and replay")
        try:
            st = os.stat(self._path)
        except (FileNotFoundError, NotADirectoryError):
            st = self._follow_rename()
        except OSError as exc:
            raise file_error(exc, self._path, "checking the workspace") from exc
        if (st.st_dev, st.st_ino) != self._dev_ino or row.workspace_epoch != self._epoch \
                or row.workspace_id != self.workspace_id or self._pin is None:
            self._recheck_workspace(row, st)
        return now

    def _follow_rename(self) -> os.stat_result:
        """The recorded path names nothing: the held-open directory's status when it still exists (it was renamed,
        and stays the Session's workspace), its new path recorded where the platform tells it
        (`/proc/self/fd`); else `WorkspaceMissingError`."""
        st = None if self._pin is None else os.fstat(self._pin)
        if st is None or st.st_nlink == 0:
            raise WorkspaceMissingError(
                f"workspace {self._path} of Session {self.session_id} is gone; nothing was written; release this "
                "lease, then acquire a new one with the directory's current path"
            )
        try:
            self._path = os.readlink(f"/proc/self/fd/{self._pin}")
        except OSError:
            pass  # no such view: the held-open directory is checked again next time
        return st

    @property
    def path(self) -> str:
        """The workspace directory's path as this lease last found it: it follows a rename of the directory the
        lease holds open."""
        return self._path

    def _recheck_workspace(self, row: _Authority, st: os.stat_result) -> None:
        """The slow path of `_check_authority`: raise unless the workspace is unchanged. Without the pinned
        directory (the lease was closed but is still active), the identity is read afresh."""
        ws = self.workspace
        if (row.workspace_id, row.workspace_epoch) != (self.workspace_id, self._epoch):
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
        ttl = lease_ttl(self._db.settings, ttl_s)
        with self._db.write() as conn:
            now = self._check_authority(_Authority.read(conn, self._rowid))
            conn.execute(
                "UPDATE session_leases SET expires_at = ? WHERE session_id = ?", (now + ttl, self._rowid)
            )
        self.expires_at = now + ttl
        return self.expires_at

    def release(self) -> None:
        """Durably release the lease (waiting out a busy database for at most the busy timeout).

        Raises `LeaseLostError` if it was not held (released, failed or
        replaced) and `LeaseExpiredError` if it expired: an expired lease is
        no longer held either, and its row is left for `maintain`'s stale-lease
        sweep; either way the Session is free to lease again.
        """
        self._end("released", None)

    def fail(self, reason: str) -> None:
        """Durably end the lease as failed, recording a bounded `reason` for diagnostics; raises like `release`."""
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidInputError("a lease failure needs a non-empty reason")
        self._end("failed", reason[:MAX_FAILURE_CHARS])

    def _end(self, state: str, failure: str | None) -> None:
        self.end_with(state, failure, None)

    def end_with(self, state: str, failure: str | None, work: Callable[[apsw.Connection], T] | None) -> T | None:
        """End the lease as `state` ("released" or "failed", with `failure`) in one write transaction with
        `work(conn)` (run first, inside it): both commit or neither. `MemoryStore.finish_session` queues distillation
        so; raises as `release` does.

        Returns what `work` returned. The lease counts as ended only once the
        transaction committed, or once it is known not to be held
        (`LeaseLostError`, and then `work` is rolled back too).
        """
        if self._ended:
            raise LeaseLostError(f"this lease on Session {self.session_id} has already ended")
        self._unpin()
        with self._db.write() as conn:
            now = self._db.clock()
            row = conn.execute(
                "SELECT expires_at FROM session_leases WHERE session_id = ? AND token_hash = ? AND state = 'active'",
                (self._rowid, self._digest),
            ).fetchone()
            if row is None:
                self._ended = True
                raise LeaseLostError(f"this lease on Session {self.session_id} was no longer held")
            if row[0] <= now:
                self._ended = True
                raise LeaseExpiredError(
                    f"the lease on Session {self.session_id} expired before it was released; nothing to do: the "
                    "Session can be leased again"
                )
            result = None if work is None else work(conn)
            conn.execute(
                "UPDATE session_leases SET state = ?, ended_at = ?, failure = ? WHERE session_id = ?",
                (state, now, failure, self._rowid),
            )
        self._ended = True
        return result

    # -- leaving a block, and best-effort release on drop ------------------------------

    def close(self) -> None:
        """Release best-effort through a zero-wait connection; never blocks, never raises (what dropping does).

        When the database is busy the lease stays active until it expires (or
        an explicit `release()` succeeds).
        """
        self._unpin()
        if self._ended:
            return
        try:
            conn = connect(self._db.path, busy_timeout_ms=0)
        except Exception:
            return
        try:
            with conn:
                conn.execute(
                    "UPDATE session_leases SET state = 'released', ended_at = ? "
                    "WHERE session_id = ? AND token_hash = ? AND state = 'active'",
                    (self._db.clock(), self._rowid, self._digest),
                )
            self._ended = True
        except Exception:
            pass  # busy or gone: expiry recovers authority
        finally:
            conn.close()

    def __enter__(self) -> SessionLease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        """Release durably unless the lease already ended; a lease lost or expired meanwhile is no error here, nor is
        a store closed inside the block (then the release is best-effort, as `close()` makes it), and while an
        exception propagates, a failed release never replaces it (expiry recovers authority then)."""
        if self._ended:
            return
        try:
            self.release()
        except (LeaseLostError, LeaseExpiredError):
            pass  # no longer held: there is nothing left to release
        except StoreClosedError:
            self.close()
        except Exception:
            if exc_type is None:
                raise

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
