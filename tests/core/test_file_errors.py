"""Every file-level failure is a typed error naming the path and a remedy, and changes nothing (issue 10, item 15).

Real conditions where the machine allows them: a symlink loop (ELOOP), a name longer than the file system allows
(ENAMETOOLONG). Tests run as root, which bypasses permissions, and cannot mount a read-only or full file system,
so EROFS, EACCES, ENOSPC and EIO are injected by making the one os function that meets them raise that errno;
SQLite's own failures at open come from the fault-injecting VFS.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import (
    DiskFullError,
    FileAccessDeniedError,
    InsecurePathError,
    MemoryStore,
    NewEvent,
    PathTooLongError,
    ReadOnlyLocationError,
    SessionNotFoundError,
    Settings,
    StoreIOError,
)
from emelex_workers.cli import app
from emelex_workers.models import ModelManager

from ..support import call_path, file_state, table_rows
from ..support.plugins import fake_model_file
from ..workers.cli.test_models_cli_errors import tree
from ..support.vfs_faults import Fault, FaultyVFS

Inject = Callable[..., None]


@pytest.fixture
def os_fault(monkeypatch: pytest.MonkeyPatch) -> Inject:
    """`os_fault("mkdir", errno.EROFS, under=path)`: make `os.<name>` raise that errno for paths under `under`,
    given directly or relative to a `dir_fd` (for every call when `under` is None, e.g. for functions taking a file
    descriptor)."""

    def inject(name: str, code: int, *, under: Path | None = None) -> None:
        real = getattr(os, name)

        def failing(*args, **kwargs):
            target = call_path(args[0], kwargs.get("dir_fd")) if args and not isinstance(args[0], int) else None
            if under is None or (target is not None and target.startswith(str(under))):
                raise OSError(code, os.strerror(code), None if under is None else args[0])  # as os reports it
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, failing)

    return inject


def _one_line(exc: BaseException, *needles: str) -> str:
    message = str(exc)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


# -- real conditions --------------------------------------------------------------------------------------


def test_a_home_behind_a_symlink_loop_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    before = file_state(tmp_path)
    with pytest.raises(InsecurePathError) as caught:
        MemoryStore.open(Settings(home=loop / "home"))
    _one_line(caught.value, str(loop / "home"), "symlink")
    assert file_state(tmp_path) == before


def test_a_home_under_a_two_link_loop_names_the_looping_component_not_config_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    home = tmp_path / "l1" / "home"
    before = file_state(tmp_path)
    with pytest.raises(InsecurePathError) as caught:
        Settings(home=home)
    _one_line(caught.value, f"Emelex Home {home} lies under {tmp_path / 'l1'}, a symlink that loops",
              "remove the loop")
    assert "config.toml" not in str(caught.value)
    monkeypatch.setenv("EMELEX_HOME", str(home))
    result = CliRunner().invoke(app, ["memory", "sessions", "list"])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "a symlink that loops" in result.output and "config.toml" not in result.output
    assert file_state(tmp_path) == before


@pytest.mark.parametrize("what", ["database", "store marker"])
def test_a_database_or_marker_that_is_no_regular_file_says_what_to_do(tmp_path: Path, what: str) -> None:
    settings = Settings(home=tmp_path / "home")
    MemoryStore.open(settings).close()
    path = settings.database_path if what == "database" else settings.home_dir / ".memory-store"
    os.rename(path, tmp_path / "aside")
    os.mkfifo(path, 0o600)
    before = file_state(path.parent)
    with pytest.raises(InsecurePathError) as caught:
        MemoryStore.open(settings)
    _one_line(caught.value, f"{what} {path} is not a regular file", "move it away")
    assert file_state(path.parent) == before


def test_a_workspace_behind_a_symlink_loop_or_with_a_too_long_name_is_a_typed_error(
    store: MemoryStore, tmp_path: Path, db_path: Path
) -> None:
    loop = tmp_path / "wsloop"
    loop.symlink_to(loop)
    before = table_rows(db_path)
    with pytest.raises(InsecurePathError):
        store.create_session(loop)
    with pytest.raises(PathTooLongError) as caught:
        store.create_session(tmp_path / ("w" * 300))
    _one_line(caught.value, "longer than the file system allows")
    assert table_rows(db_path) == before


def test_names_longer_than_the_file_system_allows_are_a_typed_error_and_create_nothing(
    tmp_path: Path, db_path: Path
) -> None:
    before = file_state(tmp_path)
    with pytest.raises(PathTooLongError) as caught:
        MemoryStore.open(Settings(home=tmp_path / ("h" * 300)))
    _one_line(caught.value, "h" * 300, "use a shorter EMELEX_HOME")
    with pytest.raises(PathTooLongError):
        MemoryStore.open_path(db_path.parent / ("d" * 300), Settings(home=tmp_path / "unused"))
    assert file_state(tmp_path) == before
    assert os.listdir(db_path.parent) == []


def test_a_home_that_is_a_file_is_a_typed_error_and_changes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory")
    before = file_state(tmp_path)
    for create in (True, False):
        with pytest.raises(InsecurePathError) as caught:
            MemoryStore.open(Settings(home=home), create=create)
        _one_line(caught.value, str(home), "not a directory")
    assert file_state(tmp_path) == before


# -- injected errnos --------------------------------------------------------------------------------------------


def test_a_home_on_a_read_only_file_system_says_to_set_emelex_home(
    tmp_path: Path, settings: Settings, os_fault: Inject
) -> None:
    os_fault("mkdir", errno.EROFS, under=tmp_path)
    before = file_state(tmp_path)
    with pytest.raises(ReadOnlyLocationError) as caught:
        MemoryStore.open(settings)
    _one_line(caught.value, str(settings.home_dir), "is on a read-only file system",
              "set EMELEX_HOME to a writable directory")
    assert file_state(tmp_path) == before


def test_models_install_on_a_read_only_home_prints_one_line_and_creates_nothing(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, os_fault: Inject
) -> None:
    fake = fake_model_file(tmp_path / "files")
    monkeypatch.setenv("EMELEX_HOME", str(home))
    os_fault("mkdir", errno.EROFS, under=home)
    result = CliRunner().invoke(app, ["models", "install", str(fake)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {home} is on a read-only file system")
    assert "set EMELEX_HOME to a writable directory" in result.output
    assert not os.path.lexists(home)


def test_a_denied_lock_sidecar_is_a_typed_error_and_creates_nothing(
    db_path: Path, settings: Settings, os_fault: Inject
) -> None:
    os_fault("open", errno.EACCES, under=db_path.parent / f".{db_path.name}.lock")
    with pytest.raises(FileAccessDeniedError) as caught:
        MemoryStore.open_path(db_path, settings)
    _one_line(caught.value, f".{db_path.name}.lock", "permission denied", "EMELEX_HOME")
    assert os.listdir(db_path.parent) == []


def test_a_full_disk_while_writing_an_asset_stores_nothing(
    store: MemoryStore, db_path: Path, os_fault: Inject
) -> None:
    store.put_asset(b"first", "image/png")
    before, files = table_rows(db_path), file_state(store.asset_dir)
    os_fault("fsync", errno.ENOSPC)
    with pytest.raises(DiskFullError) as caught:
        store.put_asset(b"second", "image/png")
    _one_line(caught.value, str(store.asset_dir / "tmp"), "no space left", "free space")
    assert table_rows(db_path) == before
    assert file_state(store.asset_dir) == files and os.listdir(store.asset_dir / "tmp") == []


def test_an_io_error_reading_an_asset_names_its_file_and_the_doctor(
    store: MemoryStore, os_fault: Inject
) -> None:
    ref = store.put_asset(b"bytes", "image/png")
    os_fault("open", errno.EIO, under=store.asset_dir / ref.digest)
    with pytest.raises(StoreIOError) as caught:
        store.read_asset(ref)
    _one_line(caught.value, str(store.asset_dir / ref.digest), "dmesg", "emelex memory doctor")


def test_a_full_disk_while_publishing_an_asset_names_its_file_and_stores_nothing(
    store: MemoryStore, db_path: Path, os_fault: Inject
) -> None:
    store.put_asset(b"first", "image/png")
    before, files = table_rows(db_path), file_state(store.asset_dir)
    os_fault("link", errno.ENOSPC)  # linked by name, relative to the folders' descriptors
    with pytest.raises(DiskFullError) as caught:
        store.put_asset(b"second", "image/png")
    _one_line(caught.value, str(store.asset_dir) + "/", "no space left", "free space")
    assert table_rows(db_path) == before
    assert file_state(store.asset_dir) == files and os.listdir(store.asset_dir / "tmp") == []


def test_a_denied_unlink_while_collecting_names_the_asset_file_and_leaves_no_entry_without_it(
    db_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch, os_fault: Inject
) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        ref = store.put_asset(b"unreferenced", "image/png")
        os_fault("unlink", errno.EACCES, under=store.asset_dir / ref.digest)
        with pytest.raises(FileAccessDeniedError) as caught:
            store.collect_assets(grace_s=0)
        _one_line(caught.value, f"permission denied on {store.asset_dir / ref.digest}",
                  "1 unreferenced catalog entries were deleted all the same", "the next collection removes")
        assert os.path.exists(store.asset_dir / ref.digest)  # an orphan now: its entry's deletion committed first
        monkeypatch.undo()
        assert store.collect_assets(grace_s=0).removed_orphans == 1
        assert table_rows(db_path)["assets"] == [] and os.listdir(store.asset_dir) == ["tmp"]


def test_a_failed_file_removal_after_delete_session_committed_says_the_session_is_gone(
    db_path: Path, settings: Settings, workspace: Path, monkeypatch: pytest.MonkeyPatch, os_fault: Inject
) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        session = store.create_session(workspace)
        ref = store.put_asset(b"only this Session's", "image/png")
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", "see", assets=(ref,))])
            lease.release()
    with MemoryStore.open_path(db_path, settings, clock=lambda: time.time() + 7200) as store:  # past the grace
        os_fault("unlink", errno.EACCES, under=store.asset_dir / ref.digest)
        with pytest.raises(FileAccessDeniedError) as caught:
            store.delete_session(session.id)
        _one_line(caught.value, "permission denied", f"Session {session.id} was deleted all the same",
                  "`emelex memory maintain`")
        with pytest.raises(SessionNotFoundError):
            store.get_session(session.id)
        monkeypatch.undo()
        assert store.collect_assets(grace_s=0).removed_orphans == 1


def test_a_full_disk_while_installing_a_model_leaves_nothing_behind(
    tmp_path: Path, settings: Settings, os_fault: Inject
) -> None:
    fake = fake_model_file(tmp_path / "files")
    with ModelManager(settings) as manager:
        manager.install(fake, name="first")
        before = tree(settings.home_dir)
        os_fault("fsync", errno.ENOSPC)
        with pytest.raises(DiskFullError) as caught:
            manager.install(fake, name="second")
    _one_line(caught.value, str(settings.home_dir / "models"), "no space left")
    assert sorted(tree(settings.home_dir)) == sorted(before)  # its temporary directory is gone again


def test_an_io_error_reading_a_model_and_a_denied_models_folder_are_one_line_errors(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, os_fault: Inject
) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with ModelManager(Settings()) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="good")
    os_fault("pread", errno.EIO)
    with ModelManager(Settings()) as manager, pytest.raises(StoreIOError) as caught:
        manager.verify("good")
    _one_line(caught.value, str(home / "models" / "good"), "I/O error", "dmesg")
    os_fault("scandir", errno.EACCES, under=home / "models")
    result = CliRunner().invoke(app, ["models", "list"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: permission denied on {home / 'models'}")


# -- SQLite's own failures at open ------------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "expected"), [
    (Fault("xWrite", "db", 0, apsw.FullError, times=0), DiskFullError),
    (Fault("xWrite", "wal", 0, apsw.FullError, times=0), DiskFullError),
    (Fault("xWrite", "wal", 0, apsw.IOError, times=0), StoreIOError),
    (Fault("xRead", "db", 0, apsw.IOError, times=0), StoreIOError),
    (Fault("xWrite", "db", 0, apsw.ReadOnlyError, times=0), ReadOnlyLocationError),
], ids=["db-full", "wal-full", "wal-write-eio", "db-read-eio", "db-read-only"])
def test_sqlite_failing_at_first_open_is_a_typed_error_and_the_next_open_works(
    faulty_vfs: FaultyVFS, db_path: Path, settings: Settings, fault: Fault, expected: type
) -> None:
    faulty_vfs.arm(fault)
    with pytest.raises(expected) as caught:
        MemoryStore.open_path(db_path, settings)
    faulty_vfs.disarm()
    assert faulty_vfs.fired
    _one_line(caught.value, str(db_path))
    with MemoryStore.open_path(db_path, settings) as store:  # once the disk is fine again, so is the store
        assert store.list_sessions().sessions == []
