"""Workspace identity that survives inode reuse: `rm -r ws && mkdir ws` is refused for leases, appends,
Knowledge and distillation, with advice that names the workspace to rebind."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    InsecurePathError,
    KnowledgeNotFoundError,
    MemoryStore,
    WorkspaceIdentity,
    WorkspaceMissingError,
    WorkspaceReplacedError,
)
from emelex_memory.knowledge.distillation import KnowledgeCandidate

from ..support import table_rows
from ..support.workspace import rebind_hint, replace_directory, replace_reusing_inode, turn, with_history


# -- identity ---------------------------------------------------------------------------------------------


def test_same_directory_compares_every_component_known_on_both_sides() -> None:
    a = WorkspaceIdentity("/w", 1, 2, 7, 1000)
    assert a.same_directory(WorkspaceIdentity("/elsewhere", 1, 2, 7, 1000))  # spelling does not matter
    assert not a.same_directory(WorkspaceIdentity("/w", 1, 2, 8, 1000))  # another incarnation of inode 2
    assert not a.same_directory(WorkspaceIdentity("/w", 1, 2, 7, 1001))
    assert not a.same_directory(WorkspaceIdentity("/w", 1, 3, 7, 1000))
    assert a.same_directory(WorkspaceIdentity("/w", 1, 2, None, 1000))  # unknown on one side: not compared
    assert a.same_directory(WorkspaceIdentity("/w", 1, 2))


def test_a_session_records_what_the_file_system_offers(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    st = os.stat(workspace)
    assert (session.workspace.device, session.workspace.inode) == (st.st_dev, st.st_ino)
    assert session.workspace == WorkspaceIdentity.inspect(workspace) == store.get_session(session.id).workspace
    if session.workspace.generation is None and session.workspace.birth_ns is None:
        pytest.skip("this file system offers neither an inode generation nor a birth time")
    replace_directory(workspace)
    assert not WorkspaceIdentity.inspect(workspace).same_directory(session.workspace)


def test_tmpfs_offers_no_generation() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    d = shm / f"emelex-test-{os.getpid()}"
    d.mkdir()
    try:
        assert WorkspaceIdentity.inspect(d).generation is None
    finally:
        d.rmdir()


# -- rm -r ws && mkdir ws is refused ----------------------------------------------------------------------


def test_a_replacement_that_reuses_the_inode_is_refused_for_a_lease(store: MemoryStore, workspace: Path) -> None:
    sid = with_history(store, workspace)
    session = store.get_session(sid)
    replace_reusing_inode(workspace)
    before = table_rows(store.path)
    with pytest.raises(WorkspaceReplacedError) as raised:
        store.acquire_lease(sid, workspace)
    assert rebind_hint(session.workspace_id, workspace) in str(raised.value)
    with pytest.raises(WorkspaceReplacedError, match="workspaces rebind"):
        session.validate_workspace(workspace)
    assert table_rows(store.path) == before


def test_a_replacement_under_a_live_lease_blocks_the_append(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    lease.append_turn(turn())
    replace_directory(workspace)  # the lease holds the directory open, so its inode number is not reused
    before = table_rows(store.path)
    with pytest.raises(WorkspaceReplacedError, match=re.escape(rebind_hint(1, workspace))):
        lease.append_turn(turn())
    with pytest.raises(WorkspaceReplacedError):
        lease.renew()
    assert table_rows(store.path) == before


def test_a_workspace_row_changed_under_a_live_lease_blocks_the_append(
    store: MemoryStore, workspace: Path, tmp_path: Path
) -> None:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    store.create_session(workspace)  # the same directory at the same path: the row is unchanged
    lease.append_turn(turn())
    elsewhere = tmp_path / "elsewhere"
    workspace.rename(elsewhere)
    store.create_session(elsewhere)  # the row follows the rename ...
    elsewhere.rename(workspace)  # ... and the directory comes back: the path names the lease's directory again
    before = table_rows(store.path)
    for call in (lambda: lease.append_turn(turn()), lease.renew):
        with pytest.raises(WorkspaceReplacedError, match="was moved or rebound since this lease was taken"):
            call()
    assert table_rows(store.path) == before
    lease.release()
    with store.acquire_lease(session.id, workspace) as again:  # a new lease verifies the row afresh
        again.replay()
        again.append_turn(turn())
        again.release()


def test_a_lease_that_let_go_of_its_directory_reads_the_identity_afresh(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    blocker = apsw.Connection(str(store.path))
    blocker.execute("BEGIN IMMEDIATE")
    lease.close()  # busy: the lease stays active in the database, but its directory is closed
    blocker.execute("ROLLBACK")
    blocker.close()
    lease.append_turn(turn())  # the same directory: still accepted
    replace_reusing_inode(workspace)
    before = table_rows(store.path)
    with pytest.raises(WorkspaceReplacedError):
        lease.append_turn(turn())
    assert table_rows(store.path) == before


def test_a_replacement_that_reuses_the_inode_does_not_see_the_old_knowledge(
    store: MemoryStore, workspace: Path
) -> None:
    old = WorkspaceIdentity.inspect(workspace)
    store.remember(workspace, "build", "make test")
    replace_reusing_inode(workspace)
    before = table_rows(store.path)
    hint = re.escape(rebind_hint(1, workspace))
    for call in (store.recall, lambda w: store.knowledge_history(w, "build"), lambda w: store.remember(w, "k", "v"),
                 store.create_session):
        with pytest.raises(WorkspaceReplacedError, match=f"last seen at this path.*{hint}.*--new-workspace"):
            call(workspace)
    for call in (store.get_knowledge, store.forget, store.pin, store.unpin):
        with pytest.raises(WorkspaceReplacedError, match=hint):
            call(workspace, "build")
    with pytest.raises(WorkspaceReplacedError, match=r"workspaces rebind 1 .* --yes"):
        store.remember(old, "build", "overwritten")
    with pytest.raises(WorkspaceReplacedError, match="workspaces rebind 1 "):
        store.recall(old)
    assert table_rows(store.path) == before
    store.remember(workspace, "lint", "ruff", new_workspace=True)  # said to be a new, unrelated workspace
    assert [e.key for e in store.recall(workspace).entries] == ["lint"]
    with pytest.raises(KnowledgeNotFoundError):
        store.get_knowledge(workspace, "build")


def test_a_replaced_workspace_fails_distillation_with_the_rebind_advice(store: MemoryStore, workspace: Path) -> None:
    sid = with_history(store, workspace)
    store.queue_distillation(sid)
    replace_reusing_inode(workspace)
    outcome = store.work_distillation(lambda data: [KnowledgeCandidate("k", "v")])
    assert outcome.status == "failed"
    assert rebind_hint(store.get_session(sid).workspace_id, workspace) in outcome.detail
    assert "retry the job" in outcome.detail


def test_a_workspace_path_that_is_no_directory_is_refused_and_nothing_is_written(
    store: MemoryStore, tmp_path: Path
) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    afile = tmp_path / "file"
    afile.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = table_rows(store.path)
    with pytest.raises(InsecurePathError, match="symlink"):
        store.create_session(loop)
    for path in (afile, fifo):
        with pytest.raises(WorkspaceMissingError, match="not a directory"):
            store.create_session(path)
    with pytest.raises(WorkspaceMissingError, match="does not exist"):
        store.remember(tmp_path / "nope", "k", "v")
    assert table_rows(store.path) == before


# -- the advice names what happened: missing, elsewhere, or replaced at its path ------------------------------


def _refusals(store: MemoryStore, sid: str, directory: Path) -> list[str]:
    """The messages of `validate_workspace` and `acquire_lease` from `directory`, each checked to change nothing."""
    messages = []
    before = table_rows(store.path)
    for call in (store.get_session(sid).validate_workspace, lambda d: store.acquire_lease(sid, d)):
        with pytest.raises((WorkspaceMissingError, WorkspaceReplacedError)) as raised:
            call(directory)
        messages.append(str(raised.value))
    assert table_rows(store.path) == before
    return messages


def test_a_deleted_workspace_is_called_missing_and_its_parent_is_not_offered_to_rebind(
    store: MemoryStore, tmp_path: Path
) -> None:
    ws = (tmp_path / "ws3").resolve()
    ws.mkdir()
    sid = with_history(store, ws)
    shutil.rmtree(ws)
    for message in _refusals(store, sid, tmp_path):
        assert f"last seen at {ws}, is missing" in message
        assert "restore it" in message
        assert "workspaces rebind 1 DIRECTORY --yes" in message
        assert f"rebind 1 {tmp_path.resolve()} " not in message and "is a different directory" not in message
    with pytest.raises(WorkspaceMissingError):
        store.get_session(sid).validate_workspace(tmp_path)


def test_another_directory_while_the_workspace_exists_says_where_to_run_it(
    store: MemoryStore, tmp_path: Path
) -> None:
    ws = (tmp_path / "ws3").resolve()
    ws.mkdir()
    sid = with_history(store, ws)
    for message in _refusals(store, sid, tmp_path):
        assert f"run it from {ws} or pass --workspace {ws}" in message
        assert "rebind" not in message


def test_only_a_directory_replaced_at_the_recorded_path_gets_the_rebind_advice(
    store: MemoryStore, tmp_path: Path
) -> None:
    ws = (tmp_path / "ws3").resolve()
    ws.mkdir()
    sid = with_history(store, ws)
    replace_directory(ws)
    if WorkspaceIdentity.inspect(ws).same_directory(store.get_session(sid).workspace):
        pytest.skip("this file system cannot tell the new directory from the old one")
    for directory in (ws, tmp_path):  # from the replacement itself, or from elsewhere: the target is the recorded path
        for message in _refusals(store, sid, directory):
            assert rebind_hint(1, ws) in message
            assert f"rebind 1 {tmp_path.resolve()} " not in message
