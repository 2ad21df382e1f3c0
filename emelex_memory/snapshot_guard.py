"""`MemorySnapshotReferenceGuard`: keeps a model snapshot that a retained Session references from being removed.

It opens the standard store (`MemoryStore.open`), so it lives beside `store.py`
rather than in `snapshots/`, which never imports the store.
"""

from __future__ import annotations

from .errors import ModelInUseError, NoStoreError
from .core.settings import Settings
from .snapshots.installed import InstalledModel
from .store import MemoryStore


class MemorySnapshotReferenceGuard:
    """The default removal guard: refuses to remove a snapshot that a retained Session of Home's standard
    database references.

    Lazy: the database is opened on the first check, not at construction,
    and never created: a Home where no store was ever created has no
    references. A store whose database was deleted fails closed
    (`DatabaseDeletedError`), judged by the same evidence the opener uses
    (`opening.store_evidence`: the marked sidecar, `<Home>/.memory-store`,
    the asset folder), so a deleted but restorable store keeps its
    references. Call `close()` when done.
    """

    def __init__(self, settings: Settings) -> None:
        """Guard the standard database of `settings.home_dir`; nothing is opened yet."""
        self.settings = settings
        self._store: MemoryStore | None = None

    def check_removable(self, model: InstalledModel) -> None:
        """Raise `ModelInUseError` when a retained Session references `model`'s snapshot; call under the lock."""
        store = self._open()
        if store is None:
            return
        count, ids = store.snapshot_references(model.snapshot_id)
        if count:
            more = f" and {count - len(ids)} more" if count > len(ids) else ""
            raise ModelInUseError(
                f"model {model.name!r} is referenced by {count} retained Session(s) ({', '.join(ids)}{more}); "
                "delete them with `emelex memory sessions delete SESSION` first, or keep the model"
            )

    def check_name_removable(self, name: str) -> None:
        """Raise `ModelInUseError` when a retained Session references any snapshot installed as model `name`: what
        removing a damaged model, whose snapshot ID cannot be read, must respect. Call under the lock."""
        store = self._open()
        if store is None:
            return
        count, ids = store.model_name_references(name)
        if count:
            more = f" and {count - len(ids)} more" if count > len(ids) else ""
            raise ModelInUseError(
                f"model {name!r} is damaged, so which snapshot it holds is unknown, and {count} retained Session(s) "
                f"({', '.join(ids)}{more}) were bound to a model named {name!r}; delete them with `emelex memory "
                "sessions delete SESSION` first, or restore the model's directory from a backup"
            )

    def _open(self) -> MemoryStore | None:
        if self._store is None:
            try:
                self._store = MemoryStore.open(self.settings, create=False)
            except NoStoreError:
                return None
        return self._store

    def close(self) -> None:
        """Close the database if a check opened it."""
        if self._store is not None:
            self._store.close()
            self._store = None
