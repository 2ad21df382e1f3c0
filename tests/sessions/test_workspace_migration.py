"""m009_workspaces: a store from before it (here version 7, migrated through m008 on the way) moves its Sessions
and Knowledge onto workspace rows, losing nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    ForeignKeyViolationError,
    MemoryStore,
    NewEvent,
    Settings,
    WorkspaceIdentity,
    WorkspaceReplacedError,
)
from emelex_memory.core.migrations import MIGRATIONS, applied, migrate

from ..support import table_rows

V7 = MIGRATIONS[:7]
assert V7[-1].name == "m007_event_byte_ends"


def v7_store(db: Path, workspace: Path) -> tuple[int, int]:
    """A hand-built version-7 database: two Sessions in `workspace` (the newer at its current path), one in a
    directory that no longer exists, Knowledge in `workspace` with a sourced version and a tombstone, Knowledge of
    an identity no Session has, events, a released lease and a job. Returns `workspace`'s (device, inode)."""
    st = os.stat(workspace)
    dev, ino = st.st_dev, st.st_ino
    here = str(workspace.resolve())
    conn = apsw.Connection(str(db))
    migrate(conn, V7)
    with conn:
        sessions = [(1, "s1", "old path", "/renamed/away", dev, ino, 10.0, 11.0),
                    (2, "s2", None, here, dev, ino, 20.0, 21.0),
                    (3, "s3", "gone", "/gone", 77, 88, 5.0, 6.0)]
        conn.executemany("INSERT INTO sessions (id, uuid, title, workspace_path, workspace_dev, workspace_ino, "
                         "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", sessions)
        for sid, seq, at in ((1, 1, 15.0), (2, 1, 25.0), (2, 2, 26.0), (3, 1, 7.0)):
            conn.execute("INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, "
                         "created_at) VALUES (?, ?, ?, 0, 'user', '\"hi\"', 4, ?, ?)", (sid, seq, seq, 4 * seq, at))
        conn.execute("INSERT INTO session_leases (session_id, token_hash, holder, state, acquired_at, expires_at, "
                     "ended_at) VALUES (2, zeroblob(32), '1@h', 'released', 21, 99, 22)")
        conn.execute("INSERT INTO jobs (uuid, kind, session_id, source_key, source, state, due_at, created_at, "
                     "updated_at) VALUES ('j1', 'distill', 2, 'k', '{}', 'pending', 0, 21, 21)")
        knowledge = [(1, dev, ino, "build", 2, None, 1, 12.0, 13.0), (2, dev, ino, "old", 2, 14.0, 0, 12.0, 14.0),
                     (3, 5, 6, "orphan", 1, None, 0, 1.0, 1.0)]
        conn.executemany("INSERT INTO knowledge (id, workspace_dev, workspace_ino, key, head_version, tombstoned_at, "
                         "pinned, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", knowledge)
        versions = [(1, 1, 0, "make", 1.0, 2, "s2", 1, 2, "a" * 64), (1, 2, 0, "make test", 0.9, None, None, None,
                    None, None), (2, 1, 0, "x", 0.5, None, None, None, None, None),
                    (2, 2, 1, None, 0.5, None, None, None, None, None),
                    (3, 1, 0, "y", 0.5, None, None, None, None, None)]
        conn.executemany("INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, "
                         "origin, source_session_id, source_session_uuid, source_first_seq, source_last_seq, "
                         "source_digest, created_at) VALUES (?, ?, ?, ?, 5, ?, 'user', ?, ?, ?, ?, ?, 12)", versions)
    conn.close()
    os.chmod(db, 0o600)
    return dev, ino


def test_m009_moves_sessions_and_knowledge_onto_workspaces_and_keeps_every_row(db_path: Path, workspace: Path) -> None:
    dev, ino = v7_store(db_path, workspace)
    before = table_rows(db_path)
    conn = apsw.Connection(str(db_path))
    conn.execute("PRAGMA foreign_keys = ON")  # as Emelex opens it: a careless DROP TABLE would cascade
    assert migrate(conn) == [m.name for m in MIGRATIONS[7:]]
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1  # turned back on
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()
    after = table_rows(db_path)
    assert sorted(after["workspaces"]) == [
        (1, None, 5, 6, None, None, 1.0),  # Knowledge only: no path was ever recorded
        (2, "/gone", 77, 88, None, None, 5.0),
        (3, str(workspace.resolve()), dev, ino, None, None, 10.0),  # the path of its most recently active Session
    ]
    assert sorted(r[:6] for r in after["sessions"]) == [  # later steps may add columns
        (1, "s1", "old path", 3, 10.0, 11.0), (2, "s2", None, 3, 20.0, 21.0), (3, "s3", "gone", 2, 5.0, 6.0)]
    assert sorted((r[0], r[1], r[2]) for r in after["knowledge"]) == [(1, 3, "build"), (2, 3, "old"), (3, 1, "orphan")]
    for table in ("knowledge_versions", "events", "session_leases", "jobs"):  # later steps may add columns
        assert [r[: len(before[table][0])] for r in after[table]] == before[table], table


def test_a_migrated_store_goes_on_and_learns_the_missing_components(db_path: Path, workspace: Path) -> None:
    v7_store(db_path, workspace)
    with MemoryStore.open_path(db_path, Settings(home=db_path.parent / "h")) as store:
        assert [e.key for e in store.recall(workspace).entries] == ["build"]
        assert store.knowledge_history(workspace, "build").versions[0].source.session_id == "s2"
        with store.acquire_lease("s2", workspace) as lease:  # trust on first use fills generation and birth time
            assert [e.seq for e in lease.replay_all()] == [1, 2]
            lease.append_turn([NewEvent("user", "next")])
            lease.release()
        stored = store.get_session("s2").workspace
        assert stored == WorkspaceIdentity.inspect(workspace) == store.get_session("s1").workspace
        if stored.generation is None and stored.birth_ns is None:
            pytest.skip("this file system offers neither an inode generation nor a birth time")
        shutil.rmtree(workspace)
        workspace.mkdir()
        for call in (lambda: store.acquire_lease("s1", workspace), lambda: store.recall(workspace)):
            with pytest.raises(WorkspaceReplacedError, match="workspaces rebind 3 "):
                call()


def test_a_broken_reference_stops_the_workspaces_migration_and_changes_nothing(db_path: Path, workspace: Path) -> None:
    v7_store(db_path, workspace)
    step = next(i for i, m in enumerate(MIGRATIONS) if m.name.endswith("_workspaces"))
    conn = apsw.Connection(str(db_path))  # foreign keys off: plant a version whose entry does not exist
    migrate(conn, MIGRATIONS[:step])
    conn.execute("INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, "
                 "origin, created_at) VALUES (42, 1, 0, 'dangling', 5, 1.0, 'user', 0)")
    before = table_rows(db_path)
    conn.execute("PRAGMA foreign_keys = ON")
    with pytest.raises(ForeignKeyViolationError, match="nothing was changed"):
        migrate(conn)
    assert applied(conn) == [m.name for m in MIGRATIONS[:step]]
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    conn.close()
    assert table_rows(db_path) == before
