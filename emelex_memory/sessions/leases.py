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

import functools
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from stat import S_ISDIR
from typing import TypeVar

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
from .holders import live_lease, open_journal
from .identity import WorkspaceIdentity, rebind_advice
from .replay import replay_page
from .transcript import AppendedTurn, EncodedEvent, Event, NewEvent, ReplayPage, encode_turn, media_of

MAX_FAILURE_CHARS = 2000
T = TypeVar("T")

# What an append re-checks, in one statement: the Session's workspace and the epoch of its row (m011: every change of
# the workspace row bumps it, so equal numbers mean the row the lease verified is unchanged), the lease, and the head
# (newest seq, turn, byte_end and media_end, all None for an empty Session) read from the Session's newest event, and
# whether the Session has an open agent journal.
_AUTHORITY_SQL = (
    "SELECT s.workspace_id, s.workspace_epoch, l.token_hash, l.state, l.expires_at, e.seq, e.turn, e.byte_end, "
    f"e.media_end, {open_journal('s.id')} FROM sessions s JOIN session_leases l ON l.session_id = s.id "
    "LEFT JOIN events e ON e.id = (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1) "
    "WHERE s.id = ?1"
)
_INSERT_SQL = (
    "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, media_end, created_at) VALUES "
)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


@functools.lru_cache(maxsize=None)
def _insert_sql(count: int) -> str:
    """The one `INSERT` of `count` events: a turn is written by one statement, not one per event, because FTS5 flushes
    its pending terms into a new index segment at every statement that writes it (the search index's triggers), so a
    turn written event by event costs a segment per event."""
    return _INSERT_SQL + ", ".join([_ROW] * count)


@functools.lru_cache(maxsize=None)
def _checked_insert_sql(count: int, journaled: bool) -> str:
    """The one `INSERT` of a turn of `count` events without media that inserts only when what `_AUTHORITY_SQL` reads
    is what the lease expects: the Session's workspace and epoch, the lease token, state and expiry, no open agent
    journal (unless `journaled`), and the head the lease last wrote. It inserts all of the rows or none: `changes()`
    tells which. Bound: ?1 Session row ID, ?2 workspace ID, ?3 epoch, ?4 token digest, ?5 now, ?6-?9 that head (seq,
    turn, byte_end, media_end), then each event's kind, payload, size and byte_end. The rest of a row follows from
    those: seq and position from the head and the event's place, the next turn, the unchanged media_end, created_at
    now. The rows come from one `VALUES` list joined to the one row of the check, so they are inserted in order."""
    journal = "" if journaled else f"AND NOT {open_journal('?1')} "
    rows = ", ".join(f"({i}, ?{10 + 4 * i}, ?{11 + 4 * i}, ?{12 + 4 * i}, ?{13 + 4 * i})" for i in range(count))
    return (
        _INSERT_SQL.removesuffix("VALUES ") + "SELECT ?1, ?6 + 1 + v.column1, ?7 + 1, v.column1, v.column2, v.column3, "
        "v.column4, v.column5, ?9, ?5 FROM (SELECT 1 FROM sessions s JOIN session_leases l ON l.session_id = s.id "
        "WHERE s.id = ?1 AND s.workspace_id = ?2 AND s.workspace_epoch = ?3 AND l.token_hash = ?4 "
        f"AND {live_lease('l', '?5')} {journal}AND (SELECT seq, turn, byte_end, media_end FROM events "
        f"WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1) = (?6, ?7, ?8, ?9)) CROSS JOIN (VALUES {rows}) AS v"
    )


