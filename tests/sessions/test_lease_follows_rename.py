"""A live lease follows the directory it holds open: a rename keeps authority (and the lease reports the new path);
a removed directory does not."""

from __future__ import annotations

import pytest

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.errors import WorkspaceMissingError
from tests.support import table_rows


def test_a_lease_follows_a_rename_of_its_workspace(store: MemoryStore, workspace, tmp_path) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        renamed = tmp_path / "renamed"
        workspace.rename(renamed)
        lease.append_turn([NewEvent("user", {"text": "after the rename"})])
        lease.renew()
        assert lease.path == str(renamed)
    assert [e.payload["text"] for e in store.replay(session.id).events] == ["after the rename"]


def test_a_removed_workspace_blocks_the_lease_and_nothing_changes(store: MemoryStore, workspace) -> None:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    workspace.rmdir()
    before = table_rows(store.path)
    with pytest.raises(WorkspaceMissingError, match="is gone"):
        lease.append_turn([NewEvent("user", {"text": "x"})])
    assert table_rows(store.path) == before
    lease.release()
