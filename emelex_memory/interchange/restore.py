"""Reading an Emelex export back: a Session with its events and Summaries, or a Knowledge entry with its versions,
each inside one write transaction of the caller's.

What is kept, and why:
- **Session IDs** are kept: they are the public names a person (and Knowledge provenance, and other tools) cite. A
  Session whose ID the store already holds is left alone when it holds exactly the exported events (re-importing an
  export is a no-op) and refused otherwise (`ImportConflictError`): two histories under one name are never merged.
- **Event IDs** are kept when none of the Session's exported ID range is taken in this store (always so in a fresh
  Home), so every Summary's provenance, digests and payload come back byte for byte. Otherwise the events get new
  IDs, and each Summary's provenance is re-anchored: its source facts are recomputed over the new rows, its payload's
  provenance rewritten with them and its digests recomputed; the text is unchanged.
- **Summaries are verified before they are adopted**: the exported payload against its recorded digest and
  provenance, and the exported events it replaced against the recorded source digest, recomputed from the export's
  own events with their original IDs. A Summary that does not verify, or a Summary event without its record, refuses
  the Session (nothing adopted that cannot be verified); its compaction job comes back as a done job with the same ID.
- **Knowledge versions** are kept as they were: numbers, contents, confidences, origins, clients, times, tombstones and
  pins (pruned versions stay absent). Provenance naming a Session the store holds is verified against that Session's
  events (`source_digest`); one naming a Session the store lacks keeps its ID, range and digest for audit, as for a
  deleted Session. An entry whose key the workspace already holds is left alone when identical, refused otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import replace
from collections.abc import Iterable
from typing import Any

import apsw

from ..assets.catalog import check_catalogued
from ..assets.files import stat_asset
from ..assets.folder import AssetFolder
from ..compaction.summaries import summary_payload
from ..sessions.prefix_digest import SOURCE_DOMAIN, digest_prefix, event_frame, summary_digest
from ..sessions.replay import provenance
from ..core.jsonbound import encode_canonical_text
from ..core.producer import check_producer, producer_json
from ..errors import ImportConflictError, InvalidInputError
from ..knowledge.source_digest import source_digest
from ..knowledge.values import (
    KnowledgeSource,
    validate_client,
    validate_confidence,
    validate_content,
    validate_key,
    validate_source,
)
from ..sessions.identity import WorkspaceIdentity
from ..sessions.transcript import SUMMARY_KIND
from ..sessions.workspaces import register_workspace
from ..sessions.writing import insert_restored
from .history import latest_import
from .records import ExportedEntry, ExportedEvent, ExportedSession, ExportedSummary, ImportSource

_U64 = struct.Struct(">Q").pack


def _refs_json(event: ExportedEvent) -> str | None:
    if not event.assets:
        return None
    return json.dumps([[r.digest, r.size, r.media_kind] for r in event.assets], separators=(",", ":"))


class _SummaryCheck:
    """The running check of one exported Summary: its source prefix re-hashed with the export's original IDs."""

    def __init__(self, summary: ExportedSummary, base_through: int) -> None:
        self.summary = summary
        self.base_through = base_through
        self.hash = hashlib.sha256(SOURCE_DOMAIN)
        self.count = 0
        self.first: int | None = None
        self.last: int | None = None
        # The digest hashes the base Summary first, but raw events a Summary left uncovered precede it in seq order:
        # their frames wait here until the base has been hashed (a preserved tail: a few turns).
        self.waiting: list[tuple[int, bytes]] | None = None if summary.base_event_seq is None else []

    def covers(self, event: ExportedEvent) -> bool:
        s = self.summary
        if s.base_event_seq is not None and event.seq == s.base_event_seq:
            return True
        return event.kind != SUMMARY_KIND and self.base_through < event.seq <= s.through_seq

    def add(self, event: ExportedEvent) -> None:
        frame = (event.id, event_frame(event.id, event.seq, event.turn, event.position, event.kind,
                                       event.payload_json, _refs_json(event)))
        if self.waiting is None:
            self._hash(*frame)
        elif event.seq == self.summary.base_event_seq:
            self._hash(*frame)
            for waited in self.waiting:
                self._hash(*waited)
            self.waiting = None
        else:
            self.waiting.append(frame)

    def _hash(self, event_id: int, frame: bytes) -> None:
        self.hash.update(frame)
        self.count += 1
        self.first = event_id if self.first is None else self.first
        self.last = event_id

    def verify(self, session_id: str, event: ExportedEvent, base_id: int | None) -> None:
        """Refuse unless the export's Summary event `event` and the events it replaced match its record; `base_id` is
        the export's ID of the Summary it compacted again."""
        s = self.summary
        self.hash.update(_U64(self.count))

        def refuse(what: str) -> ImportConflictError:
            return ImportConflictError(
                f"the Summary at seq {s.event_seq} of exported Session {session_id} does not verify ({what}); the "
                "export was altered or damaged: nothing of that Session was imported"
            )

        if event.kind != SUMMARY_KIND or self.waiting is not None:
            raise refuse("its event is not a Summary, or the Summary it compacted again is missing")
        if summary_digest(event.payload_json.encode("utf-8")).hex() != s.summary_digest:
            raise refuse("its content differs from its digest")
        if (self.count, self.first, self.last, self.hash.hexdigest()) != (
                s.source_count, s.first_event_id, s.last_event_id, s.source_digest):
            raise refuse("the events it replaced differ from its recorded source")
        try:
            recorded = json.loads(event.payload_json)["provenance"]
        except (ValueError, TypeError, KeyError):
            raise refuse("its payload is not a Summary document") from None
        source = {"base_summary_id": base_id, "count": s.source_count, "digest": s.source_digest,
                  "first_event_id": s.first_event_id, "last_event_id": s.last_event_id, "through_seq": s.through_seq}
        try:
            producer = check_producer(s.producer)
        except InvalidInputError as exc:
            raise refuse(str(exc)) from None
        if recorded != provenance(s.job["id"], source, s.model_ref, producer):
            raise refuse("its provenance differs from its record")


