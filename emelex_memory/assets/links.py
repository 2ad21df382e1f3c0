"""Links between transcript events and assets: written by `append_turn`, verified by replay.

An event with assets records them twice, in the same transaction: in its own
`asset_refs` column (digest, size and media kind in ordinal order) and as
`event_assets` rows (event, ordinal, digest, media kind) pointing at catalog
entries. Replay checks both records and the catalog against each other for
every event of a page, and bounds the media a page refers to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import apsw

from .refs import MAX_ASSETS_PER_EVENT, MAX_REPLAY_MEDIA_BYTES, AssetRef
from .catalog import check_catalogued
from .files import stat_asset
from .folder import AssetFolder
from ..errors import (
    AssetLinkMismatchError,
    AssetMediaCapError,
    InvalidAssetError,
    ReplayMediaCapError,
    SessionNotFoundError,
)

E = TypeVar("E", bound="StoredEvent")


class NewEvent(Protocol):
    """What `turn_assets` reads of an event about to be appended (`sessions.transcript.NewEvent`)."""

    @property
    def assets(self) -> Any: ...


class StoredEvent(Protocol):
    """What a replay page's checks read of a stored event (`sessions.transcript.Event`); the assets package never
    imports the transcript, which imports it."""

    @property
    def id(self) -> int: ...

    @property
    def seq(self) -> int: ...

    @property
    def asset_refs(self) -> Any: ...

    def _replace(self: E, **changes: Any) -> E: ...


def turn_assets(events: Sequence[NewEvent]) -> list[tuple[int, tuple[AssetRef, ...]]]:
    """Validate the assets of a turn's events before any write; return (position, refs) for events that have some."""
    linked = []
    for index, event in enumerate(events):
        refs = event.assets
        if not refs:
            continue
        if not isinstance(refs, (tuple, list)) or not all(isinstance(r, AssetRef) for r in refs):
            raise InvalidAssetError(f"event {index} of the turn: assets must be a tuple of AssetRef values")
        if len(refs) > MAX_ASSETS_PER_EVENT:
            raise InvalidAssetError(
                f"event {index} of the turn has {len(refs)} assets; at most {MAX_ASSETS_PER_EVENT} per event"
            )
        media = sum(r.size for r in refs)
        if media > MAX_REPLAY_MEDIA_BYTES:
            raise AssetMediaCapError(
                f"event {index} of the turn refers to {media} bytes of media, over the {MAX_REPLAY_MEDIA_BYTES} "
                "byte replay cap; spread the assets over several events"
            )
        linked.append((index, tuple(refs)))
    return linked


def link_turn_assets(
    conn: apsw.Connection,
    folder: AssetFolder,
    session_rowid: int,
    first_seq: int,
    linked: list[tuple[int, tuple[AssetRef, ...]]],
    now: float,
) -> None:
    """Inside `append_turn`'s transaction: check every ref against the catalog and its file, then link it.

    `first_seq` is the seq of the turn's first event. A ref without a catalog
    entry raises `AssetNotFoundError`, one whose size disagrees raises
    `AssetMismatchError`, and a missing or altered file raises the matching
    asset error; the caller's transaction then rolls the whole turn back.
    """
    for position, refs in linked:
        seq = first_seq + position
        for ref in refs:
            check_catalogued(conn, ref, "; nothing was written")
            stat_asset(folder.require(), ref.digest, ref.size)
        conn.execute(
            "UPDATE events SET asset_refs = ? WHERE session_id = ? AND seq = ?",
            (_encode(refs), session_rowid, seq),
        )
        conn.executemany(
            "INSERT INTO event_assets (session_id, seq, ordinal, digest, media_kind) VALUES (?, ?, ?, ?, ?)",
            [(session_rowid, seq, i, r.digest, r.media_kind) for i, r in enumerate(refs)],
        )
        conn.executemany(
            "UPDATE assets SET touched_at = max(touched_at, ?) WHERE digest = ? AND media_kind = ?",
            [(now, r.digest, r.media_kind) for r in refs],
        )


def _encode(refs: tuple[AssetRef, ...]) -> str:
    return json.dumps([[r.digest, r.size, r.media_kind] for r in refs], separators=(",", ":"))


_ANY_ASSETS_SQL = (  # does any event in a seq span record assets (partial index events_with_assets) or have links?
    "SELECT EXISTS (SELECT 1 FROM events WHERE session_id = ?1 AND seq BETWEEN ?2 AND ?3 AND asset_refs IS NOT NULL) "
    "OR EXISTS (SELECT 1 FROM event_assets WHERE session_id = ?1 AND seq BETWEEN ?2 AND ?3)"
)
_LINKS_SQL = (
    "SELECT l.seq, l.ordinal, l.digest, l.media_kind, a.size FROM event_assets l "
    "LEFT JOIN assets a ON a.digest = l.digest AND a.media_kind = l.media_kind "
    "WHERE l.session_id = ? AND l.seq BETWEEN ? AND ? ORDER BY l.seq, l.ordinal"
)


