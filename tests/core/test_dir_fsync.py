"""Every directory and file we create is made durable in its parent: the parent is fsynced after the creation.

A recorder wraps `os.mkdir`, `os.open`, `os.link`, `os.rename` and `os.fsync` (the calls every creation here
goes through, by path or by name relative to a directory descriptor) and logs each new directory, file or name
and each directory fsync, in order; SQLite's own files (WAL, shared memory) are its business.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, Settings
from emelex_memory.assets.folder import AssetFolder
from emelex_memory.core.directories import Directory
from emelex_memory.core.private_files import ensure_private_dir
from emelex_memory.snapshots.installed import LOCK_NAME, models_root, snapshot_mutation_lock
from emelex_workers.models import ModelManager

from ..support import call_path
from ..support.plugins import fake_model_file


class Recorder:
    """The creations and directory fsyncs of the code under test, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[tuple[str, str]] = []
        mkdir, open_, fsync, link, rename = os.mkdir, os.open, os.fsync, os.link, os.rename

        def recording_mkdir(path, *args, dir_fd=None, **kwargs):
            mkdir(path, *args, dir_fd=dir_fd, **kwargs)
            self.log.append(("created", call_path(path, dir_fd)))

        def recording_open(path, flags, *args, dir_fd=None, **kwargs):
            new = bool(flags & os.O_CREAT) and not os.path.lexists(call_path(path, dir_fd))
            fd = open_(path, flags, *args, dir_fd=dir_fd, **kwargs)
            if new:
                self.log.append(("created", call_path(path, dir_fd)))
            return fd

        def recording_link(src, dst, *args, dst_dir_fd=None, **kwargs):
            link(src, dst, *args, dst_dir_fd=dst_dir_fd, **kwargs)
            self.log.append(("created", call_path(dst, dst_dir_fd)))

        def recording_rename(src, dst, *args, dst_dir_fd=None, **kwargs):
            rename(src, dst, *args, dst_dir_fd=dst_dir_fd, **kwargs)
            self.log.append(("created", call_path(dst, dst_dir_fd)))

        def recording_fsync(fd):
            fsync(fd)
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                self.log.append(("fsynced", os.readlink(f"/proc/self/fd/{fd}")))

        monkeypatch.setattr(os, "mkdir", recording_mkdir)
        monkeypatch.setattr(os, "open", recording_open)
        monkeypatch.setattr(os, "fsync", recording_fsync)
        monkeypatch.setattr(os, "link", recording_link)
        monkeypatch.setattr(os, "rename", recording_rename)

    def created(self) -> list[str]:
        return [path for what, path in self.log if what == "created"]

    def unsynced(self) -> list[str]:
        """Created paths whose parent directory was not fsynced after their creation."""
        out = []
        for i, (what, path) in enumerate(self.log):
            if what == "created" and ("fsynced", os.path.dirname(path)) not in self.log[i + 1 :]:
                out.append(path)
        return out


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    return Recorder(monkeypatch)


def test_ensure_private_dir_fsyncs_the_parent_of_each_directory_it_creates(tmp_path: Path, recorder: Recorder):
    ensure_private_dir(tmp_path / "a" / "b" / "c")
    assert recorder.created() == [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(tmp_path / "a" / "b" / "c")]
    assert recorder.unsynced() == []


def test_a_new_store_home_lock_sidecar_and_asset_folders_are_durable(home: Path, recorder: Recorder):
    with MemoryStore.open(Settings(home=home)) as store:
        ref = store.put_asset(b"first asset", "image/png")
        folder = store.asset_dir
    created = recorder.created()
    for path in (home, home / "memory", home / "memory" / ".emelex.sqlite3.lock", home / ".memory-store",
                 home / "memory" / "emelex.sqlite3", folder, folder / "tmp", folder / ref.digest):
        assert str(path) in created
    # Only the asset's temporary file is not made durable: what counts is its link under the digest name.
    assert recorder.unsynced() == [p for p in created if p.startswith(str(folder / "tmp") + "/")] != []


def test_asset_folders_created_through_a_directory_descriptor_are_durable(tmp_path: Path, recorder: Recorder):
    parent = tmp_path / "db"
    parent.mkdir(mode=0o700)
    recorder.log.clear()
    with Directory.open(parent) as directory:
        AssetFolder.open(directory, parent / "x.assets", create=True, tmp=True).close()
    assert recorder.created() == [str(parent / "x.assets"), str(parent / "x.assets" / "tmp")]
    assert recorder.unsynced() == []


def test_models_root_creates_home_and_its_models_folder_durably(home: Path, recorder: Recorder):
    assert models_root(home, create=True) == home / "models"
    assert recorder.created() == [str(home), str(home / "models")] and recorder.unsynced() == []


def test_the_snapshot_mutation_lock_file_is_durable(home: Path, recorder: Recorder):
    with snapshot_mutation_lock(home, timeout_s=1):
        pass
    assert str(home / LOCK_NAME) in recorder.created() and recorder.unsynced() == []


def test_installing_a_model_makes_the_models_folder_and_the_model_durable(
    tmp_path: Path, home: Path, recorder: Recorder
):
    source = fake_model_file(tmp_path / "files", "tiny.gguf")
    recorder.log.clear()  # the source file is the test's own
    with ModelManager(Settings(home=home)) as manager:
        model = manager.install(source, name="tiny")
    created = recorder.created()
    assert str(home / "models") in created and str(home / "models" / "tiny") in created  # renamed into place
    assert model.directory == home / "models" / "tiny"
    assert recorder.unsynced() == []
