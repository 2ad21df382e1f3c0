"""The typed values an import or export passes: where a run of a source came from, the events it holds, what was
written, and the records an Emelex export carries."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..assets.refs import AssetRef
from ..errors import InvalidInputError

_FORMAT = re.compile(r"[a-z][a-z0-9-]{0,31}\Z")
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class ImportSource:
    """One run of a source being imported: its `format` ("claude-code", "codex", ...), `key` (the conversation it
    holds, stable across runs: a grown file keeps its key), the `path` read, the 1-based lines (or database rows)
    `first_line`..`last_line`, `byte_end` (bytes of the file through `last_line`; for rows, the last row ID), the
    SHA-256 `prefix_digest` of the source through `last_line`, and how many lines were `skipped` (kinds the importer
    does not read) or had an event `cut` to the size cap."""

    format: str
    key: str
    path: str
    first_line: int
    last_line: int
    byte_end: int
    prefix_digest: str
    skipped: int = 0
    cut: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or not _FORMAT.match(self.format):
            raise InvalidInputError(f"an import format is a lowercase name of 1-32 characters, got {self.format!r}")
        for name, text, cap in (("key", self.key, 1024), ("path", self.path, 4096)):
            if not isinstance(text, str) or not 1 <= len(text.encode("utf-8", "surrogatepass")) <= cap:
                raise InvalidInputError(f"an import source's {name} is 1 to {cap} bytes of text")
        if not (isinstance(self.first_line, int) and isinstance(self.last_line, int)
                and 1 <= self.first_line <= self.last_line):
            raise InvalidInputError(f"an import reads lines first..last with 1 <= first <= last, got "
                                    f"{self.first_line}..{self.last_line}")
        if not isinstance(self.byte_end, int) or self.byte_end < 0:
            raise InvalidInputError(f"an import's byte_end is a non-negative integer, got {self.byte_end!r}")
        if not isinstance(self.prefix_digest, str) or not _DIGEST.match(self.prefix_digest):
            raise InvalidInputError("an import's prefix_digest is 64 lowercase hex characters (SHA-256)")


@dataclass(frozen=True)
class ImportedEvent:
    """An event of an imported history: its kind and payload as for `NewEvent`, when it happened (`created_at`,
    seconds since the epoch, from the source), and whether it opens a new turn (a user's message does)."""

    kind: str
    payload: Any
    created_at: float
    new_turn: bool = False


@dataclass(frozen=True)
class ImportRecord:
    """One committed import run (a row of `imports`): the Session it went into, the `ImportSource` fields, the events
    it wrote (`first_seq`..`last_seq`, None when its lines held none) and when."""

    session_id: str
    format: str
    key: str
    path: str
    first_line: int
    last_line: int
    byte_end: int
    prefix_digest: str
    first_seq: int | None
    last_seq: int | None
    skipped: int
    cut: int
    imported_at: float


@dataclass(frozen=True)
class ImportOutcome:
    """What an import run wrote: the Session (`created` when it made it), the run's record, and the distillation job
    it queued (None when it queued none)."""

    session_id: str
    created: bool
    record: ImportRecord
    distillation: Any = None


# -- an Emelex export ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportedEvent:
    """A transcript event as exported: its original event `id` (the Summaries' provenance names event IDs), seq,
    turn, position, kind, canonical JSON `payload_json`, `created_at` and assets."""

    id: int
    seq: int
    turn: int
    position: int
    kind: str
    payload_json: str
    created_at: float
    assets: tuple[AssetRef, ...] = ()


@dataclass(frozen=True)
class ExportedSummary:
    """A Summary's provenance record as exported: the seq of its event, the compaction `job` that wrote it (uuid,
    source, result, created/updated/finished times), the seq of the Summary it compacted again (None for a first),
    the covered range and digests (hex) as recorded, the model reference, and when it was written and reverted."""

    event_seq: int
    job: dict[str, Any]
    base_event_seq: int | None
    through_seq: int
    source_count: int
    first_event_id: int
    last_event_id: int
    source_digest: str
    summary_digest: str
    model_ref: str | None
    created_at: float
    reverted_at: float | None = None
    producer: dict[str, str] | None = None  # the plugin that wrote it (`emelex_memory.core.producer`), if recorded


@dataclass(frozen=True)
class ExportedSession:
    """A Session as exported: its public ID, title, workspace path, times, its execution snapshot (canonical JSON
    and digest, or None), how many events follow it, its Summaries' records, the lowest and highest ID of its
    events (None without events), and, for an imported Session, its import runs oldest first (where its events came
    from, so that importing the same history again in another Home continues this Session)."""

    id: str
    title: str | None
    workspace: str
    created_at: float
    updated_at: float
    snapshot: dict[str, Any] | None
    events: int
    summaries: tuple[ExportedSummary, ...] = field(default=())
    id_range: tuple[int, int] | None = None
    imports: tuple[ImportRecord, ...] = field(default=())


@dataclass(frozen=True)
class ExportedVersion:
    """One Knowledge version as exported: every column of the version, its source as (Session ID, first seq, last
    seq, digest) or None."""

    version: int
    content: str | None
    confidence: float
    origin: str
    source: tuple[str, int, int, str] | None
    created_at: float
    client: str | None = None
    said_at: float | None = None  # when its statement was said (None in an export made before it: created_at)
    producer: dict[str, str] | None = None  # the plugin whose distiller wrote it, if recorded


@dataclass(frozen=True)
class ExportedEntry:
    """A Knowledge entry as exported: its workspace path, key, pin, tombstone time, times, and its versions oldest
    first (versions pruned by retention are absent: the first is `versions[0].version`)."""

    workspace: str
    key: str
    pinned: bool
    tombstoned_at: float | None
    created_at: float
    updated_at: float
    versions: tuple[ExportedVersion, ...]