def _ids_free(conn: apsw.Connection, session: ExportedSession) -> bool:
    if session.id_range is None:
        return True
    low, high = session.id_range
    return conn.execute("SELECT NOT EXISTS (SELECT 1 FROM events WHERE id BETWEEN ? AND ?)", (low, high)).fetchone()[0]


def same_session(conn: apsw.Connection, rowid: int, session: ExportedSession, events: Iterable[ExportedEvent]) -> bool:
    """True when Session `rowid` holds exactly the exported events (seq, turn, position, kind, payload, time and
    assets) and as many Summaries; consumes `events`."""
    held = conn.execute("SELECT count(*), (SELECT count(*) FROM summaries WHERE session_id = ?) FROM events "
                        "WHERE session_id = ?", (rowid, rowid)).fetchone()
    if held != (session.events, len(session.summaries)):
        for _ in events:
            pass
        return False
    same = True
    for event in events:
        row = conn.execute("SELECT turn, position, kind, payload, created_at, asset_refs FROM events "
                           "WHERE session_id = ? AND seq = ?", (rowid, event.seq)).fetchone()
        ours = None if row is None else (row[0], row[1], row[2], row[4])
        theirs = (event.turn, event.position, event.kind, event.created_at)
        if ours != theirs or (row[2] != SUMMARY_KIND and row[3] != event.payload_json) \
                or (row[5] or None) != _refs_json(event):
            same = False
    return same


