"""A closed `MemoryStore` raises one typed `StoreClosedError` from every method, never apsw's
`ConnectionClosedError`; leaving a lease's `with` block after the store was closed is no error."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory import AssetRef, MemoryStore, NewEvent, Settings, StoreClosedError
from emelex_memory.job_kinds import builtin_kinds

from ..support import kinds_fixture

KINDS = builtin_kinds()
KINDS.register("closedstore")

kinds = kinds_fixture(KINDS)


def _calls(store: MemoryStore, session: str, workspace: Path, ref: AssetRef):
    return {
        "get_session": lambda: store.get_session(session),
        "list_sessions": store.list_sessions,
        "create_session": lambda: store.create_session(workspace),
        "replay": lambda: store.replay(session),
        "acquire_lease": lambda: store.acquire_lease(session, workspace),
        "delete_session": lambda: store.delete_session(session),
        "remember": lambda: store.remember(workspace, "k", "v"),
        "recall": lambda: store.recall(workspace),
        "put_asset": lambda: store.put_asset(b"x", "image/png"),
        "read_asset": lambda: store.read_asset(ref),
        "verify_assets": store.verify_assets,
        "collect_assets": store.collect_assets,
        "list_jobs": store.list_jobs,
        "enqueue_job": lambda: store.enqueue_job("closedstore", session, {}),
        "claim_job": store.claim_job,
        "maintain": store.maintain,
        "list_workspaces": store.list_workspaces,
        "queue_distillation": lambda: store.queue_distillation(session),
    }


def test_every_method_of_a_closed_store_raises_store_closed(db_path: Path, settings: Settings,
                                                             workspace: Path) -> None:
    store = MemoryStore.open_path(db_path, settings, kinds=KINDS)
    session = store.create_session(workspace).id
    ref = store.put_asset(b"bytes", "image/png")
    store.close()
    store.close()  # closing twice is fine
    for name, call in _calls(store, session, workspace, ref).items():
        with pytest.raises(StoreClosedError, match="was closed; open it again") as caught:
            call()
        assert str(db_path) in str(caught.value), name


def test_a_lease_left_after_its_store_was_closed_is_no_error_and_is_released(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    store = MemoryStore.open_path(db_path, settings, kinds=KINDS)
    session = store.create_session(workspace).id
    with store.acquire_lease(session, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", "hi")])
        store.close()
        with pytest.raises(StoreClosedError):
            lease.append_turn([NewEvent("user", "again")])
    with MemoryStore.open_path(db_path, settings, kinds=KINDS) as again:  # released best-effort on the way out
        again.acquire_lease(session, workspace).release()
