"""A first open killed while the new database switches to WAL (issue 18, item 5): a real child process is SIGKILLed
by an `apsw.VFS` the moment SQLite is about to delete a rollback journal, the point where that journal is hot. The
next ordinary open and doctor then succeed, and a store that existed is still never recreated."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import apsw
import pytest

from emelex_memory import DatabaseDeletedError, DiskFullError, MemoryStore, Settings
from emelex_memory.maintenance.doctor import diagnose

from ..support.vfs_faults import Fault, FaultyVFS

# Runs `sys.argv[2]` with SQLite's default VFS replaced by one that SIGKILLs the process when SQLite deletes a
# rollback journal: the journal is complete and the database partly rewritten, as a kill or power loss leaves them.
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import apsw

    class KillAtJournalDelete(apsw.VFS):
        def __init__(self):
            self.base = apsw.vfs_names()[0]
            super().__init__("kill", self.base, makedefault=True)

        def xDelete(self, name, syncdir):
            if name.endswith("-journal"):
                print("killed at", name, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return super().xDelete(name, syncdir)

    vfs = KillAtJournalDelete()
    from emelex_memory import MemoryStore, Settings
    from emelex_memory.core.connection import connect
    from emelex_memory.core.private_files import create_private_file, ensure_private_dir
    settings = Settings(home=sys.argv[1])
    if sys.argv[2] == "first-open":
        MemoryStore.open(settings)
    else:  # what an older Emelex's first open did: the empty file under its name, then the switch to WAL
        ensure_private_dir(settings.memory_dir)
        create_private_file(settings.database_path)
        connect(settings.database_path, busy_timeout_ms=1000)
    print("not killed", flush=True)
""")


def _killed(home: Path, what: str) -> str:
    child = subprocess.run([sys.executable, "-c", CHILD, str(home), what], capture_output=True, text=True, timeout=60)
    assert child.returncode == -9, (child.returncode, child.stdout, child.stderr)
    return child.stdout


def _opens_and_is_healthy(settings: Settings) -> None:
    with MemoryStore.open(settings) as store:
        assert store.list_sessions().items == []
    report = diagnose(settings)
    assert report.healthy, [c for c in report.checks if not c.ok]


def test_a_first_open_killed_while_switching_to_wal_leaves_no_database_and_the_next_open_succeeds(home: Path):
    settings = Settings(home=home)
    killed = _killed(home, "first-open")
    assert "killed at" in killed
    assert not os.path.lexists(settings.database_path)  # the new database was still under its temporary name
    _opens_and_is_healthy(settings)
    settings.database_path.unlink()  # and once created, a store is never silently recreated
    with pytest.raises(DatabaseDeletedError):
        MemoryStore.open(settings)


def test_an_ordinary_open_rolls_back_the_hot_journal_of_its_own_store(home: Path):
    settings = Settings(home=home)
    _killed(home, "legacy-first-open")
    journal = Path(f"{settings.database_path}-journal")
    assert journal.exists() and journal.stat().st_size > 0  # a hot journal beside the database
    report = diagnose(settings)  # doctor alone rolls it back too, and then finds an empty, unmarked database
    assert not journal.exists()
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert set(failed) == {"store marker", "lock sidecar", "schema"}, failed
    _opens_and_is_healthy(settings)


def test_an_ordinary_open_rolls_back_a_hot_journal_when_it_is_first(home: Path):
    settings = Settings(home=home)
    _killed(home, "legacy-first-open")
    _opens_and_is_healthy(settings)
    assert not Path(f"{settings.database_path}-journal").exists()


def test_a_first_open_that_fails_leaves_no_database_and_no_temporary_one(home: Path, faulty_vfs: FaultyVFS):
    settings = Settings(home=home)
    faulty_vfs.arm(Fault("xWrite", "db", 3, error=apsw.FullError, times=0))  # the disk fills up mid-migration
    with pytest.raises(DiskFullError):
        MemoryStore.open(settings)
    assert faulty_vfs.fired
    faulty_vfs.disarm()
    assert not home.exists()  # no database, no temporary one, no lock file, no Home: nothing says a store existed
    _opens_and_is_healthy(settings)
