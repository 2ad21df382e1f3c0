"""A first open on a nearly full disk, for real: Emelex Home on a small tmpfs (mounted here; skipped with the reason
where this process may not mount one), filled to leave every amount of free space from a few KiB to more than a
store needs. Each first open either creates a complete store or raises `DiskFullError` and leaves nothing on the
file system (no database, no -wal or -shm, no temporary database, no lock file, no Home); once the space is freed,
the next open creates the store normally and it takes writes. A first open that fails after its database was
renamed into place (the disk full as it records the store) undoes that too."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_memory import DiskFullError, MemoryStore, Settings
from emelex_memory.core import opening

TMPFS_BYTES = 4 * 1024 * 1024
FREE_KIB = [*range(8, 1400, 24)]  # free space left for the first open: none of it fits, then all of it does


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory) -> Path:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs Linux and root")
    mountpoint = tmp_path_factory.mktemp("small-disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs",
                              str(mountpoint)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield mountpoint
    subprocess.run(["umount", str(mountpoint)], check=True)


def _fill(disk: Path, free_bytes: int) -> Path:
    """Fill `disk` with one file so that `free_bytes` stay free; the file."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(bytes(max(0, st.f_bavail * st.f_frsize - free_bytes)))
    return filler


def _writes(home: Path, workspace: Path) -> None:
    with MemoryStore.open(Settings(home=home)) as store:
        session = store.create_session(workspace)
        assert store.get_session(session.id).id == session.id


def test_a_first_open_on_a_nearly_full_disk_creates_a_whole_store_or_nothing(small_disk: Path, workspace: Path):
    outcomes = set()
    for free_kib in FREE_KIB:
        for entry in small_disk.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        home = small_disk / "home"
        filler = _fill(small_disk, free_kib * 1024)
        try:
            MemoryStore.open(Settings(home=home)).close()
            outcomes.add("created")
        except DiskFullError as exc:
            outcomes.add("refused")
            assert "is full" in str(exc) and "free space there" in str(exc)
            assert sorted(p.name for p in small_disk.iterdir()) == ["filler"], f"left behind at {free_kib} KiB free"
        filler.unlink()
        _writes(home, workspace)  # with space: a store that takes writes, made now or by the first open
    assert outcomes == {"created", "refused"}  # the sizes reach both sides of what a store needs


def test_a_first_open_whose_last_step_finds_the_disk_full_undoes_its_store(home: Path, workspace: Path,
                                                                          monkeypatch) -> None:
    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(opening, "_mark", full)  # the database is in place, complete, when the disk fills
    with pytest.raises(DiskFullError):
        MemoryStore.open(Settings(home=home))
    assert not home.exists()  # no database, marker, asset folder or lock file says a store existed
    monkeypatch.undo()
    _writes(home, workspace)
