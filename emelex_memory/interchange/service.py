"""`Interchange` (`store.interchange`): imports of other agents' histories, and Emelex exports out and back in."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import apsw

from ..assets.folder import open_asset_folder
from ..core.database import Database
from ..errors import ImportConflictError
from ..knowledge.distillation import Distillation
from ..sessions.identity import WorkspaceIdentity
from ..sessions.rows import session_rowid
from .export import export_records
from .history import RECORD_COLUMNS, latest_import, write_run
from .records import ExportedEntry, ExportedEvent, ExportedSession, ImportedEvent, ImportOutcome, ImportRecord, ImportSource
from .restore import restore_entry, restore_session

MAX_RUNS_SHOWN = 1000


class Interchange:
    """`MemoryStore` methods that bring histories in and take the store out."""

    def __init__(self, db: Database, distillation: Distillation) -> None:
        """Serve `db`; imported Sessions are queued for distillation through `distillation`."""
        self._db = db
        self._distillation = distillation

    def latest_import(self, format: str, key: str) -> ImportRecord | None:
        """The newest committed import run of source `key` in `format`, or None when none is recorded (never
        imported, or its Session was deleted since)."""
        with self._db.read() as conn:
            return latest_import(conn, format, key)

    def session_imports(self, session_id: str) -> list[ImportRecord]:
        """The import runs that wrote Session `session_id`, oldest first (at most 1000): its provenance, each with
        the source file, the digest of the source through the run's last line, and the line range read."""
        with self._db.read() as conn:
            rowid = session_rowid(conn, session_id)
            rows = conn.execute(
                f"SELECT {RECORD_COLUMNS} FROM imports i JOIN sessions s ON s.id = i.session_id WHERE i.session_id = ? "
                "ORDER BY i.id LIMIT ?", (rowid, MAX_RUNS_SHOWN),
            ).fetchall()
        return [ImportRecord(*row) for row in rows]

    def import_history(
        self,
        workspace: str | os.PathLike[str],
        source: ImportSource,
        events: Iterable[ImportedEvent],
        *,
        planned_from: ImportRecord | None,
        title: str | None = None,
        new_workspace: bool = False,
        distill: bool = True,
    ) -> ImportOutcome:
        """Write one run of another agent's history into the Session of `source`, in one transaction, and queue its
        distillation (unless `distill` is False or the run held no events).

        The first run of a source (`planned_from` None) creates a Session titled
        `title` in `workspace` (the directory it was recorded in; a new known
        workspace if need be, as for `create_session`); a later run appends to
        it, after checking that `workspace` is still that Session's directory.
        `planned_from` must be the source's newest run as the caller read it
        (`latest_import`) and `source.first_line` the line after it: another
        import that committed meanwhile raises `ImportConflictError`.
        `events` are consumed inside the transaction, so a long history is
        streamed, not held. Raises the workspace errors of `create_session`,
        `LeaseHeldError`/`OpenJournalError` for a Session in use, and
        `InvalidEventError` for an event that is not bounded JSON; nothing is
        written then, and a process killed during the run leaves no part of it.
        """
        found = WorkspaceIdentity.inspect(workspace)
        now = self._db.clock()
        with self._db.write() as conn:
            record, created = write_run(conn, self._db.settings, found, source, planned_from, events, title=title,
                                        now=now, new_workspace=new_workspace)
            job = None
            if distill and record.last_seq is not None:
                job = self._distillation.queue_distillation(record.session_id)
        return ImportOutcome(record.session_id, created, record, job)

    def export_records(self) -> Iterator:
        """Every record of an export of this store, from one consistent snapshot (see `interchange/export.py`):
        `ExportCounts`, then `ExportedAsset`s, each `ExportedSession` followed by its `ExportedEvent`s, then the
        `ExportedEntry`s. Consume it on the calling thread; it holds a read snapshot until exhausted or closed."""
        return export_records(self._db)

    def restore_session(
        self,
        workspace: str | os.PathLike[str],
        session: ExportedSession,
        events: Iterable[ExportedEvent],
        *,
        new_workspace: bool = False,
    ) -> bool:
        """Write an exported Session with its events and Summaries into `workspace`, in one transaction; True when
        written, False when the store already held exactly it (see `interchange/restore.py` for what is kept and
        verified). Its assets must be in the store first (`put_asset`). Raises `ImportConflictError` for a
        different Session under the same ID or a Summary that does not verify; nothing is written then."""
        found = WorkspaceIdentity.inspect(workspace)
        now = self._db.clock()
        with self._db.write() as conn, open_asset_folder(self._db) as folder, _store_rules(f"Session {session.id}"):
            return restore_session(conn, folder, found, session, events, now, self._db.settings.max_event_bytes,
                                   new_workspace=new_workspace)

    def restore_entry(
        self, workspace: str | os.PathLike[str], entry: ExportedEntry, *, new_workspace: bool = False
    ) -> bool:
        """Write an exported Knowledge entry with all its versions into `workspace`, in one transaction; True when
        written, False when the workspace already held exactly it. Raises `ImportConflictError` when it holds the
        key otherwise, or a version's provenance does not match the Session here; nothing is written then."""
        found = WorkspaceIdentity.inspect(workspace)
        now = self._db.clock()
        with self._db.write() as conn, _store_rules(f"Knowledge {entry.key!r}"):
            return restore_entry(conn, found, entry, now, new_workspace=new_workspace)


@contextmanager
def _store_rules(what: str) -> Iterator[None]:
    """Turn a value of an exported record that breaks a rule the schema states (a CHECK, a column's type) into the
    refusal of that record, inside its transaction (which then rolls back)."""
    try:
        yield
    except apsw.ConstraintError as exc:
        raise ImportConflictError(f"exported {what} breaks a rule of the store ({exc}); the export was altered or "
                                  "damaged: nothing of it was imported") from None