def _turn_rows(
    encoded: Sequence[EncodedEvent], rowid: int, last_seq: int, turn: int, byte_end: int, media_end: int,
    media: dict[int, int] | None, now: float,
) -> tuple[list, int, int]:
    """The bindings of a turn's rows, one after the other, as the one INSERT binds them, after a head at `last_seq`
    with `byte_end` and `media_end`: consecutive seqs and positions, the running byte total, and the media total
    growing by `media` (position -> bytes; None: none); with the turn's last byte_end and media_end."""
    values: list = []
    media = media or {}
    for i, e in enumerate(encoded):
        byte_end += e.size
        media_end += media.get(i, 0)
        values += (rowid, last_seq + i + 1, turn, i, e.kind, e.payload, e.size, byte_end, media_end, now)
    return values, byte_end, media_end


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
    ) -> None:
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
        self._head: tuple[int, int, int, int] | None = None  # (seq, turn, byte_end, media_end) this lease last wrote
        self._replayed = False
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
                if head is not None and head[0] == expected and not linked and self._same_workspace():
                    now = db.clock()
                    byte_end = head[2]
                    values = [rowid, self.workspace_id, self._epoch, self._digest, now, *head]
                    for e in encoded:  # (kind, payload, size) and the running byte total
                        byte_end += e.size
                        values += e
                        values.append(byte_end)
                    conn.execute(_checked_insert_sql(count, journaled), values)
                    if conn.changes():
                        last_seq, turn, media_end = expected, head[1] + 1, head[3]
                    else:
                        head = None
                else:
                    head = None
                if head is None:
                    row = conn.execute(_AUTHORITY_SQL, (rowid,)).fetchone()
                    now = self._check_authority(row)
                    if row[9] and not journaled:
                        raise OpenJournalError(
                            f"Session {self.session_id} has an open agent turn; only its agent appends until the turn "
                            f"closes: resume the agent, or run `emelex memory sessions recover {self.session_id}`"
                        )
                    last_seq = row[5] or 0
                    if last_seq != expected:
                        raise StaleCursorError(
                            f"Session {self.session_id} is at seq {last_seq} but the caller last saw {expected}; "
                            "replay from your cursor and retry"
                        )
                    turn = (row[6] or 0) + 1
                    if media:
                        check_view_media(conn, rowid, (row[8] or 0) + sum(media.values()), self.session_id)
                    values, byte_end, media_end = _turn_rows(
                        encoded, rowid, last_seq, turn, row[7] or 0, row[8] or 0, media, now
                    )
                    conn.execute(_insert_sql(count), values)
                # Rowids of an INTEGER PRIMARY KEY are max + 1, so under our write lock the turn's IDs are consecutive.
                last_id = conn.last_insert_rowid()
                ids = tuple(range(last_id - count + 1, last_id + 1))
                if linked:
                    with open_asset_folder(db) as folder:
                        link_turn_assets(conn, folder, rowid, last_seq + 1, linked, now)
        except CommitOutcomeUnknownError as exc:
            self._replayed = False  # the cursor check makes the retry safe once the holder has looked again
            self._head = None
            raise restated(
                exc, db.path, f"a turn to Session {self.session_id}",
                f"replay this lease to the end, then append the turn again with expected_seq={expected} (a "
                "StaleCursorError then means it was committed)",
            ) from exc.__cause__
        new_seq = last_seq + count
        self._cursor = new_seq
        self._head = (new_seq, turn, byte_end, media_end)
        if media:
            self._media += sum(media.values())
        return AppendedTurn(turn, last_seq + 1, new_seq, ids)

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
        row = conn.execute(_AUTHORITY_SQL, (self._rowid,)).fetchone()
        now = self._check_authority(row)
        if (row[5] or 0) != self._cursor:
            raise StaleCursorError(
                f"Session {self.session_id} is at seq {row[5] or 0} but this lease last saw {self._cursor}; "
                "replay and retry"
            )
        return now

    def _check_authority(self, row: tuple | None) -> float:
        """Inside a write transaction: verify the lease token and expiry, and the workspace, of an `_AUTHORITY_SQL`
        row (None when the Session or its lease row is gone); return the store's time."""
        now = self._db.clock()
        if row is None or row[2] != self._digest or row[3] != "active":
            raise LeaseLostError(f"this lease on Session {self.session_id} is no longer held; acquire a new one")
        if row[4] <= now:
            raise LeaseExpiredError(f"the lease on Session {self.session_id} expired; acquire a new one and replay")
        try:
            st = os.stat(self._path)
        except (FileNotFoundError, NotADirectoryError):
            st = self._follow_rename()
        except OSError as exc:
            raise file_error(exc, self._path, "checking the workspace") from exc
        if (st.st_dev, st.st_ino) != self._dev_ino or row[1] != self._epoch or row[0] != self.workspace_id \
                or self._pin is None:
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

    def _recheck_workspace(self, row: tuple, st: os.stat_result) -> None:
        """The slow path of `_check_authority`: raise unless the workspace is unchanged. Without the pinned
        directory (the lease was closed but is still active), the identity is read afresh."""
        ws = self.workspace
        if (row[0], row[1]) != (self.workspace_id, self._epoch):
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
            now = self._check_authority(conn.execute(_AUTHORITY_SQL, (self._rowid,)).fetchone())
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
