"""No bare `OSError` leaves the library (issue 10, item 15): an I/O error injected at every call of each `os`
function an operation makes on files is raised as an `EmelexError`, whatever the call.

Tests run as root and cannot make a disk fail, so the `os` function itself is made to raise EIO at its n-th call
(n = 0, 1, 2, ... until the operation makes fewer calls than that); each case starts from a fresh store. A deleted
current directory is real: `mkdir d; cd d; rmdir ../d`.
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    EmelexError,
    FileSystemError,
    LeftoverTempFileWarning,
    MemoryStore,
    NewEvent,
    Settings,
    WorkspaceMissingError,
)
from emelex_workers.cli import app

# The `os` functions Emelex calls on files of its own and of the user. (`os.path.lexists`, `islink` and the like
# turn a failing `lstat` into "no such file"; what they answer then is not checked here, only that nothing escapes.)
FUNCTIONS = (
    "stat", "lstat", "fstat", "open", "fsync", "write", "read", "unlink", "link", "mkdir", "scandir", "ftruncate", "pwrite"
)
MAX_CALLS = 60  # far more calls of one function than any of these operations makes


class Failing:
    """Wraps `os.<name>`: raises EIO at its `at`-th call from arming; `fired` tells whether it did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.real = getattr(os, name)
        self.name = name
        self.at = -1
        self.calls = 0
        self.fired = False
        monkeypatch.setattr(os, name, self)

    def arm(self, at: int) -> None:
        self.at, self.calls, self.fired = at, 0, False

    def disarm(self) -> None:
        self.at = -1

    def __call__(self, *args, **kwargs):
        if self.at >= 0:
            index, self.calls = self.calls, self.calls + 1
            if index == self.at:
                self.fired = True
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        return self.real(*args, **kwargs)


def _turn() -> list[NewEvent]:
    return [NewEvent("user", {"text": "hello"}), NewEvent("assistant", {"text": "hi"})]


class World:
    """A store with one Session (two turns, one with an asset) in `workspace`, built once and copied afresh (with
    its asset folder and sidecar) for every case; the workspace directory itself is shared."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.n = 0
        self.workspace = root / "ws"
        self.workspace.mkdir()
        self.template = root / "template"
        self.template.mkdir(mode=0o700)
        self.settings = Settings(home=root / "home")
        with MemoryStore.open_path(self.template / "db.sqlite3", self.settings) as store:
            self.session = store.create_session(self.workspace).id
            self.ref = store.put_asset(b"picture bytes", "image/png")
            with store.acquire_lease(self.session, self.workspace) as lease:
                lease.replay()
                lease.append_turn(_turn())
                lease.append_turn([NewEvent("user", {"text": "see"}, assets=(self.ref,))])
                lease.release()

    def fresh(self) -> None:
        self.n += 1
        base = self.root / f"case{self.n}"
        shutil.copytree(self.template, base, symlinks=True)
        self.db = base / "db.sqlite3"
        self.store = MemoryStore.open_path(self.db, self.settings)

    def close(self) -> None:
        self.store.close()


def _append(w: World) -> None:
    with w.store.acquire_lease(w.session, w.workspace) as lease:
        for _ in lease.replay_all():
            pass
        lease.append_turn(_turn())
        lease.release()


def _verify(w: World) -> None:
    w.store.verify_assets()


def _open_asset(w: World) -> None:
    with w.store.open_asset(w.ref) as reader:
        reader.read()


OPERATIONS: dict[str, Callable[[World], object]] = {
    "open": lambda w: MemoryStore.open_path(w.db, w.settings).close(),
    "create_session": lambda w: w.store.create_session(w.workspace),
    "put_asset": lambda w: w.store.put_asset(b"other bytes", "image/png"),
    "read_asset": lambda w: w.store.read_asset(w.ref),
    "open_asset": _open_asset,
    "verify_assets": _verify,
    "append_turn": _append,
    "delete_session": lambda w: w.store.delete_session(w.session),
    "collect_assets": lambda w: w.store.collect_assets(grace_s=0),
    "remember": lambda w: w.store.remember(w.workspace, "k", "v"),
}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_an_io_error_at_any_os_call_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str
) -> None:
    world = World(tmp_path)
    failing = Failing(monkeypatch, function)
    escaped = []
    for name, operation in OPERATIONS.items():
        for at in range(MAX_CALLS):
            world.fresh()
            failing.arm(at)
            try:
                with warnings.catch_warnings():  # a put that committed and then failed to remove its temporary
                    warnings.simplefilter("ignore", LeftoverTempFileWarning)  # file succeeds, with this warning
                    operation(world)
            except EmelexError:
                pass
            except OSError as exc:
                escaped.append(f"{name}: os.{function} call {at}: {exc!r}")
            finally:
                fired = failing.fired
                failing.disarm()
                world.close()
            if not fired:
                break
        else:
            pytest.fail(f"{name} made more than {MAX_CALLS} calls of os.{function}")
    assert escaped == [], "\n".join(escaped)


def test_a_deleted_current_directory_is_a_workspace_missing_error(
    tmp_path: Path, store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "d"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for call in (lambda: store.recall("."), lambda: store.create_session("."), lambda: store.remember(".", "k", "v")):
        with pytest.raises(WorkspaceMissingError, match="current directory was deleted") as caught:
            call()
        assert "\n" not in str(caught.value)


def test_knowledge_list_in_a_deleted_current_directory_says_so_in_one_line(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(Settings()) as store:
        store.remember(tmp_path, "k", "v")
    gone = tmp_path / "d"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    result = CliRunner().invoke(app, ["memory", "knowledge", "list"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: the current directory was deleted")



def test_a_relative_database_path_in_a_deleted_current_directory_is_a_typed_error(
    tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "d"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(FileSystemError, match="current directory was deleted.*pass an absolute path"):
        MemoryStore.open_path("db.sqlite3", settings)
    with pytest.raises(FileSystemError, match="current directory was deleted"):
        MemoryStore.reinitialize_path("db.sqlite3", confirm=True)
