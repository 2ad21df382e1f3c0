"""Domain-separated SHA-256 digests of a compaction source prefix and of a Summary event.

Source prefix digest (what a compaction job records and completion and replay
re-check). The prefix is a run of events in replay order: the base Summary
(the newest Summary when the job was planned, if any) followed by every
non-Summary event with `base_through_seq < seq <= through_seq`, by seq. Its
digest is

    SHA-256( b"emelex/compaction-source/v1\\x00"
             || frame(event_1) || ... || frame(event_n)
             || u64(n) )

    frame(e) = u64(e.id) || u64(e.seq) || u64(e.turn) || u64(e.position)
               || u64(len(kind)) || kind || u64(len(payload)) || payload
               || u64(len(assets)) || assets

where `u64` is an unsigned 64-bit big-endian integer, `kind` is the event
kind in UTF-8, `payload` the stored canonical JSON bytes (see
`core/jsonbound.py`) and `assets` the event's stored asset references (the JSON
text of `[[sha256, size, media kind], ...]`, see `assets/links.py`), empty for
an event without assets. Length prefixes make the framing unambiguous, the trailing
count binds the number of events, and the domain string keeps these digests
apart from every other SHA-256 in Emelex.

Summary digest: SHA-256( b"emelex/summary/v1\\x00" || u64(len(p)) || p ), with
`p` the Summary event's canonical JSON payload bytes.

A Summary may cover at most `MAX_COVERED_BYTES` (64 MiB) of frames: completion
refuses a larger source, so verifying a Summary (on the replay page that shows
it) re-hashes at most that much, streaming one row at a time.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from dataclasses import dataclass

import apsw

from ..errors import SourceTooLargeError
from .transcript import SUMMARY_KIND

SOURCE_DOMAIN = b"emelex/compaction-source/v1\x00"
SUMMARY_DOMAIN = b"emelex/summary/v1\x00"
_U64 = struct.Struct(">Q").pack
MAX_COVERED_BYTES = 64 * 1024 * 1024  # framed bytes one Summary's source prefix may hold

_SOURCE_ROW = "SELECT id, seq, turn, position, kind, payload, asset_refs FROM events"
_BASE_SQL = f"{_SOURCE_ROW} WHERE id = ? AND session_id = ? AND kind = '{SUMMARY_KIND}'"
_RANGE_SQL = (
    f"{_SOURCE_ROW} WHERE session_id = ? AND seq > ? AND seq <= ? AND kind != '{SUMMARY_KIND}' ORDER BY seq"
)


@dataclass(frozen=True)
class SourceFacts:
    """What a source prefix is: its event count, first and last event IDs, and its digest (hex)."""

    count: int
    first_event_id: int | None
    last_event_id: int | None
    digest: str


def event_frame(
    event_id: int, seq: int, turn: int, position: int, kind: str, payload: str, asset_refs: str | None
) -> bytes:
    """The framed canonical bytes of one event, as hashed into a source digest."""
    k = kind.encode("utf-8")
    p = payload.encode("utf-8")
    a = (asset_refs or "").encode("utf-8")
    return b"".join(
        (_U64(event_id), _U64(seq), _U64(turn), _U64(position), _U64(len(k)), k, _U64(len(p)), p, _U64(len(a)), a)
    )


def digest_prefix(
    conn: apsw.Connection,
    session_rowid: int,
    base_event_id: int | None,
    base_through_seq: int,
    through_seq: int,
    *,
    max_bytes: int | None = None,
) -> SourceFacts:
    """Stream the source prefix from the database and return its facts; reads rows one at a time.

    With `max_bytes`, stops and raises `SourceTooLargeError` as soon as the
    framed bytes read (the frames hashed) exceed it.
    """
    h = hashlib.sha256(SOURCE_DOMAIN)
    count, first, last, size = 0, None, None, 0
    base = () if base_event_id is None else conn.execute(_BASE_SQL, (base_event_id, session_rowid)).fetchall()
    for row in itertools.chain(base, conn.execute(_RANGE_SQL, (session_rowid, base_through_seq, through_seq))):
        frame = event_frame(*row)
        size += len(frame)
        if max_bytes is not None and size > max_bytes:
            raise SourceTooLargeError(
                f"the source prefix holds more than {max_bytes} bytes, over what one Summary may cover; "
                "compact fewer turns at a time"
            )
        h.update(frame)
        count += 1
        first = row[0] if first is None else first
        last = row[0]
    h.update(_U64(count))
    return SourceFacts(count, first, last, h.hexdigest())


def summary_digest(payload: bytes) -> bytes:
    """The domain-separated SHA-256 of a Summary event's canonical payload bytes."""
    return hashlib.sha256(SUMMARY_DOMAIN + _U64(len(payload)) + payload).digest()