def restore_session(
    conn: apsw.Connection,
    folder: AssetFolder,
    found: WorkspaceIdentity,
    session: ExportedSession,
    events: Iterable[ExportedEvent],
    now: float,
    max_event_bytes: int,
    *,
    new_workspace: bool = False,
) -> bool:
    """Inside a write transaction: write exported `session` with its `events` (consumed as they come) into the
    workspace `found`; return True when written, False when the store already held it exactly.

    Raises `ImportConflictError` when the store holds another Session under its ID or a Summary does not verify,
    an asset error when an event's asset is not in the store (import the export's assets first); the caller's
    transaction then rolls back.
    """
    row = conn.execute("SELECT id FROM sessions WHERE uuid = ?", (session.id,)).fetchone()
    if row is not None:
        if same_session(conn, row[0], session, (_canonical_event(e, max_event_bytes) for e in events)):
            return False
        raise ImportConflictError(
            f"this store already holds a Session {session.id} that differs from the exported one; nothing of it was "
            "imported: delete it here (`emelex memory sessions delete`) to import the exported one"
        )
    workspace_id, _ = register_workspace(conn, found, now, new_workspace=new_workspace)
    rowid = conn.execute(
        "INSERT INTO sessions (uuid, title, workspace_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?) RETURNING id",
        (session.id, session.title, workspace_id, session.created_at, session.updated_at),
    ).fetchone()[0]
    keep_ids = _ids_free(conn, session)
    by_seq = {s.event_seq: s for s in session.summaries}
    through_of = {s.event_seq: s.through_seq for s in session.summaries}
    checks = [_SummaryCheck(s, 0 if s.base_event_seq is None else through_of.get(s.base_event_seq, -1))
              for s in session.summaries]
    exported_id: dict[int, int] = {}  # seq -> the export's event ID, of the Summaries' events (bases of later ones)
    seq = byte_end = media_end = 0
    for event in events:
        event = _canonical_event(event, max_event_bytes)
        if event.seq != seq + 1:
            raise ImportConflictError(f"exported Session {session.id} skips from seq {seq} to {event.seq}; the "
                                      "export is damaged: nothing of that Session was imported")
        seq = event.seq
        payload = event.payload_json
        summary = by_seq.get(seq)
        if summary is None and event.kind == SUMMARY_KIND:
            raise ImportConflictError(
                f"exported Session {session.id} has a Summary event at seq {seq} but no record of its provenance, "
                "so it could never be verified; the export was altered or damaged: nothing of that Session was "
                "imported"
            )
        if summary is not None:
            check = next(c for c in checks if c.summary is summary)
            base = summary.base_event_seq
            check.verify(session.id, event, None if base is None else exported_id.get(base, -1))
            if not keep_ids:
                payload = _reanchored(conn, rowid, summary, payload, max_event_bytes)
        for check in checks:
            if check.covers(event):
                check.add(event)
        size = len(payload.encode("utf-8"))
        byte_end += size
        media_end += sum(r.size for r in event.assets)
        event_id = insert_restored(conn, event.id if keep_ids else None, (
            rowid, seq, event.turn, event.position, event.kind, payload, size, byte_end, media_end, event.created_at))
        if summary is not None:
            exported_id[seq] = event.id
            _write_summary(conn, rowid, summary, event_id, payload)
        if event.assets:
            _link(conn, folder, rowid, seq, event, now)
    if seq != session.events:
        raise ImportConflictError(f"exported Session {session.id} holds {seq} of its {session.events} events; the "
                                  "export was cut short: nothing of that Session was imported")
    if session.snapshot is not None:
        snapshot = session.snapshot
        text = snapshot.get("snapshot") if isinstance(snapshot, dict) else None
        if not isinstance(text, str) or hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() \
                != snapshot.get("digest"):
            raise ImportConflictError(f"the execution snapshot of exported Session {session.id} is no snapshot "
                                      "record or differs from its digest; nothing of that Session was imported")
        conn.execute("INSERT INTO session_snapshots (session_id, digest, snapshot, created_at) VALUES (?, ?, ?, ?)",
                     (rowid, session.snapshot["digest"], text, session.snapshot["created_at"]))
    _restore_imports(conn, rowid, session)
    return True


