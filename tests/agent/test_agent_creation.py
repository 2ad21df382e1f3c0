"""A new agent Session is one transaction: the Session, its model's binding, its lease and its snapshot commit
together, so a refused creation leaves nothing and the lease appends at once (counted by tests/support/counting.py).

Measured before `create_agent_session`: `DurableAgentSession.create` made four write transactions (the Session,
the model's binding, the lease, the snapshot) and a read (the lease's replay of the empty Session), and deleted the
Session again when the binding was refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_memory import (
    InvalidInputError,
    MemoryStore,
    ModelTamperedError,
    NewEvent,
    Settings,
    WorkspaceReplacedError,
    create_agent_session,
)
from emelex_memory.agent import journal
from emelex_workers.models import ModelManager

from ..support import table_rows
from ..support.agent_engine import snapshot
from ..support.counting import Counted
from ..support.plugins import fake_model_file


def test_a_new_agent_session_is_one_write_transaction_and_appends_at_once(store: MemoryStore, workspace: Path) -> None:
    with Counted(store) as counts:
        lease = create_agent_session(store, workspace, snapshot(), title="one commit")
    assert (counts.writes, counts.reads) == (1, 0), counts.sql
    with lease:
        assert journal.stored_snapshot(store, lease.session_id) == snapshot()
        assert store.get_session(lease.session_id).title == "one commit"
        turn = lease.append_turn([NewEvent("user", {"text": "hello"})])  # nothing to replay first
        assert (turn.first_seq, turn.last_seq) == (1, 1)


def test_the_model_is_bound_in_the_same_transaction_and_a_refused_one_leaves_nothing(
    settings: Settings, workspace: Path, tmp_path: Path
) -> None:
    with ModelManager(settings) as models:
        model = models.install(fake_model_file(tmp_path / "files"), name="fake")
    with MemoryStore.open(settings) as store:
        with Counted(store) as counts:
            lease = create_agent_session(store, workspace, snapshot(), model=model)
        assert counts.writes == 1
        (ref,) = store.session_model_refs(lease.session_id).refs
        assert ref.snapshot_id == model.snapshot_id
        lease.release()
        model.model_file.write_bytes(b"tampered")  # the file no longer matches its manifest
        before = table_rows(settings.database_path)
        with pytest.raises(ModelTamperedError):
            create_agent_session(store, workspace, snapshot(), model=model)
        assert table_rows(settings.database_path) == before  # no Session was created and deleted again


def test_bad_input_and_a_replaced_workspace_are_refused_writing_nothing(
    store: MemoryStore, workspace: Path, db_path: Path, tmp_path: Path
) -> None:
    create_agent_session(store, workspace, snapshot()).release()
    before = table_rows(db_path)
    with pytest.raises(InvalidInputError):
        create_agent_session(store, workspace, snapshot(), title="x" * 513)
    with pytest.raises(InvalidInputError):
        create_agent_session(store, workspace, {"not": "a snapshot"})
    workspace.rename(tmp_path / "moved")
    workspace.mkdir()  # another directory where the known workspace was
    with pytest.raises(WorkspaceReplacedError):
        create_agent_session(store, workspace, snapshot())
    assert table_rows(db_path) == before
