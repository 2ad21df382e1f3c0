"""Listing known workspaces and the explicit, audited rebind of a replaced one, through the library."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from emelex_memory import (
    ConfirmationRequiredError,
    InvalidInputError,
    LeaseHeldError,
    MemoryStore,
    WorkspaceConflictError,
    WorkspaceIdentity,
    WorkspaceMissingError,
    WorkspaceNotFoundError,
    WorkspaceReplacedError,
)

from ..support import table_rows
from ..support.workspace import replace_directory, turn, with_history


# -- rebind -----------------------------------------------------------------------------------------------


def test_rebind_makes_the_new_directory_the_workspace_and_keeps_sessions_and_knowledge(
    cstore: MemoryStore, workspace: Path, clock
) -> None:
    store = cstore
    sid = with_history(store, workspace)
    old = store.get_session(sid).workspace
    replace_directory(workspace)  # a re-clone
    [info] = store.list_workspaces().workspaces
    assert (info.id, info.status, info.sessions, info.knowledge, info.rebinds) == (1, "replaced", 1, 1, 0)
    r = store.rebind_workspace(1, workspace, confirm=True)
    assert r.changed and r.new == WorkspaceIdentity.inspect(workspace)
    assert (r.old_path, r.old_device, r.old_inode, r.old_generation, r.old_birth_ns) == (
        old.path, old.device, old.inode, old.generation, old.birth_ns)
    assert f"pid {os.getpid()}" in r.rebound_by and r.rebound_at == clock.now
    with store.db.read() as conn:
        audit = conn.execute("SELECT workspace_id, old_path, new_path, new_inode, rebound_by FROM workspace_rebinds")
        assert audit.fetchall() == [(1, old.path, r.new.path, r.new.inode, r.rebound_by)]
    with store.acquire_lease(sid, workspace) as lease:
        assert [e.payload for e in lease.replay_all()] == [{"text": "hello"}, {"text": "ok"}]
        lease.append_turn(turn("after the re-clone"))
        lease.release()
    assert store.get_knowledge(workspace, "build").content == "make test"
    [info] = store.list_workspaces().workspaces
    assert (info.status, info.rebinds) == ("present", 1)


def test_rebind_refuses_bad_input_and_changes_nothing(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    sid = with_history(store, workspace)
    replace_directory(workspace)
    other = tmp_path / "other"
    other.mkdir()
    lease = store.acquire_lease(store.create_session(other).id, other)  # workspace 2, live
    before = table_rows(store.path)
    bad = [
        ((99, workspace), {"confirm": True}, WorkspaceNotFoundError, "no workspace 99"),
        ((0, workspace), {"confirm": True}, InvalidInputError, "positive integer"),
        ((True, workspace), {"confirm": True}, InvalidInputError, "positive integer"),
        (("1", workspace), {"confirm": True}, InvalidInputError, "positive integer"),
        ((2**63, workspace), {"confirm": True}, InvalidInputError, "positive integer"),
        ((1, tmp_path / "nope"), {"confirm": True}, WorkspaceMissingError, "does not exist"),
        ((1, other), {"confirm": True}, WorkspaceConflictError, "already is workspace 2"),
        ((2, workspace), {"confirm": True}, LeaseHeldError, "wait for it to finish"),
        ((1, workspace), {}, ConfirmationRequiredError, "--yes"),
    ]
    for args, kwargs, error, message in bad:
        with pytest.raises(error, match=message):
            store.rebind_workspace(*args, **kwargs)
    assert table_rows(store.path) == before
    lease.release()
    with pytest.raises(WorkspaceReplacedError):
        store.acquire_lease(sid, workspace)  # still not rebound


def test_rebinding_to_the_directory_it_already_is_records_nothing(store: MemoryStore, workspace: Path) -> None:
    with_history(store, workspace)
    before = table_rows(store.path)
    r = store.rebind_workspace(1, workspace, confirm=True)
    assert not r.changed and r.new.path == str(workspace.resolve())
    assert table_rows(store.path) == before


def test_renames_keep_working_and_the_path_follows(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    sid = with_history(store, workspace)
    renamed = tmp_path / "renamed"
    workspace.rename(renamed)
    [info] = store.list_workspaces().workspaces
    assert info.status == "missing"
    with store.acquire_lease(sid, renamed) as lease:
        lease.replay()
        lease.append_turn(turn())
        lease.release()
    assert store.get_knowledge(renamed, "build").content == "make test"
    [info] = store.list_workspaces().workspaces
    assert (info.path, info.status) == (str(renamed.resolve()), "present")
    assert store.get_session(sid).workspace.path == str(renamed.resolve())


def test_workspace_pages_are_bounded_and_use_a_cursor(store: MemoryStore, tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"ws{i}").mkdir()
        store.create_session(tmp_path / f"ws{i}")
    shutil.rmtree(tmp_path / "ws3")
    seen, cursor = [], None
    while True:
        page = store.list_workspaces(cursor=cursor, limit=2)
        assert len(page.workspaces) <= 2
        seen += [(w.id, w.status, w.sessions) for w in page.workspaces]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [(1, "present", 1), (2, "present", 1), (3, "present", 1), (4, "missing", 1), (5, "present", 1)]
    for bad in ("garbage", "-1", "99999999999999999999", 3):
        with pytest.raises(InvalidInputError):
            store.list_workspaces(cursor=bad)
    with pytest.raises(InvalidInputError):
        store.list_workspaces(max_bytes=100)


def test_a_workspace_whose_path_cannot_be_inspected_is_listed_as_unreadable(
    store: MemoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looping, denied, fine = (tmp_path / name for name in ("looping", "denied", "fine"))
    for directory in (looping, denied, fine):
        directory.mkdir()
        store.create_session(directory)
    looping.rmdir()
    looping.symlink_to(looping)  # `rmdir ws; ln -s ws ws`: ELOOP, an InsecurePathError
    real_open = os.open

    def deny(path, *args, **kwargs):  # root passes any permission check, so EACCES is injected
        if str(path) == str(denied):
            raise PermissionError(13, os.strerror(13), path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    listed = [(w.path, w.status) for w in store.list_workspaces().workspaces]
    assert listed == [(str(looping), "unreadable"), (str(denied), "unreadable"), (str(fine), "present")]


def test_rebind_retires_an_empty_workspace_at_the_directory(store: MemoryStore, workspace: Path, db_path: Path) -> None:
    sid = with_history(store, workspace)
    replace_directory(workspace)
    stray = store.create_session(workspace, new_workspace=True)  # worked there first, then thought better of it
    store.delete_session(stray.id)
    assert [(w.id, w.sessions, w.knowledge) for w in store.list_workspaces().workspaces] == [(1, 1, 1), (2, 0, 0)]
    r = store.rebind_workspace(1, workspace, confirm=True)
    assert (r.changed, r.retired) == (True, 2)
    assert [(w.id, w.status) for w in store.list_workspaces().workspaces] == [(1, "present")]
    assert [row[-1] for row in table_rows(db_path)["workspace_rebinds"]] == [2]  # retired_workspace_id, audited
    with store.acquire_lease(sid, workspace) as lease:
        assert len(list(lease.replay_all())) == 2
        lease.release()


def test_rebind_still_refuses_a_workspace_that_anything_belongs_to(
    store: MemoryStore, workspace: Path, db_path: Path
) -> None:
    with_history(store, workspace)
    replace_directory(workspace)
    store.remember(workspace, "lint", "ruff", new_workspace=True)
    store.forget(workspace, "lint")  # forgotten Knowledge still belongs to workspace 2
    before = table_rows(db_path)
    with pytest.raises(WorkspaceConflictError, match="already is workspace 2 .*0 live Knowledge"):
        store.rebind_workspace(1, workspace, confirm=True)
    assert table_rows(db_path) == before
