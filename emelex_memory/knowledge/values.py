"""Knowledge: the schema, the immutable value types and input validation.

A Knowledge entry is one `key` in one known workspace (a row of `workspaces`,
identified by the directory's identity rather than its path; m009_workspaces moved the
table onto it, see `sessions/workspaces.py`). Every change to an entry's
content appends an immutable, numbered version (an upsert or a tombstone);
the entry row only points at its newest version and carries the pin.
"""

from __future__ import annotations

import base64
import math
import re
import unicodedata
from dataclasses import dataclass

from ..core.cursors import MAX_SQL_INT, cursor_int
from ..core.paging import Items, Page
from ..core.producer import producer_from
from ..errors import InvalidInputError, InvalidKnowledgeError

MAX_KEY_BYTES = 256
MAX_CONTENT_BYTES = 64 * 1024
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")



@dataclass(frozen=True)
class KnowledgeSource:
    """Immutable transcript provenance: a Session, an inclusive seq range of its events and their digest.

    `session_deleted` is True when read back after the source Session was
    deleted: the ID, range and digest remain for audit.
    """

    session_id: str
    first_seq: int
    last_seq: int
    digest: str
    session_deleted: bool = False


@dataclass(frozen=True)
class KnowledgeVersion:
    """One immutable version of an entry. A tombstone has no content and keeps the retired confidence, source and
    `said_at`. `said_at` is when its statement was said: the time of the source event a distillation took it from
    (else the last event of its provenance range), or, without provenance, when the version was written."""

    key: str
    version: int
    content: str | None
    confidence: float
    tombstone: bool
    origin: str
    source: KnowledgeSource | None
    created_at: float
    said_at: float
    client: str | None = None  # the program that wrote it through remember/forget (an MCP client), if it said
    producer: dict[str, str] | None = None  # the plugin whose distiller wrote it (`emelex_memory.core.producer`)


@dataclass(frozen=True)
class KnowledgeEntry:
    """An entry with its newest version (`head`) and its pin."""

    key: str
    pinned: bool
    head: KnowledgeVersion
    created_at: float
    updated_at: float

    @property
    def tombstoned(self) -> bool:
        """True when the newest version is a tombstone (the entry is forgotten)."""
        return self.head.tombstone

    @property
    def content(self) -> str | None:
        """The current content, None when tombstoned."""
        return self.head.content

    @property
    def confidence(self) -> float:
        """The confidence of the newest version."""
        return self.head.confidence


@dataclass(frozen=True)
class KnowledgePage(Page[KnowledgeEntry]):
    """A page of entries ordered by key. Pass `next_cursor` back to continue; None after the last page."""

    entries = Items[KnowledgeEntry]()


@dataclass(frozen=True)
class KnowledgeHistoryPage:
    """Versions oldest first after an exclusive version cursor; pass `next_cursor` on; `done` means no more."""

    versions: list[KnowledgeVersion]
    next_cursor: int
    done: bool


# -- validation -----------------------------------------------------------------------


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKnowledgeError(f"{what} contains a lone surrogate; pass valid Unicode text") from None


def validate_key(key: object) -> str:
    """Return `key` if it is 1-256 UTF-8 bytes without control characters or surrounding whitespace."""
    if not isinstance(key, str) or not key:
        raise InvalidKnowledgeError("a Knowledge key must be a non-empty string")
    data = _utf8(key, "the Knowledge key")
    if len(data) > MAX_KEY_BYTES:
        raise InvalidKnowledgeError(f"a Knowledge key is at most {MAX_KEY_BYTES} UTF-8 bytes, got {len(data)}")
    if key != key.strip() or any(unicodedata.category(ch) == "Cc" for ch in key):
        raise InvalidKnowledgeError(f"Knowledge key {key!r} has control characters or surrounding whitespace")
    return key


def validate_content(content: object) -> str:
    """Return `content` if it is a non-blank string of at most 64 KiB UTF-8."""
    if not isinstance(content, str) or not content.strip():
        raise InvalidKnowledgeError("Knowledge content must be a non-blank string")
    size = len(_utf8(content, "Knowledge content"))
    if size > MAX_CONTENT_BYTES:
        raise InvalidKnowledgeError(f"Knowledge content is at most {MAX_CONTENT_BYTES} UTF-8 bytes, got {size}")
    return content


