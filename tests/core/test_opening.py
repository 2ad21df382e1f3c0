"""Opening the database: modes, ownership, symlinks, never recreating, migrations and foreign files."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    ConfirmationRequiredError,
    DatabaseDeletedError,
    DatabaseEmptiedError,
    InsecurePathError,
    MemoryStore,
    NewEvent,
    NotAnEmelexDatabaseError,
    SchemaTooNewError,
    Settings,
    StoreError,
    StoreExistsError,
)
from emelex_memory.core.connection import connect, read_dbconfig, read_pragmas
from emelex_memory.core.migrations import APPLICATION_ID, MIGRATIONS, Migration, applied, migrate, pending
from emelex_memory.core.opening import sidecar_path

from ..support import file_state, table_rows


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# The durable settings the spec names, as SQLite reports them on a live connection, written out here rather than
# taken from the code's own table (a weakened table would match itself): foreign keys on, WAL, synchronous=EXTRA (3),
# full fsync on for writes and checkpoints, temporary storage in memory (2), the schema untrusted.
SPEC_PRAGMAS = {"foreign_keys": 1, "journal_mode": "wal", "synchronous": 3, "fullfsync": 1,
                "checkpoint_fullfsync": 1, "temp_store": 2, "trusted_schema": 0}


def _live_pragmas(conn: apsw.Connection) -> dict[str, object]:
    return {name: conn.execute(f"PRAGMA {name}").fetchall()[0][0] for name in SPEC_PRAGMAS}


def test_standard_open_creates_private_home_and_database(settings: Settings) -> None:
    with MemoryStore.open(settings) as store:
        assert store.path == settings.home_dir / "memory" / "emelex.sqlite3"
        with store.db.read() as conn:
            live = _live_pragmas(conn)
            reported = read_pragmas(conn)
            config = read_dbconfig(conn)
            qpsg = conn.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, -1)
    assert live == SPEC_PRAGMAS
    assert reported == SPEC_PRAGMAS  # what `doctor` reports is the live value of each
    assert config == {"dqs_dml": 0, "dqs_ddl": 0, "trusted_schema": 0, "qpsg": 1} and qpsg == 1
    assert _mode(settings.home_dir) == 0o700
    assert _mode(settings.memory_dir) == 0o700
    assert _mode(settings.database_path) == 0o600
    assert _mode(sidecar_path(settings.database_path)) == 0o600


def test_schema_version_and_application_id_are_set(store: MemoryStore) -> None:
    with store.db.read() as conn:
        assert conn.execute("PRAGMA user_version").fetchall()[0][0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA application_id").fetchall()[0][0] == APPLICATION_ID
        assert applied(conn) == [m.name for m in MIGRATIONS]
        assert pending(conn) == []


def test_reopen_keeps_data(db_path: Path, settings: Settings, workspace: Path) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        session = store.create_session(workspace, title="kept")
    with MemoryStore.open_path(db_path, settings) as store:
        assert store.get_session(session.id).title == "kept"


def test_deleted_database_is_never_recreated(db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    os.remove(db_path)
    before = file_state(db_path.parent)
    with pytest.raises(DatabaseDeletedError, match="deleted and nothing was recreated"):
        MemoryStore.open_path(db_path, settings)
    assert not db_path.exists()
    assert file_state(db_path.parent) == before


def test_deleted_standard_database_is_never_recreated(settings: Settings) -> None:
    MemoryStore.open(settings).close()
    os.remove(settings.database_path)
    with pytest.raises(DatabaseDeletedError):
        MemoryStore.open(settings)
    assert not settings.database_path.exists()


def test_emptied_database_is_refused(db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    with open(db_path, "r+b") as f:
        f.truncate(0)
    with pytest.raises(DatabaseEmptiedError):
        MemoryStore.open_path(db_path, settings)
    assert db_path.stat().st_size == 0


def test_reinitialize_needs_confirmation_and_a_missing_database(db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    with pytest.raises(StoreExistsError):
        MemoryStore.reinitialize_path(db_path, confirm=True)
    os.remove(db_path)
    with pytest.raises(ConfirmationRequiredError):
        MemoryStore.reinitialize_path(db_path)
    with pytest.raises(DatabaseDeletedError):
        MemoryStore.open_path(db_path, settings)
    MemoryStore.reinitialize_path(db_path, confirm=True)
    with MemoryStore.open_path(db_path, settings) as store:
        assert store.list_sessions().sessions == []


def test_reinitialize_moves_leftover_wal_aside(db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    os.remove(db_path)
    wal = Path(f"{db_path}-wal")
    wal.write_bytes(b"old wal")
    os.chmod(wal, 0o600)
    moved = MemoryStore.reinitialize_path(db_path, confirm=True)
    assert not wal.exists()
    assert [p.read_bytes() for p in moved if p.name.startswith(wal.name)] == [b"old wal"]


def test_fresh_location_with_leftover_wal_is_refused(db_path: Path, settings: Settings) -> None:
    wal = Path(f"{db_path}-wal")
    wal.write_bytes(b"stray")
    os.chmod(wal, 0o600)
    with pytest.raises(InsecurePathError, match="left over"):
        MemoryStore.open_path(db_path, settings)
    assert not db_path.exists()


def test_symlinked_database_file_is_refused(tmp_path: Path, db_path: Path, settings: Settings) -> None:
    real = tmp_path / "db" / "real.sqlite3"
    MemoryStore.open_path(real, settings).close()
    os.symlink(real, db_path)
    before = table_rows(real), file_state(real.parent)
    with pytest.raises(InsecurePathError, match="symlink"):
        MemoryStore.open_path(db_path, settings)
    assert (table_rows(real), file_state(real.parent)) == before


def test_symlinked_database_directory_is_refused(tmp_path: Path, db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    link = tmp_path / "linkdir"
    os.symlink(db_path.parent, link)
    before = file_state(db_path.parent)
    with pytest.raises(InsecurePathError, match="symlink"):
        MemoryStore.open_path(link / db_path.name, settings)
    assert file_state(db_path.parent) == before


def test_symlinked_home_memory_dir_is_refused(tmp_path: Path, settings: Settings) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    settings.home_dir.mkdir(mode=0o700)
    os.symlink(elsewhere, settings.memory_dir)
    with pytest.raises(InsecurePathError, match="symlink"):
        MemoryStore.open(settings)
    assert os.listdir(elsewhere) == []


def test_group_writable_directory_is_refused(db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    os.chmod(db_path.parent, 0o770)
    before = file_state(db_path.parent)
    with pytest.raises(InsecurePathError, match="group- or world-writable"):
        MemoryStore.open_path(db_path, settings)
    assert file_state(db_path.parent) == before


def test_group_writable_home_is_refused(settings: Settings) -> None:
    settings.home_dir.mkdir(mode=0o700)
    os.chmod(settings.home_dir, 0o775)
    with pytest.raises(InsecurePathError, match="chmod go-w"):
        MemoryStore.open(settings)
    assert os.listdir(settings.home_dir) == []


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o666, 0o400])
def test_database_with_wrong_mode_is_refused_untouched(db_path: Path, settings: Settings, mode: int) -> None:
    MemoryStore.open_path(db_path, settings).close()
    os.chmod(db_path, mode)
    before = file_state(db_path.parent)
    with pytest.raises(InsecurePathError, match="chmod 600"):
        MemoryStore.open_path(db_path, settings)
    assert file_state(db_path.parent) == before


def test_wrong_mode_leaves_file_bytes_alone(db_path: Path, settings: Settings, workspace: Path) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        store.create_session(workspace)
    os.chmod(db_path, 0o644)
    data = db_path.read_bytes()
    with pytest.raises(InsecurePathError):
        MemoryStore.open_path(db_path, settings)
    assert db_path.read_bytes() == data
    assert _mode(db_path) == 0o644


def test_database_owned_by_someone_else_is_refused(db_path: Path, settings: Settings) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    MemoryStore.open_path(db_path, settings).close()
    os.chown(db_path, 12345, -1)
    with pytest.raises(InsecurePathError, match="owned by uid 12345"):
        MemoryStore.open_path(db_path, settings)


def test_foreign_sqlite_file_is_refused_untouched(db_path: Path, settings: Settings) -> None:
    conn = apsw.Connection(str(db_path))
    conn.execute("CREATE TABLE theirs (x)")
    conn.close()
    os.chmod(db_path, 0o600)
    data = db_path.read_bytes()
    with pytest.raises(NotAnEmelexDatabaseError):
        MemoryStore.open_path(db_path, settings)
    assert db_path.read_bytes() == data


def test_newer_schema_is_refused_untouched(db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    conn = apsw.Connection(str(db_path))
    future = MIGRATIONS + (Migration("m999_future", "CREATE TABLE future (x INTEGER) STRICT"),)
    migrate(conn, future)
    conn.close()
    before = table_rows(db_path)
    with pytest.raises(SchemaTooNewError, match="upgrade Emelex"):
        MemoryStore.open_path(db_path, settings)
    assert table_rows(db_path) == before


def test_migrations_apply_in_order_from_every_old_version(tmp_path: Path) -> None:
    for upto in range(len(MIGRATIONS) + 1):
        db = tmp_path / f"v{upto}.sqlite3"
        conn = apsw.Connection(str(db))
        migrate(conn, MIGRATIONS[:upto])
        assert applied(conn) == [m.name for m in MIGRATIONS[:upto]]
        assert [m.name for m in pending(conn)] == [m.name for m in MIGRATIONS[upto:]]
        migrate(conn)
        assert applied(conn) == [m.name for m in MIGRATIONS]
        assert conn.execute("PRAGMA user_version").fetchall()[0][0] == len(MIGRATIONS)
        conn.close()


def test_m007_moves_the_session_head_onto_the_events_and_keeps_it(tmp_path: Path) -> None:
    db = tmp_path / "v6.sqlite3"
    conn = apsw.Connection(str(db))
    migrate(conn, MIGRATIONS[:6])
    with conn:
        for sid in (1, 2, 3):
            conn.execute("INSERT INTO sessions (id, uuid, workspace_path, workspace_dev, workspace_ino, created_at, "
                         "updated_at, last_seq, last_turn, event_bytes) VALUES (?, ?, '/w', 1, 2, 10, ?, ?, ?, ?)",
                         (sid, f"s{sid}", 20 + sid, 3 * (sid - 1), sid - 1, 0))
        events = [(1, 1, 1, 0, 5, 30.0), (1, 2, 1, 1, 7, 31.0), (2, 3, 2, 0, 1, 15.0)]  # session 3 has none
        events += [(2, 1, 1, 0, 4, 13.0), (2, 2, 1, 1, 9, 14.0)]
        for session, seq, turn, pos, size, at in events:
            conn.execute("INSERT INTO events (session_id, seq, turn, position, kind, payload, size, created_at) "
                         "VALUES (?, ?, ?, ?, 'user', 'null', ?, ?)", (session, seq, turn, pos, size, at))
    migrate(conn)
    ends = conn.execute("SELECT session_id, seq, byte_end FROM events ORDER BY session_id, seq").fetchall()
    assert ends == [(1, 1, 5), (1, 2, 12), (2, 1, 4), (2, 2, 13), (2, 3, 14)]
    heads = conn.execute("SELECT uuid, last_seq, last_turn, event_bytes, updated_at FROM session_heads ORDER BY id")
    assert heads.fetchall() == [("s1", 2, 1, 12, 31.0), ("s2", 3, 2, 14, 22.0), ("s3", 0, 0, 0, 23.0)]
    conn.close()


def test_a_version_6_store_opens_migrated_and_its_sessions_go_on(tmp_path: Path, workspace: Path) -> None:
    db = tmp_path / "db" / "v6.sqlite3"
    db.parent.mkdir(mode=0o700)
    conn = apsw.Connection(str(db))
    migrate(conn, MIGRATIONS[:6])
    st = os.stat(workspace)
    with conn:
        conn.execute("INSERT INTO sessions (id, uuid, workspace_path, workspace_dev, workspace_ino, created_at, "
                     "updated_at, last_seq, last_turn, event_bytes) VALUES (1, 's1', ?, ?, ?, 10, 11, 2, 1, 12)",
                     (str(workspace.resolve()), st.st_dev, st.st_ino))
        for seq, size in ((1, 4), (2, 8)):
            conn.execute("INSERT INTO events (session_id, seq, turn, position, kind, payload, size, created_at) "
                         "VALUES (1, ?, 1, ?, 'user', ?, ?, 11)", (seq, seq - 1, '"' + "x" * (size - 2) + '"', size))
    conn.close()
    os.chmod(db, 0o600)
    with MemoryStore.open_path(db, Settings(home=tmp_path / "h")) as store:
        with store.acquire_lease("s1", workspace) as lease:
            assert [e.byte_end for e in lease.replay_all()] == [4, 12]
            appended = lease.append_turn([NewEvent("user", "next")])
        session = store.get_session("s1")
    assert (appended.turn, appended.first_seq) == (2, 3)
    assert (session.last_seq, session.last_turn, session.event_bytes) == (3, 2, 18)


def test_failed_migration_rolls_back_completely(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "m.sqlite3"))
    broken = MIGRATIONS + (Migration("m998_broken", "CREATE TABLE ok_part (x INTEGER) STRICT; SELECT no_such_function()"),)
    with pytest.raises(apsw.SQLError):
        migrate(conn, broken)
    assert applied(conn) == [m.name for m in MIGRATIONS]
    assert conn.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'ok_part'").fetchall()[0][0] == 0
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == len(MIGRATIONS)


def test_removed_memory_directory_is_reported_not_recreated(settings: Settings, workspace: Path) -> None:
    with MemoryStore.open(settings) as store:
        store.create_session(workspace)
    shutil.rmtree(settings.memory_dir)
    with pytest.raises(DatabaseDeletedError):
        MemoryStore.open(settings)
    assert not settings.memory_dir.exists()


def test_database_deleted_with_its_sidecar_is_still_refused(settings: Settings) -> None:
    MemoryStore.open(settings).close()
    os.remove(settings.database_path)
    os.remove(sidecar_path(settings.database_path))
    with pytest.raises(DatabaseDeletedError):
        MemoryStore.open(settings)
    assert not settings.database_path.exists()


def test_explicit_database_with_assets_left_is_refused(db_path: Path, settings: Settings) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        store.put_asset(b"picture", "image/png")
    os.remove(db_path)
    os.remove(sidecar_path(db_path))
    with pytest.raises(DatabaseDeletedError):
        MemoryStore.open_path(db_path, settings)
    assert not db_path.exists()


def test_reinitialize_moves_the_old_asset_folder_aside(settings: Settings) -> None:
    with MemoryStore.open(settings) as store:
        ref = store.put_asset(b"old media", "image/png")
        folder = store.asset_dir
    os.remove(settings.database_path)
    moved = MemoryStore.reinitialize(settings, confirm=True)
    assert not folder.exists()
    (aside,) = [p for p in moved if p.name.startswith(folder.name)]
    assert (aside / ref.digest).read_bytes() == b"old media"
    with MemoryStore.open(settings) as store:
        assert store.list_sessions().sessions == []


def _first_open(db: str, home: str, results, start) -> None:
    start.wait(60)  # every process imported and ready: the opens overlap
    with MemoryStore.open_path(db, Settings(home=home)) as store, store.db.read() as conn:
        results.put(conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'").fetchone()[0])


def test_concurrent_first_opens_create_one_store(db_path: Path, settings: Settings) -> None:
    ctx = multiprocessing.get_context("spawn")
    results, start = ctx.Queue(), ctx.Barrier(5)
    procs = [ctx.Process(target=_first_open, args=(str(db_path), str(settings.home), results, start))
             for _ in range(5)]
    for p in procs:
        p.start()
    ids = {results.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(ids) == 1
    with MemoryStore.open_path(db_path, settings) as store, store.db.read() as conn:
        assert applied(conn) == [m.name for m in MIGRATIONS]


def test_a_first_open_that_another_just_completed_opens_the_new_store(settings: Settings,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The interleaving a busy machine allows: this open sees no database, then another process creates the store
    # (database and marker) before this one looks for evidence that a store existed. The store is new, not deleted.
    from emelex_memory.core import opening

    real, raced = opening.store_evidence, []

    def another_open_completes_first(database: Path, **kwargs):
        if not raced:
            raced.append(database)
            subprocess.run([sys.executable, "-c", "import sys; from emelex_memory import MemoryStore, Settings; "
                            "MemoryStore.open(Settings(home=sys.argv[1])).close()", str(settings.home)],
                           check=True, timeout=120)
        return real(database, **kwargs)

    monkeypatch.setattr(opening, "store_evidence", another_open_completes_first)
    with MemoryStore.open(settings) as store, store.db.read() as conn:
        assert applied(conn) == [m.name for m in MIGRATIONS]
    assert raced == [settings.database_path]


def test_symlinked_or_loose_sidecar_is_refused(tmp_path: Path, db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    side = sidecar_path(db_path)
    os.chmod(side, 0o644)
    with pytest.raises(InsecurePathError, match="chmod 600"):
        MemoryStore.open_path(db_path, settings)
    os.remove(side)
    os.symlink(tmp_path / "elsewhere", side)
    with pytest.raises(InsecurePathError, match="symlink"):
        MemoryStore.open_path(db_path, settings)
    assert not (tmp_path / "elsewhere").exists()


def test_loose_wal_file_is_refused(db_path: Path, settings: Settings) -> None:
    store = MemoryStore.open_path(db_path, settings)  # keeps the WAL in place while open
    wal = Path(f"{db_path}-wal")
    os.chmod(wal, 0o644)
    with pytest.raises(InsecurePathError, match="side file"):
        MemoryStore.open_path(db_path, settings)
    store.close()


def test_connections_refuse_double_quoted_strings(store: MemoryStore) -> None:
    with store.db.read() as conn:
        with pytest.raises(apsw.SQLError, match="no such column"):
            conn.execute('SELECT "not a string literal"').fetchall()


def test_busy_waits_are_bounded(db_path: Path, tmp_path: Path, workspace: Path) -> None:
    patient = MemoryStore.open_path(db_path, Settings(home=tmp_path / "h", busy_timeout_ms=30_000))
    hasty = MemoryStore.open_path(db_path, Settings(home=tmp_path / "h", busy_timeout_ms=50))
    holder = subprocess.Popen(  # another process holds the write lock for a moment
        [sys.executable, "-c", "import apsw, sys, time; c = apsw.Connection(sys.argv[1]); c.execute('BEGIN IMMEDIATE');"
         " print('held', flush=True); time.sleep(0.5); c.execute('ROLLBACK')", str(db_path)],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(apsw.BusyError):  # gives up after its bound instead of waiting forever
        hasty.create_session(workspace)
    patient.create_session(workspace)  # waits out the writer
    assert holder.wait(60) == 0
    assert len(patient.list_sessions().sessions) == 1
    patient.close()
    hasty.close()


def test_connection_factory_refuses_symlinks(tmp_path: Path, db_path: Path, settings: Settings) -> None:
    MemoryStore.open_path(db_path, settings).close()
    link = db_path.with_name("link.sqlite3")
    os.symlink(db_path, link)
    with pytest.raises(StoreError, match="cannot open"):
        connect(link, busy_timeout_ms=0)


def test_files_of_another_user_are_refused(db_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    MemoryStore.open_path(db_path, settings).close()
    monkeypatch.setattr(os, "geteuid", lambda: os.lstat(db_path).st_uid + 4242)
    with pytest.raises(InsecurePathError, match="not you"):
        MemoryStore.open_path(db_path, settings)