def _restore_imports(conn: apsw.Connection, rowid: int, session: ExportedSession) -> None:
    """Record the exported Session's import runs as its own, so that importing the same history here continues it.
    A source this store already imported into another Session refuses the exported one: two Sessions would hold the
    same conversation, and a grown file could only continue one of them."""
    for run in session.imports:
        try:
            ImportSource(run.format, run.key, run.path, run.first_line, run.last_line, run.byte_end,
                         run.prefix_digest, run.skipped, run.cut)
        except InvalidInputError as exc:
            raise ImportConflictError(f"an import run of exported Session {session.id} is not valid ({exc}); the "
                                      "export was altered or damaged: nothing of that Session was imported") from None
        seqs = (run.first_seq, run.last_seq)
        if seqs != (None, None) and not all(isinstance(n, int) and 1 <= n <= session.events for n in seqs):
            raise ImportConflictError(f"an import run of exported Session {session.id} names events {seqs}, which it "
                                      "does not hold; nothing of that Session was imported")
        held = latest_import(conn, run.format, run.key)
        if held is not None and held.session_id != session.id:
            raise ImportConflictError(
                f"this store already imported {run.path} as Session {held.session_id}, which exported Session "
                f"{session.id} was imported from too; nothing of it was imported: delete one of the two Sessions"
            )
        conn.execute(
            "INSERT INTO imports (session_id, format, source_key, path, first_line, last_line, byte_end, "
            "prefix_digest, first_seq, last_seq, skipped, cut, imported_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?)",
            (rowid, run.format, run.key, run.path, run.first_line, run.last_line, run.byte_end, run.prefix_digest,
             run.first_seq, run.last_seq, run.skipped, run.cut, run.imported_at),
        )


def _canonical_event(event: ExportedEvent, max_event_bytes: int) -> ExportedEvent:
    """`event` with its payload in the store's canonical JSON (an export may spell it otherwise)."""
    try:
        value = json.loads(event.payload_json)
    except (TypeError, ValueError, RecursionError):
        raise ImportConflictError(f"an exported event (seq {event.seq}) has a payload that is not JSON; the export is "
                                  "damaged") from None
    text, _ = encode_canonical_text(value, max_bytes=max_event_bytes, max_depth=200, what=f"exported event {event.seq}")
    return event if text == event.payload_json else replace(event, payload_json=text)


def _reanchored(conn: apsw.Connection, rowid: int, s: ExportedSummary, payload: str, max_event_bytes: int) -> str:
    """The Summary's payload with its provenance recomputed over the events as this store numbered them."""
    base = None if s.base_event_seq is None else conn.execute(
        "SELECT id FROM events WHERE session_id = ? AND seq = ?", (rowid, s.base_event_seq)).fetchone()[0]
    base_through = 0 if base is None else conn.execute(
        "SELECT through_seq FROM summaries WHERE event_id = ?", (base,)).fetchone()[0]
    facts = digest_prefix(conn, rowid, base, base_through, s.through_seq)
    source = {"base_summary_id": base, "count": facts.count, "digest": facts.digest,
              "first_event_id": facts.first_event_id, "last_event_id": facts.last_event_id,
              "through_seq": s.through_seq}
    text = json.loads(payload)["text"]
    return summary_payload(s.job["id"], source, s.model_ref, text, max_event_bytes, s.producer).decode("utf-8")


