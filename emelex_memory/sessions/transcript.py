"""Transcript events: validation of new turns and byte-bounded replay pages."""

from __future__ import annotations

import json
import re
from collections import namedtuple
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import apsw

from ..assets.refs import AssetRef
from ..assets.links import attach_assets
from ..errors import CorruptEventError, InvalidEventError, JsonTooLargeError, PageTooSmallError, ReservedEventKindError
from ..core.jsonbound import encode_bounded, encode_streaming
from ..core.settings import Settings

SUMMARY_KIND = "summary"
_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")


@dataclass(frozen=True)
class NewEvent:
    """An event to append: a kind (lowercase identifier, e.g. "user", "assistant", "tool_result"), a JSON payload
    and the `AssetRef`s (from `put_asset`) it links, at most 64."""

    kind: str
    payload: Any = field(default=None)
    assets: tuple[AssetRef, ...] = ()


_EventFields = namedtuple(
    "_EventFields", "id seq turn position kind payload_json size byte_end created_at asset_refs"
)


class Event(tuple):
    """One durable transcript event as replayed: a tuple of the fields in `_fields`, read by name.

    `payload_json` is the stored canonical JSON text and `size` its UTF-8
    bytes; `byte_end` is the Session's transcript bytes through this event
    (the running total of `size`). `asset_refs` is None for an event without
    assets (so replaying those stays a plain row copy); read `assets` instead,
    which is always a tuple. Build one from a tuple of all ten fields,
    `Event(values)`; replay builds them straight from its rows in C, which is
    why this is a plain tuple subclass rather than a `NamedTuple`.
    """

    __slots__ = ()
    _fields = _EventFields._fields

    id: int
    seq: int
    turn: int
    position: int
    kind: str
    payload_json: str
    size: int
    byte_end: int
    created_at: float
    asset_refs: tuple[AssetRef, ...] | None

    def __repr__(self) -> str:
        return "Event(" + ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self)) + ")"

    def _replace(self, **changes: Any) -> Event:
        """A copy with the named fields changed, as `NamedTuple._replace` does."""
        return Event(_EventFields._make(self)._replace(**changes))

    def _asdict(self) -> dict[str, Any]:
        """The fields by name."""
        return dict(zip(self._fields, self))

    @property
    def payload(self) -> Any:
        """The decoded payload; raises `CorruptEventError` when the stored text is not valid JSON (the database was
        altered: `append_turn` only stores canonical JSON)."""
        try:
            return json.loads(self.payload_json)
        except (ValueError, RecursionError):
            raise CorruptEventError(
                f"event seq {self.seq} (ID {self.id}) has a stored payload that is not valid JSON; the database was "
                "altered, restore the database from a backup"
            ) from None

    @property
    def assets(self) -> tuple[AssetRef, ...]:
        """The event's assets in ordinal order, verified against their links by replay."""
        return self.asset_refs or ()


for _name in _EventFields._fields:  # the C field accessors of the equivalent namedtuple work on any tuple
    setattr(Event, _name, getattr(_EventFields, _name))
del _name


@dataclass(frozen=True)
class ReplayPage:
    """A page of events. `next_cursor` is the seq to pass as `after_seq` next; `done` means nothing followed.

    `media_bytes` is the total size of the assets the page's events refer to.
    """

    events: list[Event]
    next_cursor: int
    done: bool
    media_bytes: int = 0


def media_of(events: Iterable[Event]) -> int:
    """The total size of the assets `events` refer to."""
    return sum(ref.size for event in events if event.asset_refs for ref in event.asset_refs)


class AppendedTurn(NamedTuple):
    """What `append_turn` committed: the turn ID, the seq range and the event IDs."""

    turn: int
    first_seq: int
    last_seq: int
    event_ids: tuple[int, ...]


class EncodedEvent(NamedTuple):
    """A validated event ready to insert."""

    kind: str
    payload: str
    size: int


_new_encoded = partial(tuple.__new__, EncodedEvent)
_CHECKED_KINDS: set[str] = set()  # ordinary kinds already validated, so each turn skips the regex


def _check_kind(kind: object, index: int) -> None:
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise InvalidEventError(
            f"event {index} of the turn has kind {kind!r}; kinds are lowercase identifiers of 1-32 chars"
        )
    if kind == SUMMARY_KIND:
        raise ReservedEventKindError("summary events are reserved for the compaction worker; use another kind")
    if len(_CHECKED_KINDS) < 1024:
        _CHECKED_KINDS.add(kind)