def validate_confidence(confidence: object) -> float:
    """Return `confidence` as a float if it is a finite number in [0, 1]."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not math.isfinite(confidence):
        raise InvalidKnowledgeError(f"confidence must be a number between 0 and 1, got {confidence!r}")
    if not 0.0 <= confidence <= 1.0:
        raise InvalidKnowledgeError(f"confidence must be between 0 and 1, got {confidence}")
    return float(confidence)


def validate_source(source: object) -> KnowledgeSource | None:
    """Check the shape of optional provenance (the store checks it against the transcript)."""
    if source is None:
        return None
    if not isinstance(source, KnowledgeSource):
        raise InvalidKnowledgeError(f"provenance must be a KnowledgeSource, got {type(source).__name__}")
    if not isinstance(source.session_id, str) or not 1 <= len(source.session_id) <= 64:
        raise InvalidKnowledgeError("provenance needs the source Session ID")
    _utf8(source.session_id, "the provenance Session ID")
    for name in ("first_seq", "last_seq"):
        value = getattr(source, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SQL_INT:
            raise InvalidKnowledgeError(f"provenance {name} must be an integer between 1 and {MAX_SQL_INT}, got {value!r}")
    if source.first_seq > source.last_seq:
        raise InvalidKnowledgeError(f"provenance range {source.first_seq}..{source.last_seq} is empty")
    if not isinstance(source.digest, str) or not _DIGEST.match(source.digest):
        raise InvalidKnowledgeError("provenance digest must be 64 lowercase hex characters (SHA-256)")
    return source


# -- rows and cursors -------------------------------------------------------------------

VERSION_COLUMNS = (
    "v.version, v.content, v.confidence, v.tombstone, v.origin, v.source_session_uuid, v.source_first_seq, "
    "v.source_last_seq, v.source_digest, v.source_session_id IS NULL, v.created_at, v.said_at, v.client, v.producer, "
    "v.size"
)


def version_from_row(key: str, row: tuple) -> KnowledgeVersion:
    """Build a `KnowledgeVersion` from a row selected with `VERSION_COLUMNS`."""
    version, content, confidence, tombstone, origin, s_uuid, s_first, s_last, s_digest, s_gone, created, said, client = row[:13]
    source = None if s_uuid is None else KnowledgeSource(s_uuid, s_first, s_last, s_digest, bool(s_gone))
    return KnowledgeVersion(key, version, content, confidence, bool(tombstone), origin, source, created, said, client,
                            producer_from(row[13]))


MAX_CLIENT_CHARS = 200


def validate_client(client: object) -> str | None:
    """Return `client` (None, or a name of 1-200 characters without control characters) or raise
    `InvalidKnowledgeError`."""
    if client is None:
        return None
    if not isinstance(client, str) or not 1 <= len(client) <= MAX_CLIENT_CHARS or client != client.strip() \
            or any(unicodedata.category(ch) == "Cc" for ch in client):
        raise InvalidKnowledgeError(
            f"a client name is 1 to {MAX_CLIENT_CHARS} characters without control characters or surrounding "
            f"whitespace, got {client!r}"
        )
    _utf8(client, "the client name")
    return client


def encode_cursor(key: str, rowid: int) -> str:
    """An opaque `(key, id)` page cursor."""
    return base64.urlsafe_b64encode(key.encode("utf-8")).decode("ascii").rstrip("=") + f".{rowid}"


def decode_cursor(cursor: str) -> tuple[str, int]:
    """Parse a cursor made by `encode_cursor`; raise `InvalidInputError` otherwise."""
    try:
        raw, rowid = cursor.rsplit(".", 1)
        key = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_", validate=True).decode("utf-8")
        return key, cursor_int(rowid)
    except (AttributeError, ValueError, UnicodeDecodeError):
        raise InvalidInputError(f"bad Knowledge cursor {cursor!r}; pass a next_cursor from a previous page") from None