def _write_summary(conn: apsw.Connection, rowid: int, s: ExportedSummary, event_id: int, payload: str) -> None:
    recorded = json.loads(payload)["provenance"]["source"]
    job_source = dict(s.job["source"])
    job_source.update({k: recorded[k] for k in ("base_summary_id", "count", "digest", "first_event_id",
                                                 "last_event_id")})
    result = dict(s.job["result"], summary_event_id=event_id)
    if conn.execute("SELECT 1 FROM jobs WHERE uuid = ?", (s.job["id"],)).fetchone():
        raise ImportConflictError(f"this store already holds compaction job {s.job['id']} of another Session; the "
                                  "export's Session that names it was not imported")
    job_rowid = conn.execute(
        "INSERT INTO jobs (uuid, kind, session_id, source_key, source, state, attempts, due_at, result, created_at, "
        "updated_at, finished_at) VALUES (?, 'compaction', ?, ?, ?, 'done', 0, ?, ?, ?, ?, ?) RETURNING id",
        (s.job["id"], rowid, s.job["source_key"], _canonical(job_source), s.job["finished_at"], _canonical(result),
         s.job["created_at"], s.job["updated_at"], s.job["finished_at"]),
    ).fetchone()[0]
    conn.execute(
        "INSERT INTO summaries (event_id, session_id, job_id, base_event_id, through_seq, source_count, "
        "first_event_id, last_event_id, source_digest, summary_digest, model_ref, created_at, reverted_at, producer) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (event_id, rowid, job_rowid, recorded["base_summary_id"], s.through_seq, recorded["count"],
         recorded["first_event_id"], recorded["last_event_id"], bytes.fromhex(recorded["digest"]),
         summary_digest(payload.encode("utf-8")), s.model_ref, s.created_at, s.reverted_at, producer_json(s.producer)),
    )


def _canonical(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _link(conn: apsw.Connection, folder: AssetFolder, rowid: int, seq: int, event: ExportedEvent, now: float) -> None:
    for ref in event.assets:
        check_catalogued(conn, ref, "; import the export's assets first")
        stat_asset(folder.require(), ref.digest, ref.size)
    conn.execute("UPDATE events SET asset_refs = ? WHERE session_id = ? AND seq = ?", (_refs_json(event), rowid, seq))
    conn.executemany(
        "INSERT INTO event_assets (session_id, seq, ordinal, digest, media_kind) VALUES (?, ?, ?, ?, ?)",
        [(rowid, seq, i, r.digest, r.media_kind) for i, r in enumerate(event.assets)],
    )
    conn.executemany("UPDATE assets SET touched_at = max(touched_at, ?) WHERE digest = ? AND media_kind = ?",
                     [(now, r.digest, r.media_kind) for r in event.assets])


# -- Knowledge ------------------------------------------------------------------------------------------------


def _versions_here(conn: apsw.Connection, entry_id: int) -> list[tuple]:
    return conn.execute(
        "SELECT version, content, confidence, origin, source_session_uuid, source_first_seq, source_last_seq, "
        "source_digest, created_at, client, producer, said_at FROM knowledge_versions WHERE knowledge_id = ? "
        "ORDER BY version",
        (entry_id,),
    ).fetchall()


def _as_row(v: Any, here: tuple) -> tuple:
    """An exported version as `_versions_here` reads one (`here`, the version as this store has it); an export made
    before dates or producers were recorded (no said_at, no producer) takes the version's date and producer here."""
    src = v.source or (None, None, None, None)
    producer_here, said_here = here[-2:]
    return (v.version, v.content, v.confidence, v.origin, *src, v.created_at, v.client,
            producer_here if v.producer is None else producer_json(v.producer),
            said_here if v.said_at is None else v.said_at)


ORIGINS = ("user", "distillation", "retention")


def _check_entry(entry: ExportedEntry) -> None:
    """Refuse an exported entry that `remember` and `forget` could not have made: its key, each version's content,
    confidence, client and provenance as they validate them, versions numbered upwards, known origins and times,
    a tombstone time exactly when the newest version is a tombstone."""
    def refuse(what: str) -> ImportConflictError:
        return ImportConflictError(f"exported Knowledge {entry.key!r} is not a valid entry ({what}); the export was "
                                   "altered or damaged: nothing of it was imported")

    try:
        validate_key(entry.key)
        if not entry.versions:
            raise refuse("it has no versions")
        numbers = [v.version for v in entry.versions]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers) \
                or numbers != sorted(set(numbers)):
            raise refuse(f"its versions are numbered {numbers[:8]}, not in increasing order")
        for v in entry.versions:
            if v.content is not None:
                validate_content(v.content)
            validate_confidence(v.confidence)
            validate_client(v.client)
            check_producer(v.producer)
            if v.origin not in ORIGINS:
                raise refuse(f"version {v.version} has origin {v.origin!r}, not one of {', '.join(ORIGINS)}")
            if v.source is not None:
                validate_source(KnowledgeSource(*v.source))
            _check_times(refuse, v.created_at, *(() if v.said_at is None else (v.said_at,)))
        _check_times(refuse, entry.created_at, entry.updated_at, *(() if entry.tombstoned_at is None
                                                                   else (entry.tombstoned_at,)))
        if (entry.tombstoned_at is not None) != (entry.versions[-1].content is None):
            raise refuse("its tombstone time and its newest version disagree")
        if not isinstance(entry.pinned, bool):
            raise refuse(f"pinned is {entry.pinned!r}, not true or false")
    except (InvalidInputError, TypeError) as exc:
        raise refuse(str(exc)) from None


