"""`MemoryStore`: the entry point to one Emelex database, composed of a `Database` and one service per concept.

    store.db            the connection, lock, clock, settings and transactions (`core/database.py`)
    store.sessions      Sessions, leases and replay (`sessions/`)
    store.workspaces    the known workspaces and their rebinding (`sessions/workspace_admin.py`)
    store.assets        content-addressed media (`assets/`)
    store.jobs          the work queues; `store.job_status`: why a job waits (`queue/`)
    store.compaction    planning and queueing compaction; `store.compaction_revert`; `store.raw_history`
    store.knowledge     versioned workspace Knowledge; `store.distillation` (`knowledge/`)
    store.model_refs    Session -> model snapshot references (`snapshots/`)
    store.deletion, store.maintenance   `delete_session` and `maintain` (`maintenance/`)
    store.model_states  saved model states (`maintenance/model_states.py`)
    store.search_index  full-text search over Knowledge and transcripts: `store.search` (`search/`)
    store.interchange   imports of other agents' histories, Emelex exports out and back in (`interchange/`)
    store.search_vectors  an embedder's vectors of the indexed rows (`search/vectors.py`)

Each service is built the first time it is used, so opening a store loads none of them. Every public method of a
service is also a method of the store, written below with the service's own signature and docstring, handing the call
on (`store.put_asset(...)` is `store.assets.put_asset(...)`); `scripts/store_face.py` writes those methods from the
services' source and `tests/test_store_face.py` keeps them in step. `finish_session` and `work_distillation` are the
store's own, as they span a lease, the queue and the runner.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .assets.refs import DEFAULT_GRACE_S, asset_dir_for
from .core.database import Clock, Database
from .core.io_errors import restated
from .core.opening import STORE_MARKER, check_missing_database, open_database, reinitialize_database
from .core.private_files import absolute, check_home, check_no_symlinks, check_private_dir, ensure_private_dir
from .core.settings import Settings
from .errors import CommitOutcomeUnknownError, InvalidInputError, LeaseLostError, OpenJournalError
from .job_kinds import DEFAULT_KINDS, DISTILL_KIND
from .queue.kinds import JobKindRegistry
from .sessions.holders import open_journal
from .sessions.rows import session_rowid
from .sessions.tokens import estimate_tokens

if TYPE_CHECKING:
    from .knowledge.distillation import DistillFunction, TokenCounter
    from .queue.jobs import Enqueued
    from .queue.runner import JobOutcome
    from .sessions.leases import SessionLease
    # -- imports of the generated face (scripts/store_face.py) --
    from collections.abc import Iterable, Iterator, Mapping, Sequence
    from .assets.catalog import AssetLinkPage, AssetPage, AssetTotals, AssetVerification
    from .assets.collection import AssetCollection
    from .assets.files import VerifiedAssetReader
    from .assets.refs import AssetRef
    from .assets.service import AssetSource, AssetStore
    from .compaction.planning import Compaction, CompactionPlan, CompactionQueued, SummaryDraft
    from .compaction.policy import CompactionPolicy
    from .compaction.raw_history import RawHistory, RawPage
    from .compaction.revert import CompactionReversal, CompactionRevert
    from .compaction.steps import NextStep
    from .interchange.records import (
        ExportedEntry, ExportedEvent, ExportedSession, ImportOutcome, ImportRecord, ImportSource, ImportedEvent,
    )
    from .interchange.service import Interchange
    from .knowledge.distillation import Distillation
    from .knowledge.service import Knowledge
    from .knowledge.values import KnowledgeEntry, KnowledgeHistoryPage, KnowledgePage, KnowledgeSource, KnowledgeVersion
    from .maintenance.deletion import Deletion, SessionDeletion
    from .maintenance.model_states import ModelState, ModelStates
    from .maintenance.retention import Maintenance, MaintenanceReport
    from .queue.claim import JobClaim
    from .queue.jobs import Job, JobPage
    from .queue.service import JobQueue
    from .queue.status import JobStatus, WaitingPage
    from .search.recall import RecallSelection
    from .search.service import Search, SearchPage, WorkspaceLike
    from .search.vectors import EmbeddingItem, Vectors
    from .sessions.identity import Session
    from .sessions.service import SessionPage, Sessions
    from .sessions.transcript import Event, ReplayPage
    from .sessions.workspace_admin import (
        WorkspaceAdmin, WorkspaceInfo, WorkspacePage, WorkspaceRebind, WorkspaceRebindPage,
    )
    from .snapshots.installed import InstalledModel
    from .snapshots.refs import BoundModel, SessionModelRefPage, SessionModelRefs
    # -- end of the imports --

__all__ = ["STORE_MARKER", "MemoryStore", "SessionPage"]  # SessionPage: see __getattr__ below

class _service(functools.cached_property):  # noqa: N801 - a decorator, named as `property` is
    """A service of the store: built by the decorated method the first time it is used (under the store's lock, so
    once), then a plain attribute of the store."""

    def __get__(self, store: Any, owner: type | None = None) -> Any:
        if store is None:
            return self
        with store._building:
            return super().__get__(store, owner)


def _remove_empty(directories: list[Path]) -> None:
    """Remove those of `directories` (made by a failed open, innermost last) that are still empty."""
    for directory in reversed(directories):
        try:
            os.rmdir(directory)
        except OSError:
            return  # not empty (or gone): what is outside it stays too


def _check_database_path(path: Path) -> None:
    check_no_symlinks(path, what="database", fix="open {real} instead")


class MemoryStore:
    """One open Emelex database. Thread-safe; use it as a context manager or call `close()`."""

    def __init__(
        self,
        conn: Any,
        path: Path,
        settings: Settings,
        clock: Clock = time.time,
        kinds: JobKindRegistry | None = None,
    ) -> None:
        """Wrap an already opened and migrated connection (closing it if this fails); use `open` or `open_path`.

        Opens the database's directory and keeps its descriptor until
        `close()`: asset files are reached through it, never by path.
        `kinds` is the job-kind registry the store queues, validates and
        completes jobs by (`store.job_kinds`); None means `DEFAULT_KINDS`.
        """
        self.db = Database.wrap(conn, path, settings, clock)
        self.path = path
        self.settings = settings
        self.clock = clock
        self.job_kinds = DEFAULT_KINDS if kinds is None else kinds
        self._building = threading.RLock()  # services are built on first use, once (see `_service`)

    # -- opening --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        *,
        create: bool = True,
        clock: Clock = time.time,
        kinds: JobKindRegistry | None = None,
    ) -> MemoryStore:
        """Open the standard database `<Emelex Home>/memory/emelex.sqlite3`, creating it on first use only.

        Home and its `memory/` directory are created mode 0700 when missing
        and must otherwise be ours and not group/world-writable. Raises a
        `StoreError` subclass when anything is unsafe or the database of an
        existing store is missing. With `create=False` (for commands that
        only read) a Home without a store raises `NoStoreError` and nothing
        at all is created. `kinds` is the store's job-kind registry
        (default `DEFAULT_KINDS`, which `register_job_kind` adds to).
        """
        settings = settings or Settings()
        home = settings.home_dir
        check_home(home)
        if os.path.lexists(home):
            check_private_dir(home)  # a file or an unsafe directory is that, not "no store yet"
        marker = home / STORE_MARKER
        database = settings.database_path
        evidence = (asset_dir_for(database),)
        if not os.path.lexists(settings.memory_dir):  # checked before Home or memory/ is created
            check_missing_database(database, create=create, where=home, marker=marker, evidence=evidence)
        made = [d for d in (home, settings.memory_dir) if not os.path.lexists(d)]
        ensure_private_dir(home)
        ensure_private_dir(settings.memory_dir)
        try:
            conn = open_database(
                database, busy_timeout_ms=settings.busy_timeout_ms, marker=marker, evidence=evidence, create=create,
                where=home,
            )
        except BaseException:
            _remove_empty(made)  # a failed first open leaves no Home behind either
            raise
        return cls(conn, database, settings, clock, kinds)

    @classmethod
    def open_path(
        cls,
        path: str | os.PathLike[str],
        settings: Settings | None = None,
        *,
        create: bool = True,
        clock: Clock = time.time,
        kinds: JobKindRegistry | None = None,
    ) -> MemoryStore:
        """Open the database file at `path` (its directory must exist and be private), creating it on first use.

        With `create=False` a missing store raises `NoStoreError` and nothing is created. `kinds` as for `open`.
        """
        settings = settings or Settings()
        path = absolute(path, what="database")
        _check_database_path(path)
        conn = open_database(
            path, busy_timeout_ms=settings.busy_timeout_ms, evidence=(asset_dir_for(path),), create=create
        )
        return cls(conn, path, settings, clock, kinds)

    @staticmethod
    def reinitialize(settings: Settings | None = None, *, confirm: bool = False) -> list[Path]:
        """Allow the standard database to be created anew after it was deleted; see `reinitialize_path`."""
        settings = settings or Settings()
        check_home(settings.home_dir)
        ensure_private_dir(settings.home_dir)
        ensure_private_dir(settings.memory_dir)
        return reinitialize_database(
            settings.database_path,
            confirm=confirm,
            marker=settings.home_dir / STORE_MARKER,
            asset_dir=asset_dir_for(settings.database_path),
        )

    @staticmethod
    def reinitialize_path(path: str | os.PathLike[str], *, confirm: bool = False) -> list[Path]:
        """Explicitly forget a deleted database at `path` so the next open creates a new one.

        Needs `confirm=True`; refuses while the database file exists; moves
        leftover WAL/SHM files and the old asset folder aside (never deleting
        them) and returns where they went.
        """
        path = absolute(path, what="database")
        _check_database_path(path)
        return reinitialize_database(path, confirm=confirm, asset_dir=asset_dir_for(path))

    def close(self) -> None:
        """Close the connection. Leases taken through this store stay durable until released or expired."""
        self.db.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


    # -- the services, each built on first use ----------------------------------------

    @_service
    def sessions(self) -> Sessions:
        """Sessions, leases and replay (`sessions/service.py`)."""
        from .sessions.service import Sessions

        return Sessions(self.db)

    @_service
    def workspaces(self) -> WorkspaceAdmin:
        """The known workspaces and their rebinding (`sessions/workspace_admin.py`)."""
        from .sessions.workspace_admin import WorkspaceAdmin

        return WorkspaceAdmin(self.db)

    @_service
    def assets(self) -> AssetStore:
        """Content-addressed media (`assets/service.py`)."""
        from .assets.service import AssetStore

        return AssetStore(self.db)

    @_service
    def jobs(self) -> JobQueue:
        """The work queues of `job_kinds` (`queue/service.py`); claims and completions hand this store on."""
        from .queue.service import JobQueue

        return JobQueue(self.db, self, self.job_kinds)

    @_service
    def job_status(self) -> JobStatus:
        """Why a job waits, and the rescue of a dead worker's claim (`queue/status.py`)."""
        from .queue.status import JobStatus

        return JobStatus(self.db, self.job_kinds)

    @_service
    def compaction(self) -> Compaction:
        """Planning and queueing compaction, and reading a compaction job's source (`compaction/planning.py`)."""
        from .compaction.planning import Compaction

        return Compaction(self.db, self.jobs)

    @_service
    def compaction_revert(self) -> CompactionRevert:
        """Reverting and redoing a compaction (`compaction/revert.py`)."""
        from .compaction.revert import CompactionRevert

        return CompactionRevert(self.db, self.jobs)

    @_service
    def raw_history(self) -> RawHistory:
        """A Session's raw history, Summaries' replaced events included (`compaction/raw_history.py`)."""
        from .compaction.raw_history import RawHistory

        return RawHistory(self.db)

    @_service
    def knowledge(self) -> Knowledge:
        """Versioned workspace Knowledge (`knowledge/service.py`)."""
        from .knowledge.service import Knowledge

        return Knowledge(self.db)

    @_service
    def distillation(self) -> Distillation:
        """Queueing distillation and reading a distill job's source (`knowledge/distillation.py`)."""
        from .knowledge.distillation import Distillation

        return Distillation(self.db, self.jobs)

    @_service
    def model_refs(self) -> SessionModelRefs:
        """Session -> model snapshot references (`snapshots/refs.py`)."""
        from .snapshots.refs import SessionModelRefs

        return SessionModelRefs(self.db)

    @_service
    def deletion(self) -> Deletion:
        """`delete_session` (`maintenance/deletion.py`)."""
        from .maintenance.deletion import Deletion

        return Deletion(self.db)

    @_service
    def maintenance(self) -> Maintenance:
        """`maintain`: retention and upkeep (`maintenance/retention.py`)."""
        from .maintenance.retention import Maintenance

        return Maintenance(self.db, self.assets, self.jobs)

    @_service
    def model_states(self) -> ModelStates:
        """Saved model states (`maintenance/model_states.py`)."""
        from .maintenance.model_states import ModelStates

        return ModelStates(self.db, self.assets)

    @_service
    def search_index(self) -> Search:
        """Full-text search over Knowledge and transcripts, and the recall selection (`search/service.py`)."""
        from .search.service import Search

        return Search(self.db)

    @_service
    def interchange(self) -> Interchange:
        """Imports of other agents' histories, Emelex exports out and back in (`interchange/service.py`)."""
        from .interchange.service import Interchange

        return Interchange(self.db, self.distillation)

    @_service
    def search_vectors(self) -> Vectors:
        """An embedder's vectors of the indexed rows, and the rows still waiting for theirs (`search/vectors.py`)."""
        from .search.vectors import Vectors

        return Vectors(self.db)

    # -- the store's own methods ------------------------------------------------------

    def finish_session(self, lease: SessionLease) -> Enqueued | None:
        """Clean exit: queue distillation of the lease's Session and durably release the lease, in one transaction.

        Both happen or neither. An error raised before the commit queues
        nothing and leaves the lease held, and the lease object stays usable,
        so finishing again is safe. When the commit itself fails in its I/O
        (`CommitOutcomeUnknownError`) both may have happened; leaving the
        lease's `with` block then releases the lease without queueing if
        they did not. Either way, call `finish_session(lease)` again: after
        an unknown outcome it completes what is missing (it queues the
        distillation unless that commit did, which queueing's idempotence
        tells, and releases the lease if still held) and returns the job.
        Otherwise raises `LeaseLostError`, queueing nothing, when the lease
        was no longer held (call `queue_distillation` to distill the Session
        anyway). A Session with an open agent journal (an interrupted turn)
        is refused with `OpenJournalError`, queueing nothing and keeping the
        lease. Call it on the store that acquired the lease.
        """
        if lease.db is not self.db:
            raise InvalidInputError(
                f"the lease on Session {lease.session_id} belongs to another MemoryStore; call finish_session on "
                "the store that acquired it"
            )
        if lease.finish_outcome_unknown:  # an earlier finish may have committed: queueing again is idempotent
            try:
                return lease.end_with("released", None, functools.partial(self._finished, lease))
            except LeaseLostError:  # released by that commit, or when its `with` block was left
                return self.queue_distillation(lease.session_id)
        try:
            return lease.end_with("released", None, functools.partial(self._finished, lease))
        except CommitOutcomeUnknownError as exc:
            lease.finish_outcome_unknown = True
            raise restated(
                exc, self.path, f"finishing Session {lease.session_id} (queue distillation, release)",
                "call finish_session(lease) again: it queues the distillation unless this commit did, and releases "
                "the lease if it is still held",
            ) from exc.__cause__

    def _finished(self, lease: SessionLease, conn: Any) -> Enqueued | None:
        """Inside `finish_session`'s transaction: refuse an open agent journal (`OpenJournalError`: a turn that did
        not close is not a consistent history to distill), else queue the distillation."""
        if conn.execute(f"SELECT {open_journal('?')}", (session_rowid(conn, lease.session_id),)).fetchone()[0]:
            raise OpenJournalError(
                f"Session {lease.session_id} has an open agent turn, so it cannot be finished (nothing was queued, "
                f"the lease is still held): release the lease, then resume the agent or run `emelex memory sessions "
                f"recover {lease.session_id}`"
            )
        return self.queue_distillation(lease.session_id)

    def work_distillation(
        self,
        distill: DistillFunction,
        *,
        safe_context_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
        ttl_s: float | None = None,
    ) -> JobOutcome | None:
        """Claim and run one due distill job with `distill` and record the outcome; None when none is due.

        See `distillation_handler` for the token budget and `worker.run_one_job`
        for how failures count.
        """
        from .knowledge.distillation import distillation_handler
        from .queue.runner import run_one_job

        handler = distillation_handler(distill, safe_context_tokens=safe_context_tokens, count_tokens=count_tokens)
        return run_one_job(self, handler, kinds=DISTILL_KIND, ttl_s=ttl_s)

    # -- GENERATED by scripts/store_face.py: the services' methods; do not edit --

    def create_session(
        self, workspace: str | os.PathLike[str], *, title: str | None = None, new_workspace: bool = False
    ) -> Session:
        """Create a Session in the canonical `workspace` directory: the known workspace that directory is, or a new
        one recorded with its identity (see `WorkspaceIdentity`).

        A directory at the path where another known workspace was last seen
        (a re-clone, say) raises `WorkspaceReplacedError` naming the rebind
        command, unless `new_workspace` says it is a new, unrelated workspace.
        """
        return self.sessions.create_session(workspace, title=title, new_workspace=new_workspace)

    def get_session(self, session_id: str) -> Session:
        """Return a snapshot of one Session; raise `SessionNotFoundError` if there is none."""
        return self.sessions.get_session(session_id)

    def list_sessions(
        self,
        *,
        workspace: WorkspaceLike | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> SessionPage:
        """Page through Sessions newest first with a stable `(created_at, id)` cursor, bounded in items and bytes;
        with `workspace`, only that workspace's (the known workspace its directory is, by identity; none when it is
        no known workspace, and the errors of `workspace_scope` when it was replaced)."""
        return self.sessions.list_sessions(workspace=workspace, cursor=cursor, limit=limit, max_bytes=max_bytes)

    def acquire_lease(
        self, session_id: str, workspace: str | os.PathLike[str], *, ttl_s: float | None = None
    ) -> SessionLease:
        """Take the one live lease on a Session from `workspace` (its current path).

        Validates the workspace identity first (a renamed directory is
        accepted and the stored path updated; components the workspace did
        not record yet are recorded). Raises `WorkspaceReplacedError` when the
        directory is not the Session's workspace (`WorkspaceMissingError` when
        the workspace's recorded path names nothing), `LeaseHeldError` while
        another holder's lease is live; an expired lease is replaced (its
        holder's later writes are refused with `LeaseLostError`). The new
        lease must replay before appending. It keeps the directory open until
        it ends, so that its inode number cannot be reused meanwhile.
        """
        return self.sessions.acquire_lease(session_id, workspace, ttl_s=ttl_s)

    def replay(
        self, session_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> ReplayPage:
        """Read one page of a Session's transcript after `after_seq` (exclusive), bounded in items and bytes.

        `max_bytes` must be at least the per-event cap so every page can make
        progress. Read-only: this does not satisfy a lease's replay duty.
        """
        return self.sessions.replay(session_id, after_seq, limit=limit, max_bytes=max_bytes)

    def resolve_session_id(self, prefix: str) -> str:
        """The full ID of the one Session whose ID is `prefix` or starts with it (at least 4 characters, any case).

        Raises `SessionNotFoundError` when none matches and `AmbiguousIdError`
        when the prefix is too short or matches several (listing them).
        """
        return self.sessions.resolve_session_id(prefix)

    def list_workspaces(
        self, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> WorkspacePage:
        """Page through the known workspaces in ID order, bounded in items and bytes, with each one's status
        (inspected now, see `WorkspaceInfo`) and its Session, live Knowledge and rebind counts. Writes nothing."""
        return self.workspaces.list_workspaces(cursor=cursor, limit=limit, max_bytes=max_bytes)

    def get_workspace(self, workspace_id: int) -> WorkspaceInfo:
        """One known workspace as `list_workspaces` shows it (its status inspected now); raise
        `WorkspaceNotFoundError` for an unknown ID. Writes nothing."""
        return self.workspaces.get_workspace(workspace_id)

    def workspace_rebinds(
        self, workspace_id: int, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> WorkspaceRebindPage:
        """Page through the audit records of workspace `workspace_id`'s rebinds, oldest first, bounded in items
        and bytes (who, when, the identity before and after, a workspace it retired). Raises
        `WorkspaceNotFoundError` for an unknown ID. Writes nothing."""
        return self.workspaces.workspace_rebinds(workspace_id, cursor=cursor, limit=limit, max_bytes=max_bytes)

    def rebind_workspace(
        self, workspace_id: int, directory: str | os.PathLike[str], *, confirm: bool = False
    ) -> WorkspaceRebind:
        """Point known workspace `workspace_id` at `directory`, so its Sessions and Knowledge belong there.

        Needs `confirm=True` to change the workspace's directory. Raises `WorkspaceNotFoundError` for an unknown ID,
        `WorkspaceMissingError` unless `directory` is a directory,
        `WorkspaceConflictError` when it already is another known workspace
        that anything belongs to (a Session, a Knowledge entry, forgotten ones
        too, or a rebind record), `LeaseHeldError` while a live lease holds
        one of the workspace's Sessions, and `ConfirmationRequiredError`
        without confirmation; each changes nothing. An other workspace that
        nothing belongs to (left empty, say, after its only Session was
        deleted) is retired: its row is deleted and its ID recorded with the
        rebind. Records the old and new identity, who and when in
        `workspace_rebinds`. Rebinding to the directory the workspace already
        is changes nothing but following a rename, records nothing and needs
        no confirmation.
        """
        return self.workspaces.rebind_workspace(workspace_id, directory, confirm=confirm)

    @property
    def asset_dir(self) -> Path:
        """This database's asset folder: `memory/assets` for the standard database, else `<name>.assets` beside it."""
        return self.assets.asset_dir

    def put_asset(self, data: AssetSource, media_kind: str) -> AssetRef:
        """Store bytes once under their SHA-256 and catalog them with `media_kind`; return the `AssetRef`.

        `data` is bytes, a binary file object (read in 1 MiB chunks) or an
        iterable of bytes chunks. It streams through a 128 MiB cap into a
        locked mode-0600 temporary file that is fsynced, then, holding the
        database write lock, hard-linked under its digest name (never
        overwriting) with the folder fsynced, and catalogued. When the digest
        file already exists its content is verified before it is catalogued;
        a file with other content raises `AssetTamperedError`. Putting the
        same bytes again stores nothing new and refreshes the entry's grace
        period. Any error removes the temporary file and leaves no catalog
        entry (a file linked just before a failed commit is an orphan that
        the next put adopts or collection removes after the grace period),
        except `CommitOutcomeUnknownError`: the commit itself failed and the
        entry may or may not be durable; putting the bytes again is safe.
        Once the entry is committed the put succeeds: if only the removal of
        the temporary file fails then, it returns the ref and warns with a
        `LeftoverTempFileWarning` (collection removes the file later).
        """
        return self.assets.put_asset(data, media_kind)

    def read_asset(self, ref: AssetRef) -> bytes:
        """Return an asset's bytes after checking its catalog entry, file type, owner, mode, size and SHA-256.

        Raises `AssetNotFoundError`/`AssetMismatchError` for a ref the catalog
        does not hold, `AssetMissingError` for a missing file and
        `AssetTamperedError` (naming the asset) for any other mismatch.
        """
        return self.assets.read_asset(ref)

    def open_asset(self, ref: AssetRef) -> VerifiedAssetReader:
        """Open an asset as a binary stream, fully verified like `read_asset` before it is returned.

        The stream re-hashes what it reads; if the file changed after opening,
        the read that reaches the end raises `AssetTamperedError`.
        """
        return self.assets.open_asset(ref)

    def asset_entries(
        self, digest: str, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> AssetPage:
        """Page through the catalog entries of `digest` (one per media kind it was stored as), in media kind order.

        Bounded like `list_assets`; the page is empty when the digest is not
        catalogued. A cursor must come from a page of the same digest.
        """
        return self.assets.asset_entries(digest, cursor=cursor, limit=limit, max_bytes=max_bytes)

    def asset_links(
        self, digest: str, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> AssetLinkPage:
        """Page through the events that link `digest`, in Session and seq order, bounded in items and bytes.

        `max_bytes` must leave room for the largest link (`MAX_LINK_BYTES`);
        pass `next_cursor` back until it is None.
        """
        return self.assets.asset_links(digest, cursor=cursor, limit=limit, max_bytes=max_bytes)

    def list_assets(
        self, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> AssetPage:
        """Page through catalog entries in (digest, media kind) order, bounded in items and bytes.

        `max_bytes` must leave room for the largest entry (`MAX_ENTRY_BYTES`,
        else `InvalidInputError`), so every page holds at least one entry and
        has a `next_cursor` whenever more entries follow.
        """
        return self.assets.list_assets(cursor=cursor, limit=limit, max_bytes=max_bytes)

    def asset_totals(self) -> AssetTotals:
        """Catalog entries, distinct files and their bytes."""
        return self.assets.asset_totals()

    def verify_assets(
        self, *, cursor: str | None = None, limit: int | None = None, max_hash_bytes: int | None = None
    ) -> AssetVerification:
        """Re-hash one bounded page of catalogued files and report every problem found; never raises for them.

        A page covers at most `limit` entries and stops before `max_hash_bytes`
        (default 1 GiB) of hashing, always checking at least one file. Pass
        `next_cursor` back until it is None to check everything.
        """
        return self.assets.verify_assets(cursor=cursor, limit=limit, max_hash_bytes=max_hash_bytes)

    def collect_assets(
        self,
        *,
        limit: int = 1000,
        grace_s: float = DEFAULT_GRACE_S,
        digests: Iterable[str] | None = None,
        scan_folder: bool = True,
    ) -> AssetCollection:
        """Collect unreferenced assets, bounded; return what was done (call again while `.more`).

        Deletes up to `limit` catalog entries that no event links and that were
        not put or linked within `grace_s` seconds, removing a file once no
        entry names it; removes up to `limit` digest-named files that no entry
        names and that are older than `grace_s` (crash orphans); and examines
        up to `limit` temporary files, removing those older than one hour that
        no writer holds locked. Files and temporary files are scanned from a
        saved position, so successive calls reach every one. `digests`
        restricts the call to those digests (e.g. the ones a deleted Session
        linked) and skips temporary files. `scan_folder=False` skips the
        orphan and temporary-file scans, the only part that lists the folder
        (`maintain` paces them, see `assets_gc.folder_scan_due`).

        Safe to call from another process at any time. Called outside a
        transaction, catalog entries are deleted in one write transaction and
        only once it has committed are their files removed, in another, after
        re-checking that no entry names them (see `assets_gc`): a crash or a
        failed commit leaves at worst orphan files, never an entry without its
        file. Called inside a caller's `_write()` transaction, it only deletes
        catalog entries, as part of that transaction (they come back if it
        rolls back), and leaves their files to a later call made outside a
        transaction (counted in `deferred_files`). An error in the file step
        is raised after the entries' deletion committed, and says so.
        """
        return self.assets.collect_assets(limit=limit, grace_s=grace_s, digests=digests, scan_folder=scan_folder)

    def enqueue_job(
        self,
        kind: str,
        session_id: str,
        source: Mapping[str, Any],
        *,
        source_key: str | None = None,
        due_at: float | None = None,
    ) -> Enqueued:
        """Queue `kind` work on a Session, idempotently: the same (kind, Session, source key) is queued once.

        `source` is a JSON mapping (at most 16 KiB canonical) that exactly
        describes the work; `source_key` (1-128 characters) defaults to the
        SHA-256 hex of its canonical JSON. `due_at` (default now) delays the
        first claim. Queueing work that exists, in any state, returns that job
        unchanged with `created=False`. A kind registered with a source
        validator checks the source (as it will be stored) first; a bad one
        raises `InvalidJobSourceError` and nothing is written.
        """
        return self.jobs.enqueue_job(kind, session_id, source, source_key=source_key, due_at=due_at)

    def get_job(self, job_id: str) -> Job:
        """A snapshot of one job by its public ID; raise `JobNotFoundError` if there is none."""
        return self.jobs.get_job(job_id)

    def list_jobs(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        session_id: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> JobPage:
        """Page through jobs newest first, optionally of one state, kind and Session; bounded in items and bytes.

        `max_bytes` must be at least `MAX_JOB_ROW_BYTES` (41,260: the largest
        job), so every page holds at least one job and never exceeds it.
        """
        return self.jobs.list_jobs(
            state=state, kind=kind, session_id=session_id, cursor=cursor, limit=limit, max_bytes=max_bytes
        )

    def failed_jobs(
        self,
        *,
        kind: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> JobPage:
        """Page through terminal jobs (failed, or cancelled by an operator) newest first, with bounded diagnostics.

        Bounded in items and bytes like `list_jobs`.
        """
        return self.jobs.failed_jobs(kind=kind, cursor=cursor, limit=limit, max_bytes=max_bytes)

    def claim_job(self, kinds: str | Iterable[str] | None = None, *, ttl_s: float | None = None) -> JobClaim | None:
        """Claim the oldest due pending job of `kinds` (default: every registered kind); None when there is none.

        One `BEGIN IMMEDIATE` transaction first rescues expired claims (each a
        counted failure), then claims with one `UPDATE ... RETURNING`,
        skipping jobs whose Session has a live execution lease. The worker
        lease lasts `ttl_s` (default `worker_lease_ttl_s`).
        """
        return self.jobs.claim_job(kinds, ttl_s=ttl_s)

    def rescue_expired_jobs(self) -> int:
        """Turn up to 100 expired claims into counted failures (as every claim does first); return how many."""
        return self.jobs.rescue_expired_jobs()

    def complete_job(self, claim: JobClaim, result: Any = None) -> Job:
        """Complete a claimed job in one transaction: re-check the worker lease and that the Session is not live,
        apply `result` through the kind's completion function, and mark the job done.

        Raises `WorkerLeaseLostError` when the lease is no longer held,
        `SessionLiveError` when the Session went live (release the job then),
        or the completion function's error; in every case nothing is written.
        `CommitOutcomeUnknownError` means the commit itself failed and the
        completion may or may not be durable: the claim records that
        (`JobClaim.outcome_unknown`), and its next `complete`, `fail` or
        `release` first re-reads the job, returning it when that completion
        is durable.
        """
        return self.jobs.complete_job(claim, result)

    def complete_and_claim(
        self,
        claim: JobClaim,
        result: Any = None,
        *,
        kinds: str | Iterable[str] | None = None,
        ttl_s: float | None = None,
    ) -> tuple[Job, JobClaim | None]:
        """Complete `claim` exactly as `complete_job` does and, in the same transaction, claim the next job exactly as
        `claim_job(kinds, ttl_s=ttl_s)` does; return the done job and the new claim (None when no job is due).

        One commit for what `complete_job` then `claim_job` commit twice: a worker that goes on to its next job
        pays a single transaction per job. Both happen or neither: when the completion is refused
        (`WorkerLeaseLostError`, `SessionLiveError`, the completion function's error) nothing is written and nothing
        is claimed. After `CommitOutcomeUnknownError` the claim is settled as after `complete_job`'s; the next job,
        if its claim was durable after all, is held by no one and is rescued once its worker lease expires, as the
        claim of a worker that died is. For a claim whose earlier completion had an unknown outcome the job is
        re-read first: when that completion is durable after all, the done job is returned with None (nothing is
        claimed); otherwise it is completed and the next job claimed as above.
        """
        return self.jobs.complete_and_claim(claim, result, kinds=kinds, ttl_s=ttl_s)

    def fail_job(self, claim: JobClaim, message: str, *, permanent: bool = False) -> Job:
        """Record one counted failure of a claimed job with a bounded diagnostic `message`.

        A retryable failure returns the job to pending with the next retry
        deadline of `RETRY_SCHEDULE`; a permanent one, or the third failure,
        leaves it terminally failed. Raises `WorkerLeaseLostError` (writing
        nothing) when this worker no longer holds the job. After a completion
        with an unknown outcome, returns the done job instead when that
        completion is durable (see `complete_job`).
        """
        return self.jobs.fail_job(claim, message, permanent=permanent)

    def release_job(self, claim: JobClaim, reason: str = 'released by the worker') -> Job:
        """Return a claimed job to pending without consuming an attempt (Session went live, worker shutting down).

        Raises `WorkerLeaseLostError` (writing nothing) when this worker no
        longer holds the job. After a completion with an unknown outcome,
        returns the done job instead when that completion is durable (see
        `complete_job`).
        """
        return self.jobs.release_job(claim, reason)

    def release_job_at_once(self, claim: JobClaim, reason: str) -> bool:
        """`release_job` through a zero-wait connection of its own, for a process that must end now (a second stop
        request, from its signal handler, whatever the store's own connection is doing): it never waits for a busy
        database and never raises. True when the job is pending again; False when it could not be released (the
        database busy, the claim no longer held or its completion's outcome unknown, any failure): the worker lease
        then expires, and the next claim rescues the job as a counted failure."""
        return self.jobs.release_job_at_once(claim, reason)

    def renew_job(self, claim: JobClaim, ttl_s: float | None = None) -> float:
        """Extend a held worker lease by `ttl_s` (default `worker_lease_ttl_s`) from now; return the new expiry."""
        return self.jobs.renew_job(claim, ttl_s)

    def cancel_job(self, job_id: str, *, reason: str = 'cancelled by the operator') -> Job:
        """Cancel a pending or claimed job: it becomes terminal ('cancelled') without consuming an attempt.

        A worker holding it loses its authority (its late write is refused).
        Raises `JobStateError` for a job that is already done, failed or
        cancelled. `retry_failed_job` puts a cancelled job back in the queue.
        """
        return self.jobs.cancel_job(job_id, reason=reason)

    def retry_failed_job(self, job_id: str) -> Job:
        """Reset one terminal (failed or cancelled) job to pending, due now, with its failed-attempt count cleared.

        Its ID, kind, Session and source provenance stay exactly as they
        were; the diagnostics keep their history plus a "reset" entry. Raises
        `JobStateError` for a job that is pending, claimed or done.
        """
        return self.jobs.retry_failed_job(job_id)

    def resolve_job_id(self, prefix: str) -> str:
        """The full ID of the one job whose ID is `prefix` or starts with it (at least 4 characters, any case).

        Raises `JobNotFoundError` when none matches and `AmbiguousIdError`
        when the prefix is too short or matches several (listing them).
        """
        return self.jobs.resolve_job_id(prefix)

    def waiting_jobs(self, *, kinds: Iterable[str] | None = None, limit: int = 20) -> WaitingPage:
        """The pending and claimed jobs of `kinds` (default: every registered kind), soonest due first, at most
        `limit` (1-100) of them, each with why it waits; and how many wait in all. Read-only."""
        return self.job_status.waiting_jobs(kinds=kinds, limit=limit)

    def rescue_dead_claim(self, job_id: str) -> Job:
        """Free a job claimed by a worker that died on this host, before its lease expires: record one counted
        failure, as the next claim would after the expiry (the job retries by the schedule, or fails terminally
        at its third failure).

        Raises `JobStateError`, changing nothing, unless the job is claimed
        and its holder is provably dead (`holder_is_dead`), and
        `JobNotFoundError` for an unknown job.
        """
        return self.job_status.rescue_dead_claim(job_id)

    def job_source_bytes(self, job: Job) -> int | None:
        """The stored size in bytes of the events a job's source names by `first_seq`..`last_seq` (a distill
        job's), or None for a source that names no such range."""
        return self.job_status.job_source_bytes(job)

    def plan_compaction(
        self,
        session_id: str,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
        policy: CompactionPolicy | None = None,
        force: bool = False,
    ) -> CompactionPlan:
        """Plan (read-only) which leading turns of a Session's replay view to compact; see `CompactionPolicy`.

        `count_tokens(event)` returns an event's tokens (the model's tokenizer;
        default `estimate_tokens`). `force` compacts below the trigger (all but
        the preserved turns). The source never holds more than
        `source_token_budget(context_window, its Summary budget)` tokens: when
        the turns due do not fit, the plan is the first step of a compaction in
        steps (see `compaction/steps.py`). Planned with `estimate_tokens`, the
        source records `tokens_estimated: true` and the reason marks its token
        figures "(estimated)". Raises `TurnTooLargeError` when a
        turn alone cannot fit, and `SummaryProvenanceError` when the newest
        Summary does not verify.
        """
        return self.compaction.plan_compaction(
            session_id, context_window=context_window, count_tokens=count_tokens, policy=policy, force=force
        )

    def plan_next_compaction_step(
        self,
        job: Job,
        text: str,
        model_ref: str | None = None,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
    ) -> NextStep | None:
        """Read-only: the next step after compaction job `job` completes with the Summary `text` (see
        `compaction/steps.py`), for a `context_window`-token model counting with `count_tokens`; pass it to the
        completion as `SummaryDraft.next_step`.

        None when `job` is not a step short of its goal, or when the view
        will be at most the target once its Summary lands. Counted with
        `estimate_tokens`, the step's source records `tokens_estimated`. Raises
        `TurnTooLargeError` when the next turn does not fit the model. `job`'s
        source is as a claim checked it (`run_one_job` checks a claimed job's).
        """
        return self.compaction.plan_next_compaction_step(
            job, text, model_ref, context_window=context_window, count_tokens=count_tokens
        )

    def compaction_draft(
        self,
        job: Job,
        text: str,
        model_ref: str | None = None,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
    ) -> SummaryDraft:
        """What compaction job `job` completes with once its Summary `text` is written (and checked): the text, the
        model snapshot reference (None for a Summary no model wrote), and, for a step of a compaction in steps, the
        next step (`plan_next_compaction_step` for a `context_window`-token model counting with `count_tokens`).
        When the next turn cannot fit the model, this step's Summary still lands and the chain stops, the draft (and
        the done job's result) saying why (`chain_stopped`). Read-only."""
        return self.compaction.compaction_draft(
            job, text, model_ref, context_window=context_window, count_tokens=count_tokens
        )

    def queue_compaction(
        self,
        session_id: str,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
        policy: CompactionPolicy | None = None,
        force: bool = False,
    ) -> CompactionQueued:
        """Plan compaction and queue the job (idempotent per plan: the same source is queued once); never runs
        inference.

        At most one compaction job per Session is pending or claimed: while
        one is, it is returned with `created=False`, as is an earlier job of
        exactly this plan (the reason says what became of it). Queueing is
        allowed while the Session is live; workers skip it until the lease
        ends. Raises `TurnTooLargeError` when a turn cannot fit the model.
        """
        return self.compaction.queue_compaction(
            session_id, context_window=context_window, count_tokens=count_tokens, policy=policy, force=force
        )

    def compaction_source(
        self, job_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> ReplayPage:
        """One page of a compaction job's source prefix in replay order (base Summary first), bounded like replay.

        Raises `InvalidJobSourceError` when the job's source is malformed and
        `SourceChangedError` when its base Summary is gone.
        """
        return self.compaction.compaction_source(job_id, after_seq, limit=limit, max_bytes=max_bytes)

    def read_compaction_source(self, job: Job, *, max_total_bytes: int | None = None) -> list[Event]:
        """Every event of compaction job `job`'s source prefix in replay order (base Summary first), at most
        `max_total_bytes` (default `page_bytes`) in all, read page by page in one read transaction.

        Raises `InvalidJobSourceError` when the source is malformed (a job
        read from a database an older version or a hand wrote),
        `SourceTooLargeError` (a permanent job failure) past the cap and
        `SourceChangedError` when the source no longer matches the job.
        """
        return self.compaction.read_compaction_source(job, max_total_bytes=max_total_bytes)

    def revert_compaction(self, session_id: str, summary_seq: int | None = None) -> CompactionReversal:
        """Revert the Session's newest Summary in effect (`summary_seq` must name it, when given), in one transaction:
        replay then shows what it replaced again; the Summary stays stored with its provenance, marked reverted.

        Raises `SummaryStateError` when there is none, or `summary_seq` names
        another event or Summary, or the view would refer to more media than a
        replay may; `SessionBusyError` while the Session is leased or a worker
        runs one of its compaction jobs; `SummaryProvenanceError` when the
        Summary, or the one replay would start from, does not verify. Nothing
        is changed then.
        """
        return self.compaction_revert.revert_compaction(session_id, summary_seq)

    def redo_compaction(self, session_id: str, summary_seq: int | None = None) -> CompactionReversal:
        """Put a reverted Summary back in effect, in one transaction, after re-verifying it: replay starts from it
        again. Without `summary_seq`, the most recently reverted Summary whose base is the newest Summary in effect
        (or none); with it, that Summary, whose base must be. The next step of a compaction in steps that
        reverting the Summary cancelled is pending again (`requeued_jobs`).

        Raises `SummaryStateError` when there is no such Summary or its base is
        not where replay now starts (the message says what to revert or redo
        first); `SessionBusyError` while the Session is leased or a worker runs
        one of its compaction jobs; `SummaryProvenanceError` when it does not
        verify. Nothing is changed then.
        """
        return self.compaction_revert.redo_compaction(session_id, summary_seq)

    def raw_events(
        self, session_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> RawPage:
        """One page of every stored event of a Session after `after_seq`, in seq order, including the events a Summary
        replaced and Summary events themselves, each with what covers it (see the module docstring).

        Bounded in items and bytes like `replay` (`max_bytes` at least the
        per-event cap); read-only, and it verifies no provenance.
        """
        return self.raw_history.raw_events(session_id, after_seq, limit=limit, max_bytes=max_bytes)

    def remember(
        self,
        workspace: WorkspaceLike,
        key: str,
        content: str,
        *,
        confidence: float = 1.0,
        source: KnowledgeSource | None = None,
        new_workspace: bool = False,
        client: str | None = None,
        unless_pinned: bool = False,
    ) -> KnowledgeVersion:
        """Upsert `key` in the caller's workspace by appending an immutable version; return the newest version.

        A directory that is no known workspace yet becomes one, except when
        another known workspace was last seen at its path (a re-clone, say):
        that raises `WorkspaceReplacedError` naming the rebind command, unless
        `new_workspace` says the directory is a new, unrelated workspace.

        `confidence` is in [0, 1]. Optional `source` provenance must name a
        Session of the same workspace, a seq range within its transcript and
        that range's `source_digest`; it is verified inside the transaction.
        Remembering exactly the current content, confidence and source appends
        nothing. A tombstoned key is revived by a new version. `client` names
        the program that asked (an MCP client, "name version"), kept on the
        version; None for Emelex's own callers. With `unless_pinned` (a writer
        that leaves pinned entries to the user) a pinned entry raises
        `KnowledgePinnedError`, checked inside the writing transaction.
        """
        return self.knowledge.remember(
            workspace,
            key,
            content,
            confidence=confidence,
            source=source,
            new_workspace=new_workspace,
            client=client,
            unless_pinned=unless_pinned,
        )

    def forget(self, workspace: WorkspaceLike, key: str, *, client: str | None = None) -> KnowledgeVersion:
        """Tombstone `key` in the caller's workspace; return the tombstone version.

        The tombstone keeps the retired version's confidence and provenance;
        recall no longer shows the entry and `maintain` deletes it after the
        grace period. Raises `KnowledgePinnedError` for a pinned entry and
        `KnowledgeNotFoundError` when the key is unknown here. Forgetting a
        tombstoned entry changes nothing. `client` as for `remember`.
        """
        return self.knowledge.forget(workspace, key, client=client)

    def pin(self, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Pin `key`: automatic distillation and retention will neither change, tombstone nor delete it.

        Raises `KnowledgeNotFoundError` when the key is unknown here and
        `KnowledgeForgottenError` when the entry is a tombstone (remember it again first).
        """
        return self.knowledge.pin(workspace, key)

    def unpin(self, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Remove the pin from `key`, making it subject to distillation and retention again."""
        return self.knowledge.unpin(workspace, key)

    def recall(
        self,
        workspace: WorkspaceLike,
        *,
        cursor: str | None = None,
        limit: int | None = None,
        max_bytes: int | None = None,
        include_tombstones: bool = False,
    ) -> KnowledgePage:
        """Page through the workspace's Knowledge by key with a stable `(key, id)` cursor, bounded in items and bytes.

        Tombstoned entries are excluded unless `include_tombstones`.
        `max_bytes` must fit at least one largest entry.
        """
        return self.knowledge.recall(
            workspace, cursor=cursor, limit=limit, max_bytes=max_bytes, include_tombstones=include_tombstones
        )

    def get_knowledge(self, workspace: WorkspaceLike, key: str) -> KnowledgeEntry:
        """Return one entry of the workspace, tombstoned or not; raise `KnowledgeNotFoundError` if there is none."""
        return self.knowledge.get_knowledge(workspace, key)

    def knowledge_history(
        self,
        workspace: WorkspaceLike,
        key: str,
        after_version: int = 0,
        *,
        limit: int | None = None,
        max_bytes: int | None = None,
    ) -> KnowledgeHistoryPage:
        """Read the versions of one entry after `after_version` (exclusive), oldest first, bounded in items and bytes.

        Versions older than the retention limits may have been pruned by
        `maintain`, so the first version returned can be later than 1.
        """
        return self.knowledge.knowledge_history(workspace, key, after_version, limit=limit, max_bytes=max_bytes)

    def knowledge_source(self, session_id: str, first_seq: int, last_seq: int) -> KnowledgeSource:
        """Build provenance for events `first_seq..last_seq` of a Session by computing their source digest.

        The range must exist and hold at most `knowledge_source_max_bytes`;
        raises `InvalidKnowledgeError` otherwise.
        """
        return self.knowledge.knowledge_source(session_id, first_seq, last_seq)

    def queue_distillation(self, session_id: str) -> Enqueued | None:
        """Queue distillation of the Session's events not yet covered by a pending, running or done distill job.

        Keyed by (Session, source digest): queueing the same source again
        returns the existing job with `created=False`. Returns None for a
        Session without events. Only queues; a worker runs it later.
        """
        return self.distillation.queue_distillation(session_id)

    def read_distillation_source(self, job: Job) -> list[Event]:
        """The source events of a distill job, oldest first, verified against its digest.

        Raises `SourceTooLargeError` when the range holds more than
        `knowledge_source_max_bytes` and `SourceChangedError` when the events
        no longer match the digest.
        """
        return self.distillation.read_distillation_source(job)

    def bind_session_model(
        self, session_id: str, model: InstalledModel, *, lock_timeout_s: float | None = None
    ) -> BoundModel:
        """Validate `model` and record that the Session uses it, holding the snapshot lock through the commit.

        Accepts only an `InstalledModel` (never a path or name) of this
        store's Home, bound to that Home's standard database (where the
        removal guard looks). Raises `ModelNotInstalledError` /
        `ModelTamperedError` from validation and `SessionNotFoundError`; in
        every error case nothing is written.
        """
        return self.model_refs.bind_session_model(session_id, model, lock_timeout_s=lock_timeout_s)

    def session_model_refs(
        self, session_id: str, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> SessionModelRefPage:
        """Page through the model snapshots a Session was bound to, by snapshot ID, bounded in items and bytes.

        `max_bytes` must be at least `MIN_REF_PAGE_BYTES` (360), so every page
        holds at least one reference. Pass `next_cursor` back to continue; it
        is None after the last page.
        """
        return self.model_refs.session_model_refs(session_id, cursor=cursor, limit=limit, max_bytes=max_bytes)

    def snapshot_references(self, snapshot_id: str, *, limit: int = 3) -> tuple[int, list[str]]:
        """(how many retained Sessions reference `snapshot_id`, up to `limit` of their IDs)."""
        return self.model_refs.snapshot_references(snapshot_id, limit=limit)

    def model_name_references(self, name: str, *, limit: int = 3) -> tuple[int, list[str]]:
        """(how many retained Sessions reference any snapshot installed as model `name`, up to `limit` of their IDs),
        read from the references' `<name>@` prefix."""
        return self.model_refs.model_name_references(name, limit=limit)

    def delete_session(self, session_id: str, *, discard_journal: bool = False) -> SessionDeletion:
        """Delete a Session transactionally, and the assets that become unreferenced; return what was removed.

        Refuses with `SessionBusyError` (deleting nothing) while the Session
        has a live lease or a worker holds a live claim on one of its jobs,
        and with `OpenJournalError` while it has an open agent journal (the
        record of a tool call that may have run) unless `discard_journal`;
        raises `SessionNotFoundError` for an unknown ID. Knowledge citing the
        Session keeps the source Session UUID, sequence range and digest.
        Assets put or linked within the asset grace period (one hour) or
        after the Session's last update (e.g. just put by a writer about to
        link them) are left to `maintain`'s collection. Files are removed
        after the deletion committed: if that fails (the typed error of the
        I/O failure is raised, saying so), the Session is deleted all the
        same and the files stay as orphans that a later collection removes.
        """
        return self.deletion.delete_session(session_id, discard_journal=discard_journal)

    def maintain(self, *, vacuum: bool = False, dry_run: bool = False) -> MaintenanceReport:
        """Run bounded maintenance (see the module docstring) and return a report of what was done.

        Each step commits on its own and is safe to re-run. When one fails
        (an I/O error, say), raises `MaintenanceError` naming it; its `report`
        holds the steps completed before it and the counts so far. With
        `dry_run=True` nothing changes: the row changes are made in a
        transaction that is rolled back, and the file-level steps (asset file
        removal, optimize, VACUUM, WAL truncation) are skipped; the file counts
        are then None (not predicted). `vacuum=True` additionally rewrites the
        database file, dropping free pages.
        """
        return self.maintenance.maintain(vacuum=vacuum, dry_run=dry_run)

    def save_model_state(
        self, lease: SessionLease, *, state_key: str, prefix_tokens: int, prefix_digest: str, data: bytes
    ) -> ModelState:
        """Store `data` as an asset and record it as the state of the lease's Session under `state_key`, replacing
        the one saved before under that key, in one write transaction that re-checks the lease (as `append_turn`
        does: `LeaseLostError`, `LeaseExpiredError`, `StaleCursorError`, ...). `state_key` and `prefix_digest` are
        64 lowercase hex digits and `prefix_tokens` a positive int (`InvalidInputError` otherwise, nothing stored);
        `data` is bounded like every asset (`AssetTooLargeError` beyond 128 MiB)."""
        return self.model_states.save_model_state(
            lease, state_key=state_key, prefix_tokens=prefix_tokens, prefix_digest=prefix_digest, data=data
        )

    def model_state(self, session_id: str, state_key: str) -> ModelState | None:
        """The state saved for Session `session_id` under `state_key`, or None (`SessionNotFoundError` for an
        unknown Session). Read its bytes with `read_asset(state.asset)`, which verifies them."""
        return self.model_states.model_state(session_id, state_key)

    def search(
        self,
        workspace: WorkspaceLike,
        query: str,
        *,
        kinds: Iterable[str] = ('knowledge', 'sessions'),
        limit: int | None = None,
        max_bytes: int | None = None,
        cursor: str | None = None,
        query_vector: Sequence[float] | None = None,
        embedding_model: str | None = None,
    ) -> SearchPage:
        """Search the workspace's live Knowledge and/or its Sessions' transcripts for any word of `query`.

        A page holds at most `limit` hits whose snippets (plus 256 bytes of
        citation each) add up to at most `max_bytes`, best first, Knowledge
        and transcript hits in one ranking (see `search/ranking.py`: BM25 with
        this workspace's statistics alone). `kinds` is "knowledge", "sessions"
        or both. Pass `next_cursor` back for the next page (a cursor is a
        position in the ranking: writes in between may shift what it continues
        with). A directory that is no known workspace has no hits.

        The query is cut into words (letters and digits), each searched for as
        a word of its own; FTS5 operators, quotes and NUL are only separators.
        With `query_vector` (the query embedded by the embedder whose model
        is `embedding_model`), the rows whose stored vectors are most similar
        are fused with the full-text ranking (`search/vectors.py`); rows not
        embedded yet are found by full text alone.

        Raises `InvalidInputError` for a query that is not text, not valid
        UTF-8, longer than 4096 bytes or without any word, for bad limits,
        kinds or cursor, and for a vector without its model or not 1..16,384
        finite numbers; nothing is written either way.
        """
        return self.search_index.search(
            workspace,
            query,
            kinds=kinds,
            limit=limit,
            max_bytes=max_bytes,
            cursor=cursor,
            query_vector=query_vector,
            embedding_model=embedding_model,
        )

    def select_recall(
        self, workspace: WorkspaceLike, query: str, budget_tokens: int, *, count_tokens: TokenCounter | None = None
    ) -> RecallSelection:
        """Select what a new Session starts with: pinned Knowledge first, then the Knowledge entries and transcript
        turns relevant to `query` (e.g. the first user message), best first, within `budget_tokens`; see
        `search/recall.py`.

        Returns the notes with the turn of each Knowledge note's source, read
        in one read transaction; record `payload()` before the model's first
        round (replay it on resume; never select again). A note costs
        `count_tokens(note_text)` tokens (default: one per 4 UTF-8 bytes).
        Tombstones and entries whose content is a JSON object or array are
        never selected; a query without words (or unrelated to anything: no
        note relevant enough) gets the pinned notes only; a query longer than
        4096 bytes is read from its start. Raises `InvalidInputError` for a
        budget outside 1..1,000,000 or a query that is not text; writes nothing.
        """
        return self.search_index.select_recall(workspace, query, budget_tokens, count_tokens=count_tokens)

    def latest_import(self, format: str, key: str) -> ImportRecord | None:
        """The newest committed import run of source `key` in `format`, or None when none is recorded (never
        imported, or its Session was deleted since)."""
        return self.interchange.latest_import(format, key)

    def session_imports(self, session_id: str) -> list[ImportRecord]:
        """The import runs that wrote Session `session_id`, oldest first (at most 1000): its provenance, each with
        the source file, the digest of the source through the run's last line, and the line range read."""
        return self.interchange.session_imports(session_id)

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
        return self.interchange.import_history(
            workspace,
            source,
            events,
            planned_from=planned_from,
            title=title,
            new_workspace=new_workspace,
            distill=distill,
        )

    def export_records(self) -> Iterator:
        """Every record of an export of this store, from one consistent snapshot (see `interchange/export.py`):
        `ExportCounts`, then `ExportedAsset`s, each `ExportedSession` followed by its `ExportedEvent`s, then the
        `ExportedEntry`s. Consume it on the calling thread; it holds a read snapshot until exhausted or closed."""
        return self.interchange.export_records()

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
        return self.interchange.restore_session(workspace, session, events, new_workspace=new_workspace)

    def restore_entry(
        self, workspace: str | os.PathLike[str], entry: ExportedEntry, *, new_workspace: bool = False
    ) -> bool:
        """Write an exported Knowledge entry with all its versions into `workspace`, in one transaction; True when
        written, False when the workspace already held exactly it. Raises `ImportConflictError` when it holds the
        key otherwise, or a version's provenance does not match the Session here; nothing is written then."""
        return self.interchange.restore_entry(workspace, entry, new_workspace=new_workspace)

    def pending_embeddings(self, model: str, *, limit: int = 64) -> list[EmbeddingItem]:
        """At most `limit` (1..512) indexed rows without a vector for `model`, events first, oldest first."""
        return self.search_vectors.pending_embeddings(model, limit=limit)

    def put_embeddings(self, model: str, embedded: Sequence[tuple[EmbeddingItem, Sequence[float]]]) -> int:
        """Store each item's vector for `model`, in one transaction; return how many were stored.

        An item whose row was deleted or no longer holds the embedded text is
        skipped (embed it again when `pending_embeddings` offers it). Raises
        `InvalidInputError` (nothing written) for a bad model name, more than
        512 items, a vector that is not 1..16,384 finite numbers, or vectors
        of another length than this model's stored ones.
        """
        return self.search_vectors.put_embeddings(model, embedded)

    def embedding_counts(self, model: str) -> tuple[int, int]:
        """(rows with a vector for `model`, indexed rows without one)."""
        return self.search_vectors.embedding_counts(model)

    # -- end of the GENERATED methods --


def __getattr__(name: str) -> object:
    """`SessionPage`, re-exported from `sessions/service.py` on first use."""
    if name == "SessionPage":
        from .sessions.service import SessionPage

        return SessionPage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
