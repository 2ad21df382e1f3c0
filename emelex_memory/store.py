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
    store.search_index  full-text search over Knowledge and transcripts: `store.search` (`search/`)
    store.interchange   imports of other agents' histories, Emelex exports out and back in (`interchange/`)
    store.search_vectors  an embedder's vectors of the indexed rows (`search/vectors.py`)

Every method the documentation shows on the store (`store.put_asset`, `store.claim_job`, ...) stays there: the
table `_API` below names the service that answers it, and the store forwards the call unchanged. `finish_session`
and `work_distillation` are the store's own, as they span a lease, the queue and the runner.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .assets.refs import asset_dir_for
from .core.database import Clock, Database
from .core.io_errors import restated
from .core.opening import STORE_MARKER, check_missing_database, open_database, reinitialize_database
from .core.private_files import absolute, check_home, check_no_symlinks, check_private_dir, ensure_private_dir
from .errors import CommitOutcomeUnknownError, InvalidInputError, LeaseLostError, OpenJournalError
from .job_kinds import DEFAULT_KINDS, DISTILL_KIND
from .queue.kinds import JobKindRegistry
from .sessions.holders import open_journal
from .settings import Settings

if TYPE_CHECKING:
    from .assets.service import AssetStore
    from .compaction.planning import Compaction
    from .compaction.raw_history import RawHistory
    from .compaction.revert import CompactionRevert
    from .knowledge.distillation import DistillFunction, Distillation, TokenCounter
    from .knowledge.service import Knowledge
    from .maintenance.deletion import Deletion
    from .maintenance.retention import Maintenance
    from .interchange.service import Interchange
    from .search.service import Search
    from .search.vectors import Vectors
    from .queue.jobs import Enqueued
    from .queue.runner import JobOutcome
    from .queue.service import JobQueue
    from .queue.status import JobStatus
    from .sessions.leases import SessionLease
    from .sessions.service import Sessions
    from .sessions.workspace_admin import WorkspaceAdmin
    from .snapshots.refs import SessionModelRefs

__all__ = ["STORE_MARKER", "MemoryStore", "SessionPage"]  # SessionPage: see __getattr__ below

# Which service answers each method of the store's public API.
_API = {
    "sessions": ("create_session", "get_session", "list_sessions", "acquire_lease", "replay", "resolve_session_id"),
    "workspaces": ("list_workspaces", "get_workspace", "workspace_rebinds", "rebind_workspace"),
    "assets": (
        "asset_dir", "put_asset", "read_asset", "open_asset", "asset_entries", "asset_links", "list_assets",
        "asset_totals", "verify_assets", "collect_assets",
    ),
    "jobs": (
        "enqueue_job", "get_job", "list_jobs", "failed_jobs", "claim_job", "rescue_expired_jobs", "renew_job",
        "complete_job", "complete_and_claim", "fail_job", "release_job", "cancel_job", "retry_failed_job",
        "resolve_job_id",
    ),
    "job_status": ("waiting_jobs", "rescue_dead_claim", "job_source_bytes"),
    "compaction": (
        "plan_compaction", "plan_next_compaction_step", "queue_compaction", "compaction_source",
        "read_compaction_source",
    ),
    "compaction_revert": ("revert_compaction", "redo_compaction"),
    "raw_history": ("raw_events",),
    "knowledge": ("remember", "recall", "get_knowledge", "knowledge_history", "knowledge_source", "pin", "unpin", "forget"),
    "distillation": ("queue_distillation", "read_distillation_source"),
    "model_refs": ("bind_session_model", "session_model_refs", "snapshot_references", "model_name_references"),
    "deletion": ("delete_session",),
    "maintenance": ("maintain",),
    "model_states": ("save_model_state", "model_state"),
    "search_index": ("search", "select_recall"),
    "interchange": (
        "latest_import", "session_imports", "import_history", "export_records", "restore_session", "restore_entry",
    ),
    "search_vectors": ("pending_embeddings", "put_embeddings", "embedding_counts"),
}


def _check_database_path(path: Path) -> None:
    check_no_symlinks(path, what="database", fix="open {real} instead")


