"""The Emelex export file: JSON Lines, one record a line, documented in docs/interop.md.

Writing streams `store.export_records()` (one snapshot) to the file, a line at a time (assets in base64 chunks of
768 KiB), so memory stays bounded whatever the store's size; it writes `<file>.partial` (mode 0600) and renames it
when the closing `end` line is written, so a file of that name is always a whole export. Reading it back
(`import_export`) restores each Session and Knowledge entry in a transaction of its own; one that is refused (its
workspace is missing here, it conflicts, it does not verify) is reported and the rest go on.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from emelex_memory import (
    AssetRef,
    EmelexError,
    ExportCounts,
    ExportedAsset,
    ExportedEntry,
    ExportedEvent,
    ExportedSession,
    ExportedSummary,
    ExportedVersion,
    ImportConflictError,
    ImportRecord,
    MemoryStore,
    UnreadableSourceError,
    WorkspaceMissingError,
    create_private_file,
)

from .lines import Line, open_source, read_after

TYPE = "emelex-export"
VERSION = 1
CHUNK = 768 * 1024  # raw bytes per asset_data line (1 MiB of base64)
Progress = Callable[[str, int, int], None]  # (what, done, total)


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def _summary(s: ExportedSummary) -> dict[str, Any]:
    return asdict(s)


def _session(s: ExportedSession) -> dict[str, Any]:
    return {"type": "session", "id": s.id, "title": s.title, "workspace": s.workspace, "created_at": s.created_at,
            "updated_at": s.updated_at, "snapshot": s.snapshot, "events": s.events,
            "id_range": None if s.id_range is None else list(s.id_range),
            "summaries": [_summary(x) for x in s.summaries],
            "imports": [{k: v for k, v in asdict(r).items() if k != "session_id"} for r in s.imports]}


def _event(session_id: str, e: ExportedEvent) -> dict[str, Any]:
    return {"type": "event", "session": session_id, "id": e.id, "seq": e.seq, "turn": e.turn, "position": e.position,
            "kind": e.kind, "created_at": e.created_at, "assets": [[r.digest, r.size, r.media_kind] for r in e.assets],
            "payload": json.loads(e.payload_json)}


def _entry(e: ExportedEntry) -> dict[str, Any]:
    return {"type": "knowledge", "workspace": e.workspace, "key": e.key, "pinned": e.pinned,
            "tombstoned_at": e.tombstoned_at, "created_at": e.created_at, "updated_at": e.updated_at,
            "versions": [{"version": v.version, "content": v.content, "confidence": v.confidence, "origin": v.origin,
                          "source": None if v.source is None else dict(zip(("session", "first_seq", "last_seq",
                                                                             "digest"), v.source)),
                          "created_at": v.created_at, "client": v.client, "said_at": v.said_at,
                          "producer": v.producer} for v in e.versions]}


@dataclass
class ExportReport:
    """What an export wrote: records of each type and the file's lines."""

    path: str
    counts: dict[str, int] = field(default_factory=dict)
    lines: int = 0


def write_export(store: MemoryStore, path: str, progress: Progress | None = None) -> ExportReport:
    """Write an export of `store` to the new file `path` (refused if it exists); return what it holds."""
    partial = path + ".partial"
    if os.path.lexists(path):
        raise UnreadableSourceError(f"{path} already exists; choose a new file name (an export never overwrites one)")
    if os.path.lexists(partial):
        os.unlink(partial)  # a previous export cut short
    report = ExportReport(path, {"assets": 0, "sessions": 0, "events": 0, "knowledge": 0})
    create_private_file(Path(partial))
    try:
        with os.fdopen(os.open(partial, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)), "wb") as out:
            _write_all(store, out, report, progress)
            out.flush()
            os.fsync(out.fileno())
        os.rename(partial, path)
    except BaseException:
        if os.path.lexists(partial):
            os.unlink(partial)
        raise
    return report


