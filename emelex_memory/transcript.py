"""Transcript events: validation of new turns and byte-bounded replay pages."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any, NamedTuple

import apsw

from .assets import AssetRef
from .assets_links import attach_assets
from .errors import InvalidEventError, JsonTooLargeError, ReservedEventKindError
from .jsonbound import encode_canonical_text
from .settings import Settings

SUMMARY_KIND = "summary"
_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")


@dataclass(frozen=True)
class NewEvent:
    """An event to append: a kind (lowercase identifier, e.g. "user", "assistant", "tool_result"), a JSON payload
    and the `AssetRef`s (from `put_asset`) it links, at most 64."""

    kind: str
    payload: Any = field(default=None)
    assets: tuple[AssetRef, ...] = ()


class Event(NamedTuple):
    """One durable transcript event as replayed. `payload_json` is the stored canonical JSON text.

    `asset_refs` is None for an event without assets (so replaying those stays
    a plain row copy); read `assets` instead, which is always a tuple.
    """

    id: int
    seq: int
    turn: int
    position: int
    kind: str
    payload_json: str
    size: int
    created_at: float
    asset_refs: tuple[AssetRef, ...] | None = None

    @property
    def payload(self) -> Any:
        """The decoded payload."""
        return json.loads(self.payload_json)

    @property
    def assets(self) -> tuple[AssetRef, ...]:
        """The event's assets in ordinal order, verified against their links by replay."""
        return self.asset_refs or ()


@dataclass(frozen=True)
class ReplayPage:
    """A page of events. `next_cursor` is the seq to pass as `after_seq` next; `done` means nothing followed."""

    events: list[Event]
    next_cursor: int
    done: bool


@dataclass(frozen=True)
class AppendedTurn:
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
        try:
            text, size = encode_canonical_text(
                event.payload, max_bytes=cap, max_depth=depth, what=f"event {index} of the turn"
            )
        except JsonTooLargeError:
            if cap < event_cap:
                raise JsonTooLargeError(f"the turn is larger than its cap of {turn_cap} bytes") from None
            raise
        remaining -= size
        encoded.append(_new_encoded((kind, text, size)))
    return encoded


_REPLAY_SQL = (
    "SELECT id, seq, turn, position, kind, payload, size, created_at, asset_refs FROM events "
    "WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)


# Builds an Event straight from a replay row in C; `Event._make` would add a Python call and a length check per row.
_event_from_row = partial(tuple.__new__, Event)
_SIZE = itemgetter(6)  # Event.size


def read_page(conn: apsw.Connection, session_rowid: int, after_seq: int, limit: int, max_bytes: int) -> ReplayPage:
    """Read up to `limit` events after `after_seq` whose sizes add up to at most `max_bytes`.

    Assets are verified against their links, and a page refers to at most
    256 MiB of media (see `assets_links.attach_assets`).
    """
    events = list(map(_event_from_row, conn.execute(_REPLAY_SQL, (session_rowid, after_seq, limit + 1))))
    read = len(events)
    del events[limit:]
    if sum(map(_SIZE, events)) > max_bytes:
        total = 0
        for n, event in enumerate(events):
            total += event.size
            if total > max_bytes:
                del events[n:]
                break
    events = attach_assets(conn, session_rowid, events)
    done = len(events) == read
    return ReplayPage(events, events[-1].seq if events else after_seq, done)