class MemoryStore:
    """One open Emelex database. Thread-safe; use it as a context manager or call `close()`."""

    # The services, each built on first use (`_SERVICES` below); `_API` forwards the public methods to them.
    sessions: Sessions
    workspaces: WorkspaceAdmin
    assets: AssetStore
    jobs: JobQueue
    job_status: JobStatus
    compaction: Compaction
    compaction_revert: CompactionRevert
    raw_history: RawHistory
    knowledge: Knowledge
    distillation: Distillation
    model_refs: SessionModelRefs
    deletion: Deletion
    maintenance: Maintenance
    search_index: Search
    interchange: Interchange
    search_vectors: Vectors

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
        self._building = threading.RLock()  # services are built on first use, once (see `_Service`)

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
        ensure_private_dir(home)
        ensure_private_dir(settings.memory_dir)
        conn = open_database(
            database, busy_timeout_ms=settings.busy_timeout_ms, marker=marker, evidence=evidence, create=create,
            where=home,
        )
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
        if lease._db is not self.db:
            raise InvalidInputError(
                f"the lease on Session {lease.session_id} belongs to another MemoryStore; call finish_session on "
                "the store that acquired it"
            )
        if lease._finish_unknown:  # an earlier finish may have committed: queueing again is idempotent
            try:
                return lease._end_with("released", None, functools.partial(self._finished, lease))
            except LeaseLostError:  # released by that commit, or when its `with` block was left
                return self.queue_distillation(lease.session_id)
        try:
            return lease._end_with("released", None, functools.partial(self._finished, lease))
        except CommitOutcomeUnknownError as exc:
            lease._finish_unknown = True
            raise restated(
                exc, self.path, f"finishing Session {lease.session_id} (queue distillation, release)",
                "call finish_session(lease) again: it queues the distillation unless this commit did, and releases "
                "the lease if it is still held",
            ) from exc.__cause__

    def _finished(self, lease: SessionLease, conn: Any) -> Enqueued | None:
        """Inside `finish_session`'s transaction: refuse an open agent journal (`OpenJournalError`: a turn that did
        not close is not a consistent history to distill), else queue the distillation."""
        if conn.execute(f"SELECT {open_journal('?')}", (lease._rowid,)).fetchone()[0]:
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


class _Service:
    """The store's attribute for one service: built over `store.db` on first use, then a plain attribute."""

    def __init__(self, module: str, cls: str, needs: tuple[str, ...] = ()) -> None:
        self.module, self.cls, self.needs = module, cls, needs

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def service_class(self) -> type:
        """The service's class (importing its module)."""
        return getattr(import_module(self.module, __package__), self.cls)

    def __get__(self, store: MemoryStore | None, owner: type | None = None) -> Any:
        if store is None:
            return self
        with store._building:
            built = store.__dict__.get(self.name)
            if built is None:
                needs = [store if need == "store" else getattr(store, need) for need in self.needs]
                built = store.__dict__[self.name] = self.service_class()(store.db, *needs)
        return built


class _Forwarded:
    """A method (or property) of the store's public API: the same one of the service that owns it."""

    def __init__(self, service: str, name: str) -> None:
        self.service, self.name = service, name

    @functools.cached_property
    def unbound(self) -> Any:
        """What `MemoryStore.<name>` shows: a function (or property) with the service's signature and docstring."""
        target = getattr(_SERVICES[self.service].service_class(), self.name)
        service, name = self.service, self.name
        if isinstance(target, property):
            return property(lambda store: getattr(getattr(store, service), name), doc=target.__doc__)

        @functools.wraps(target)
        def method(store: MemoryStore, *args: Any, **kwargs: Any) -> Any:
            return getattr(getattr(store, service), name)(*args, **kwargs)

        return method

    def __get__(self, store: MemoryStore | None, owner: type | None = None) -> Any:
        if store is None:
            return self.unbound
        return getattr(getattr(store, self.service), self.name)


_SERVICES = {  # attribute: the service's module and class, and what its constructor takes after the Database
    "sessions": _Service(".sessions.service", "Sessions"),
    "workspaces": _Service(".sessions.workspace_admin", "WorkspaceAdmin"),
    "assets": _Service(".assets.service", "AssetStore"),
    "jobs": _Service(".queue.service", "JobQueue", ("store", "job_kinds")),
    "job_status": _Service(".queue.status", "JobStatus", ("job_kinds",)),
    "compaction": _Service(".compaction.planning", "Compaction", ("jobs",)),
    "compaction_revert": _Service(".compaction.revert", "CompactionRevert", ("jobs",)),
    "raw_history": _Service(".compaction.raw_history", "RawHistory"),
    "knowledge": _Service(".knowledge.service", "Knowledge"),
    "distillation": _Service(".knowledge.distillation", "Distillation", ("jobs",)),
    "model_refs": _Service(".snapshots.refs", "SessionModelRefs"),
    "deletion": _Service(".maintenance.deletion", "Deletion"),
    "maintenance": _Service(".maintenance.retention", "Maintenance", ("assets", "jobs")),
    "model_states": _Service(".maintenance.model_states", "ModelStates", ("assets",)),
    "search_index": _Service(".search.service", "Search"),
    "interchange": _Service(".interchange.service", "Interchange", ("distillation",)),
    "search_vectors": _Service(".search.vectors", "Vectors"),
}
for _attribute, _descriptor in _SERVICES.items():
    setattr(MemoryStore, _attribute, _descriptor)
    _descriptor.__set_name__(MemoryStore, _attribute)
for _service, _names in _API.items():
    for _name in _names:
        setattr(MemoryStore, _name, _Forwarded(_service, _name))


def __getattr__(name: str) -> object:
    """`SessionPage`, re-exported from `sessions/service.py` on first use."""
    if name == "SessionPage":
        from .sessions.service import SessionPage

        return SessionPage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
