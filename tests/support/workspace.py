"""Helpers for the workspace tests: replacing a directory the way `rm -r ws && mkdir ws` does, and history."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, NewEvent


def replace_directory(path: Path) -> bool:
    """`rm -r path && mkdir path`; True when the new directory got the old one's inode number."""
    old = os.stat(path)
    shutil.rmtree(path)
    path.mkdir()
    new = os.stat(path)
    return (new.st_dev, new.st_ino) == (old.st_dev, old.st_ino)


def replace_reusing_inode(path: Path) -> None:
    """Replace `path` by a new directory with the same device and inode numbers, as ext4 usually does."""
    if not replace_directory(path):
        pytest.skip("this file system did not hand the new directory the old inode number")


def turn(text: str = "hello") -> list[NewEvent]:
    return [NewEvent("user", {"text": text}), NewEvent("assistant", {"text": "ok"})]


def with_history(store: MemoryStore, workspace: Path) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn(turn())
        lease.release()
    store.remember(workspace, "build", "make test")
    return session.id


def rebind_hint(workspace_id: int, path: Path) -> str:
    return f"emelex memory workspaces rebind {workspace_id} {path.resolve()} --yes"