def _write_all(store: MemoryStore, out: BinaryIO, report: ExportReport, progress: Progress | None) -> None:
    def emit(record: dict[str, Any]) -> None:
        out.write(_line(record))
        report.lines += 1

    records = store.export_records()
    total: ExportCounts = next(records)
    emit({"type": TYPE, "version": VERSION, "exported_at": time.time(), "counts": asdict(total)})
    current = None
    for record in records:
        if isinstance(record, ExportedAsset):
            ref = record.ref
            chunks = max(1, -(-ref.size // CHUNK))
            emit({"type": "asset", "digest": ref.digest, "size": ref.size, "media_kind": ref.media_kind,
                  "chunks": chunks})
            with store.open_asset(ref) as reader:
                for _ in range(chunks):
                    data = reader.read(CHUNK) or b""
                    emit({"type": "asset_data", "digest": ref.digest, "data": base64.b64encode(data).decode()})
            report.counts["assets"] += 1
            _tick(progress, "assets", report.counts["assets"], total.assets)
        elif isinstance(record, ExportedSession):
            current = record.id
            emit(_session(record))
            report.counts["sessions"] += 1
            _tick(progress, "sessions", report.counts["sessions"], total.sessions)
        elif isinstance(record, ExportedEvent):
            emit(_event(current, record))
            report.counts["events"] += 1
            if report.counts["events"] % 1000 == 0:
                _tick(progress, "events", report.counts["events"], total.events)
        elif isinstance(record, ExportedEntry):
            emit(_entry(record))
            report.counts["knowledge"] += 1
            _tick(progress, "knowledge", report.counts["knowledge"], total.entries)
    emit({"type": "end", "lines": report.lines + 1, "counts": report.counts})


def _tick(progress: Progress | None, what: str, done: int, total: int) -> None:
    if progress is not None:
        progress(what, done, total)


# -- reading an export back ---------------------------------------------------------------------------------------


@dataclass
class RestoreReport:
    """What an import of an export did: per record type, how many were imported, already held ("unchanged") and
    refused, with the first refusals' messages."""

    path: str
    imported: dict[str, int] = field(default_factory=lambda: {"assets": 0, "sessions": 0, "knowledge": 0})
    unchanged: dict[str, int] = field(default_factory=lambda: {"sessions": 0, "knowledge": 0})
    refused: list[str] = field(default_factory=list)
    refused_count: int = 0

    def refuse(self, message: str) -> None:
        """Count a refusal, keeping the first 50 messages."""
        self.refused_count += 1
        if len(self.refused) < 50:
            self.refused.append(message)


def _damaged(path: str, line: Line, what: str) -> ImportConflictError:
    return ImportConflictError(f"{path}:{line.number}: {what}; the export is damaged (the records before it were "
                               "imported, each whole)")


class _NullHash:
    def update(self, data: bytes) -> None:
        pass


def mapped(path: str, mapping: list[tuple[str, str]], workspace: str | None) -> str:
    """Where a workspace recorded at `path` is here: `workspace` when given, else the first `OLD=NEW` mapping whose
    OLD is `path` or a parent of it, else `path` itself."""
    if workspace is not None:
        return workspace
    for old, new in mapping:
        old = old.rstrip("/") or "/"
        if path == old or path.startswith(old.rstrip("/") + "/"):
            return new + path[len(old.rstrip("/")):]
    return path


def import_export(store: MemoryStore, path: str, *, mapping: list[tuple[str, str]] = (), workspace: str | None = None,
                  progress: Progress | None = None) -> RestoreReport:
    """Read the export at `path` back into `store`; see the module docstring."""
    report = RestoreReport(os.path.abspath(path))
    with open_source(path) as handle:
        lines = read_after(handle, 0, 1, _NullHash())
        header = next(lines, None)
        if header is None or not header.obj or header.obj.get("type") != TYPE:
            raise UnreadableSourceError(f"{path} is not an Emelex export (its first line is not an {TYPE} header)")
        if header.obj.get("version") != VERSION:
            raise UnreadableSourceError(f"{path} is an export of format version {header.obj.get('version')!r}; this "
                                        f"Emelex reads version {VERSION}: import it with the Emelex that wrote it")
        counts = header.obj.get("counts") or {}
        pending: Line | None = None
        ended = False
        done_sessions = 0

        def next_line() -> Line | None:
            nonlocal pending
            if pending is not None:
                line, pending = pending, None
                return line
            return next(lines, None)

        while (line := next_line()) is not None:
            obj = line.obj
            if obj is None:
                raise _damaged(path, line, line.problem or "not a record")
            kind = obj.get("type")
            if kind == "asset":
                _restore_asset(store, path, line, lines, report)
            elif kind == "session":
                try:
                    session = _read_session(obj)
                except (KeyError, TypeError, ValueError) as exc:
                    raise _damaged(path, line, f"a session record lacks {exc}") from None
                events = _events(path, session, lines)
                _restore(report, "sessions", f"Session {session.id}", mapped(session.workspace, mapping, workspace),
                         session.workspace, lambda target: store.restore_session(target, session, events))
                events.drain()  # what a refusal left unread
                pending = events.after
                done_sessions += 1
                _tick(progress, "sessions", done_sessions, counts.get("sessions", 0))
            elif kind == "knowledge":
                try:
                    entry = _read_entry(obj)
                except (KeyError, TypeError, ValueError) as exc:
                    raise _damaged(path, line, f"a knowledge record lacks {exc}") from None
                _restore(report, "knowledge", f"Knowledge {entry.key!r}", mapped(entry.workspace, mapping, workspace),
                         entry.workspace, lambda target: store.restore_entry(target, entry))
            elif kind == "end":
                if obj.get("lines") != line.number:
                    raise _damaged(path, line, f"the export says it has {obj.get('lines')} lines, not {line.number}")
                ended = True
            else:
                raise _damaged(path, line, f"a record of unknown type {kind!r}")
        if not ended:
            raise ImportConflictError(f"{path} ends before its closing line: the export was cut short (what it held "
                                      "before the cut was imported, each Session and entry whole)")
    return report


def _restore(report: RestoreReport, kind: str, what: str, target: str, recorded: str,
             restore: Callable[[str], bool]) -> None:
    """Restore one record into `target` (the directory its `recorded` workspace is here), counting the outcome;
    a refusal is counted with its message, never raised."""
    try:
        if not os.path.isdir(target):
            raise WorkspaceMissingError(f"{what} belongs to {recorded}, which does not exist here; create it, or "
                                        "map it with --map OLD=NEW (or --workspace DIR)")
        if restore(target):
            report.imported[kind] += 1
        else:
            report.unchanged[kind] += 1
    except EmelexError as exc:
        report.refuse(str(exc))


def _restore_asset(store: MemoryStore, path: str, line: Line, lines: Iterator[Line], report: RestoreReport) -> None:
    obj = line.obj
    try:
        ref = AssetRef(obj["digest"], obj["size"], obj["media_kind"])
        chunks = int(obj["chunks"])
    except (KeyError, TypeError, ValueError, EmelexError) as exc:
        raise _damaged(path, line, f"an asset record is malformed ({exc})") from None

    def data() -> Iterator[bytes]:
        for _ in range(chunks):
            chunk = next(lines, None)
            if chunk is None or not chunk.obj or chunk.obj.get("type") != "asset_data" \
                    or chunk.obj.get("digest") != ref.digest:
                raise _damaged(path, chunk or line, f"asset {ref.digest} lacks its data")
            try:
                yield base64.b64decode(chunk.obj["data"], validate=True)
            except (ValueError, TypeError):
                raise _damaged(path, chunk, "an asset_data line is not base64") from None

    stored = store.put_asset(data(), ref.media_kind)
    if (stored.digest, stored.size) != (ref.digest, ref.size):
        raise _damaged(path, line, f"asset {ref.digest}'s data has another digest ({stored.digest})")
    report.imported["assets"] += 1


class _Events:
    """The event lines following a session record, as `ExportedEvent`s; `after` is the first line that is not one."""

    def __init__(self, path: str, session: ExportedSession, lines: Iterator[Line]) -> None:
        self.path, self.session, self.lines = path, session, lines
        self.after: Line | None = None
        self.read = 0

    def __iter__(self) -> Iterator[ExportedEvent]:
        while self.after is None and self.read < self.session.events:  # the line after them is never read past
            line = next(self.lines, None)
            if line is None or not line.obj or line.obj.get("type") != "event" \
                    or line.obj.get("session") != self.session.id:
                self.after = line
                raise ImportConflictError(
                    f"{self.path}: exported Session {self.session.id} has {self.read} of its {self.session.events} "
                    "event lines; the export is damaged: nothing of that Session was imported"
                )
            self.read += 1
            o = line.obj
            try:
                yield ExportedEvent(o["id"], o["seq"], o["turn"], o["position"], o["kind"],
                                    json.dumps(o["payload"], ensure_ascii=False), o["created_at"],
                                    tuple(AssetRef(*a) for a in o["assets"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ImportConflictError(f"{self.path}:{line.number}: an event record lacks {exc}; the export is "
                                          "damaged: nothing of that Session was imported") from None

    def drain(self) -> None:
        """Read past the event lines not read yet (after a refusal)."""
        try:
            for _ in self:
                pass
        except ImportConflictError:
            pass


def _events(path: str, session: ExportedSession, lines: Iterator[Line]) -> _Events:
    return _Events(path, session, lines)


def _read_session(o: dict[str, Any]) -> ExportedSession:
    summaries = tuple(ExportedSummary(**s) for s in o["summaries"])
    ids = None if o.get("id_range") is None else (int(o["id_range"][0]), int(o["id_range"][1]))
    runs = tuple(ImportRecord(o["id"], **r) for r in o.get("imports", ()))
    return ExportedSession(o["id"], o["title"], o["workspace"], o["created_at"], o["updated_at"], o["snapshot"],
                           int(o["events"]), summaries, ids, runs)


def _read_entry(o: dict[str, Any]) -> ExportedEntry:
    versions = tuple(
        ExportedVersion(v["version"], v["content"], v["confidence"], v["origin"],
                        None if v["source"] is None else (v["source"]["session"], v["source"]["first_seq"],
                                                          v["source"]["last_seq"], v["source"]["digest"]),
                        v["created_at"], v.get("client"), v.get("said_at"), v.get("producer"))
        for v in o["versions"]
    )
    return ExportedEntry(o["workspace"], o["key"], bool(o["pinned"]), o["tombstoned_at"], o["created_at"],
                         o["updated_at"], versions)
