"""A damaged database (SQLite's `SQLITE_CORRUPT`, `SQLITE_NOTADB`) is a typed `DatabaseCorruptError` naming the
remedy (doctor, restore from a backup), on open and on read, never a bare apsw exception; a refused open changes
nothing (issue 18, item 2)."""

from __future__ import annotations

import os
from pathlib import Path

import apsw
import pytest

from emelex_memory import DatabaseCorruptError, MemoryStore, NewEvent, Settings

from ..support.vfs_faults import Fault, FaultyVFS

PAGE = 4096


def _filled(settings: Settings, workspace: Path) -> str:
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            for i in range(200):
                lease.append_turn([NewEvent("user", {"text": f"turn {i} " + "x" * 2000})])
            lease.release()
    return session.id


def _overwrite(path: Path, offset: int, length: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xa5" * length)


def _replay_everything(store: MemoryStore, session_id: str) -> None:
    after = 0
    while not (page := store.replay(session_id, after, limit=50)).done:
        after = page.next_cursor


def _check_message(error: DatabaseCorruptError, database: Path) -> None:
    message = str(error)
    assert str(database) in message and "\n" not in message
    assert "emelex memory doctor" in message and "emelex memory restore" in message


def test_a_torn_database_header_is_a_typed_error_on_open_and_changes_nothing(settings: Settings, workspace: Path):
    _filled(settings, workspace)
    database = settings.database_path
    _overwrite(database, 0, 100)  # the header: SQLite no longer recognises the file (SQLITE_NOTADB)
    before = {p.name: p.read_bytes() for p in database.parent.iterdir() if p.is_file()}
    with pytest.raises(DatabaseCorruptError) as caught:
        MemoryStore.open(settings)
    _check_message(caught.value, database)
    assert {p.name: p.read_bytes() for p in database.parent.iterdir() if p.is_file()} == before


def test_a_damaged_page_is_a_typed_error_on_read(settings: Settings, workspace: Path):
    session_id = _filled(settings, workspace)
    database = settings.database_path
    _overwrite(database, os.path.getsize(database) - 40 * PAGE, 30 * PAGE)  # pages of the events table
    with MemoryStore.open(settings) as store, pytest.raises(DatabaseCorruptError) as caught:
        _replay_everything(store, session_id)
    _check_message(caught.value, database)
    assert isinstance(caught.value.__cause__, apsw.CorruptError)


def test_a_corrupt_read_reported_by_the_file_layer_is_a_typed_error(
    faulty_vfs: FaultyVFS, settings: Settings, workspace: Path
):
    session_id = _filled(settings, workspace)
    with MemoryStore.open(settings) as store:
        faulty_vfs.arm(Fault("xRead", "db", 0, error=apsw.CorruptError, times=0))
        with pytest.raises(DatabaseCorruptError) as caught:
            _replay_everything(store, session_id)
        faulty_vfs.disarm()
        _check_message(caught.value, settings.database_path)
    faulty_vfs.arm(Fault("xRead", "db", 0, error=apsw.CorruptError, times=0))
    with pytest.raises(DatabaseCorruptError):  # and on open
        MemoryStore.open(settings)
    faulty_vfs.disarm()
    with MemoryStore.open(settings) as store:
        _replay_everything(store, session_id)  # the file itself was never damaged