def attach_assets(conn: apsw.Connection, session_rowid: int, events: list[E]) -> tuple[list[E], int]:
    """Verify and attach the assets of a replay page's events; return the events, possibly fewer, and their media.

    Each event's recorded refs must match its links exactly (count, ordinals,
    digests, media kinds) and the catalog (entry present, same size), and an
    event without refs must have no links; otherwise `AssetLinkMismatchError`.
    The page ends before the event that would take its media over 256 MiB
    (`append_turn` keeps every event, and the whole replay view, within that
    cap, so a page always progresses; an event over it is reported as a
    mismatch).
    """
    if not events:
        return events, 0
    span = (session_rowid, events[0].seq, events[-1].seq)
    if not conn.execute(_ANY_ASSETS_SQL, span).fetchone()[0]:
        return events, 0  # the common case costs one statement of two index probes
    links = conn.execute(_LINKS_SQL, span).fetchall()
    by_seq: dict[int, list[tuple]] = {}
    for link in links:
        by_seq.setdefault(link[0], []).append(link)
    out: list[E] = []
    media = 0
    for event in events:
        found = by_seq.get(event.seq, [])
        if event.asset_refs is None:
            if found:
                raise _mismatch(event, f"has {len(found)} asset links but records no assets")
            out.append(event)
            continue
        refs = _decode(event)
        try:
            _check_links(event, refs, found)
        except AssetLinkMismatchError:
            if not conn.execute("SELECT 1 FROM events WHERE id = ?", (event.id,)).fetchone():
                raise SessionNotFoundError("the Session was deleted while it was being replayed") from None
            raise
        size = sum(r.size for r in refs)
        if media + size > MAX_REPLAY_MEDIA_BYTES:
            if not out:
                raise _mismatch(event, f"refers to {size} bytes of media, over the {MAX_REPLAY_MEDIA_BYTES} byte cap")
            break
        media += size
        out.append(event._replace(asset_refs=refs))
    return out, media


_VIEW_START_SQL = (  # the media total through the raw seq the newest Summary in effect covers: where the view begins
    "SELECT e.media_end FROM summaries r JOIN events e ON e.session_id = r.session_id AND e.seq = r.through_seq "
    "WHERE r.session_id = ? AND r.reverted_at IS NULL ORDER BY r.event_id DESC LIMIT 1"
)


def view_media(conn: apsw.Connection, session_rowid: int, media_end: int) -> int:
    """The bytes of media the Session's replay view refers to once its running media total reaches `media_end`.

    The view is the newest Summary in effect (which refers to no assets) and
    the events after the raw seq it covers, so its media is `media_end` less
    the total through that seq (nothing, for a Session without a Summary in
    effect).
    """
    row = conn.execute(_VIEW_START_SQL, (session_rowid,)).fetchone()
    return media_end - (row[0] if row else 0)


def replay_media_cap() -> int:
    """The most bytes of media one replay of a Session may refer to (`MAX_REPLAY_MEDIA_BYTES`)."""
    return MAX_REPLAY_MEDIA_BYTES


def check_view_media(conn: apsw.Connection, session_rowid: int, media_end: int, session_id: str) -> None:
    """Inside `append_turn`'s transaction: raise `AssetMediaCapError` unless the Session's replay view, once its
    running media total reaches `media_end`, refers to at most 256 MiB (see `view_media`)."""
    view = view_media(conn, session_rowid, media_end)
    if view > MAX_REPLAY_MEDIA_BYTES:
        raise AssetMediaCapError(
            f"this turn would take the replay of Session {session_id} to {view} bytes of media, over the "
            f"{MAX_REPLAY_MEDIA_BYTES} byte replay cap; nothing was written: link fewer or smaller assets, or "
            "compact the Session first"
        )


def check_replay_media(total: int, session_id: str) -> None:
    """Raise `ReplayMediaCapError` when a replay of the Session has handed out `total` bytes of media, over the cap."""
    if total > MAX_REPLAY_MEDIA_BYTES:
        raise ReplayMediaCapError(
            f"the replay of Session {session_id} refers to {total} bytes of media, over the {MAX_REPLAY_MEDIA_BYTES} "
            "byte replay cap that appends enforce; the database was altered or written by an older Emelex: compact "
            "the Session or restore it from a backup"
        )


def _mismatch(event: StoredEvent, what: str) -> AssetLinkMismatchError:
    return AssetLinkMismatchError(
        f"transcript event seq {event.seq} {what}; the database was altered, restore it from a backup"
    )


def _decode(event: StoredEvent) -> tuple[AssetRef, ...]:
    try:
        raw: Any = json.loads(event.asset_refs)  # type: ignore[arg-type]
        return tuple(AssetRef(d, s, k) for d, s, k in raw)
    except (ValueError, TypeError, InvalidAssetError):
        raise _mismatch(event, "has malformed recorded assets") from None


def _check_links(event: StoredEvent, refs: tuple[AssetRef, ...], found: list[tuple]) -> None:
    if len(found) != len(refs):
        raise _mismatch(event, f"records {len(refs)} assets but has {len(found)} links")
    for ordinal, (ref, link) in enumerate(zip(refs, found)):
        _, linked_ordinal, digest, media_kind, size = link
        if linked_ordinal != ordinal or digest != ref.digest or media_kind != ref.media_kind:
            raise _mismatch(event, f"asset {ordinal} ({ref.digest} {ref.media_kind}) disagrees with its link")
        if size != ref.size:
            raise _mismatch(event, f"asset {ordinal} ({ref.digest}) is not catalogued with {ref.size} bytes")