def _check_times(refuse: Any, *times: object) -> None:
    for t in times:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise refuse(f"a time is {t!r}, not seconds since the epoch")


def restore_entry(conn: apsw.Connection, found: WorkspaceIdentity, entry: ExportedEntry, now: float, *,
                  new_workspace: bool = False) -> bool:
    """Inside a write transaction: write exported Knowledge `entry` into the workspace `found`; return True when
    written, False when the workspace already held it exactly.

    Raises `ImportConflictError` when the workspace holds the key with other versions, dates or pin, or a version's
    provenance names a Session of this store whose events no longer match its digest.
    """
    _check_entry(entry)
    workspace_id, _ = register_workspace(conn, found, now, new_workspace=new_workspace)
    head = entry.versions[-1]
    row = conn.execute("SELECT id, pinned, tombstoned_at FROM knowledge WHERE workspace_id = ? AND key = ?",
                       (workspace_id, entry.key)).fetchone()
    if row is not None:
        here = [tuple(r) for r in _versions_here(conn, row[0])]
        if len(here) == len(entry.versions) and bool(row[1]) == entry.pinned \
                and here == [_as_row(v, h) for v, h in zip(entry.versions, here)]:
            return False
        raise ImportConflictError(
            f"Knowledge {entry.key!r} of {found.path} differs here from the exported entry (other versions, dates or "
            "pin); it was left as it is here"
        )
    entry_id = conn.execute(
        "INSERT INTO knowledge (workspace_id, key, head_version, tombstoned_at, pinned, created_at, updated_at, "
        "first_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (workspace_id, entry.key, head.version, entry.tombstoned_at, int(entry.pinned), entry.created_at,
         entry.updated_at, entry.versions[0].version),
    ).fetchone()[0]
    for v in entry.versions:
        src_rowid = None
        if v.source is not None:
            s_uuid, first, last, digest = v.source
            hit = conn.execute("SELECT id FROM sessions WHERE uuid = ?", (s_uuid,)).fetchone()
            if hit is not None:
                if source_digest(conn, hit[0], s_uuid, first, last) != digest:
                    raise ImportConflictError(
                        f"version {v.version} of exported Knowledge {entry.key!r} cites events {first}..{last} of "
                        f"Session {s_uuid}, which differ here; the entry was not imported"
                    )
                src_rowid = hit[0]
        size = len(entry.key.encode("utf-8")) + len((v.content or "").encode("utf-8"))
        conn.execute(
            "INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, origin, "
            "source_session_id, source_session_uuid, source_first_seq, source_last_seq, source_digest, created_at, "
            "client, said_at, producer) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entry_id, v.version, int(v.content is None), v.content, size, v.confidence, v.origin, src_rowid,
             *(v.source or (None, None, None, None)), v.created_at, v.client,
             v.created_at if v.said_at is None else v.said_at, producer_json(v.producer)),
        )
    return True