def encode_turn(events: list[NewEvent] | tuple[NewEvent, ...], settings: Settings) -> list[EncodedEvent]:
    """Validate and canonically encode one turn's events, enforcing every cap; raise a typed error otherwise."""
    if not events:
        raise InvalidEventError("a turn needs at least one event")
    if len(events) > settings.max_events_per_turn:
        raise InvalidEventError(f"a turn holds at most {settings.max_events_per_turn} events, got {len(events)}")
    encoded = []
    remaining = turn_cap = settings.max_turn_bytes
    event_cap = settings.max_event_bytes
    depth = settings.max_json_depth
    for index, event in enumerate(events):
        if type(event) is not NewEvent and not isinstance(event, NewEvent):
            raise InvalidEventError(f"event {index} of the turn is a {type(event).__name__}, expected NewEvent")
        kind = event.kind
        if kind not in _CHECKED_KINDS:
            _check_kind(kind, index)
        cap = event_cap if event_cap <= remaining else remaining
        encoded_payload = encode_bounded(event.payload, cap, depth)
        if encoded_payload is None:  # the streaming encoder decides, and names the event in any refusal
            try:
                encoded_payload = encode_streaming(
                    event.payload, max_bytes=cap, max_depth=depth, what=f"event {index} of the turn"
                )
            except JsonTooLargeError:
                if cap < event_cap:
                    raise JsonTooLargeError(f"the turn is larger than its cap of {turn_cap} bytes") from None
                raise
        text, size = encoded_payload
        remaining -= size
        encoded.append(_new_encoded((kind, text, size)))
    return encoded


_REPLAY_SQL = (
    "SELECT id, seq, turn, position, kind, payload, size, byte_end, created_at, asset_refs FROM events "
    "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
_HEAD_SQL = "SELECT seq, turn, byte_end, media_end FROM events WHERE session_id = ? ORDER BY seq DESC LIMIT 1"


def session_head(conn: apsw.Connection, session_rowid: int) -> tuple[int, int, int, int]:
    """(newest seq, newest turn, transcript bytes, media bytes) of a Session, read from its newest event; zeros when
    it has none."""
    return conn.execute(_HEAD_SQL, (session_rowid,)).fetchone() or (0, 0, 0, 0)


def read_page(
    conn: apsw.Connection, session_rowid: int, after_seq: int, limit: int, max_bytes: int, *, partial: bool = False
) -> ReplayPage:
    """Read up to `limit` events after `after_seq` whose sizes add up to at most `max_bytes`.

    Assets are verified against their links, and a page refers to at most
    256 MiB of media (see `assets/links.py: attach_assets`), counted in
    `media_bytes`. A page always
    progresses: when the next event alone is larger than `max_bytes` (the
    page settings were lowered after it was stored) this raises
    `PageTooSmallError` rather than returning an empty page that is not
    done. `partial` is for the rest of a page that already holds an event
    (a Summary shown first), which may come back empty instead.
    """
    events = list(map(Event, conn.execute(_REPLAY_SQL, (session_rowid, after_seq, limit + 1))))
    read = len(events)
    del events[limit:]
    # byte_end is a running total, so this is the page's byte count without summing it row by row.
    if events and events[-1].byte_end - events[0].byte_end + events[0].size > max_bytes:
        total = 0
        for n, event in enumerate(events):
            total += event.size
            if total > max_bytes:
                if n == 0 and not partial:
                    raise _too_large(conn, session_rowid, event, max_bytes)
                del events[n:]
                break
    events, media = attach_assets(conn, session_rowid, events)
    done = len(events) == read
    return ReplayPage(events, events[-1].seq if events else after_seq, done, media)


def _too_large(conn: apsw.Connection, session_rowid: int, event: Event, max_bytes: int) -> PageTooSmallError:
    row = conn.execute("SELECT uuid FROM sessions WHERE id = ?", (session_rowid,)).fetchone()
    return PageTooSmallError(
        f"event seq {event.seq} of Session {row[0] if row else session_rowid} holds {event.size} bytes, more than "
        f"this page may hold ({max_bytes} bytes): page_bytes or max_event_bytes was lowered after it was stored; "
        f"raise EMELEX_PAGE_BYTES (and any max_bytes passed) to at least {event.size}"
    )
