"""When an entry was said (`KnowledgeVersion.said_at`): the time of its source event, kept by a tombstone, checked
against the job's source, immutable, filled in for the versions of a store made before it existed, and the date of
the entry's recall notes and search hits."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.core.migrations import MIGRATIONS, migrate
from emelex_memory.knowledge.distillation import KnowledgeCandidate
from emelex_memory.search.recall import note_line
from emelex_memory.search.service import day


@pytest.fixture
def store(cstore):
    return cstore


def _session(store: MemoryStore, workspace: Path, clock, *texts: str) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        for text in texts:
            clock.now += 10  # ten seconds between turns
            lease.append_turn([NewEvent("user", {"text": text}), NewEvent("assistant", {"text": "noted"})])
        store.finish_session(lease)
    return session.id


def test_an_entry_is_dated_by_the_event_it_was_said_in_and_its_tombstone_keeps_the_date(store, workspace, clock):
    sid = _session(store, workspace, clock, "we use tabs", "the release is on Friday")
    events = store.replay(sid).events
    store.work_distillation(lambda data: [
        KnowledgeCandidate("indent", "we use tabs", 0.9, said_at=data.events[0].created_at),
        KnowledgeCandidate("release", "the release is on Friday", 0.9)])
    assert store.get_knowledge(workspace, "indent").head.said_at == events[0].created_at
    assert store.get_knowledge(workspace, "release").head.said_at == events[-1].created_at  # none named: the last
    clock.now += 86400
    forgotten = store.forget(workspace, "indent")
    assert forgotten.tombstone and forgotten.said_at == events[0].created_at
    clock.now += 60
    by_hand = store.remember(workspace, "style", "black, 88 columns")
    assert by_hand.said_at == by_hand.created_at  # no provenance: when it was written
    cited = store.remember(workspace, "tests", "make test", source=store.knowledge_source(sid, 1, 2))
    assert cited.said_at == events[1].created_at


def test_a_said_at_outside_the_sources_times_refuses_the_batch(store, workspace, clock):
    sid = _session(store, workspace, clock, "we use tabs")
    first = store.replay(sid).events[0].created_at
    outcome = store.work_distillation(lambda data: [KnowledgeCandidate("indent", "we use tabs", 0.9,
                                                                       said_at=first - 86400)])
    assert outcome.status == "failed" and "outside the times of the job's source events" in outcome.job.diagnostics[0].message
    assert store.recall(workspace).entries == []


def test_said_at_is_immutable(store, workspace, db_path):
    store.remember(workspace, "style", "tabs")
    conn = apsw.Connection(str(db_path))
    with pytest.raises(apsw.ConstraintError, match="immutable"):
        conn.execute("UPDATE knowledge_versions SET said_at = 0")
    conn.close()


def test_the_migration_dates_existing_versions_by_their_source_or_their_writing(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "old.sqlite3"))
    step = next(i for i, m in enumerate(MIGRATIONS) if m.name == "m022_knowledge_said_at")
    migrate(conn, MIGRATIONS[:step])
    with conn:
        conn.execute("INSERT INTO workspaces (path, device, inode, created_at) VALUES ('/w', 1, 2, 0)")
        conn.execute("INSERT INTO sessions (uuid, workspace_id, created_at, updated_at) VALUES ('s', 1, 0, 0)")
        conn.executemany(
            "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, created_at) "
            "VALUES (1, ?, 1, ?, 'user', '{\"text\":\"x\"}', 1, ?, ?)", [(1, 0, 1, 100.0), (2, 1, 2, 200.0)])
        conn.execute("INSERT INTO knowledge (workspace_id, key, head_version, created_at, updated_at) "
                     "VALUES (1, 'k', 2, 0, 0)")
        conn.execute("INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, "
                     "origin, created_at) VALUES (1, 1, 0, 'by hand', 1, 1.0, 'user', 50.0)")
        conn.execute("INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, "
                     "origin, source_session_id, source_session_uuid, source_first_seq, source_last_seq, source_digest, "
                     "created_at) VALUES (1, 2, 0, 'cited', 1, 1.0, 'distillation', 1, 's', 1, 2, ?, 300.0)",
                     ("0" * 64,))
    migrate(conn)
    assert conn.execute("SELECT version, said_at FROM knowledge_versions ORDER BY version").fetchall() == [
        (1, 50.0), (2, 200.0)]
    conn.close()


def test_recall_notes_and_search_hits_are_dated_when_the_statement_was_said(store, workspace, clock):
    session = store.create_session(workspace)  # created on one day ...
    clock.now += 3 * 86400  # ... the statement said three days later ...
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([NewEvent("user", {"text": "the harbour ferry leaves at nine"})])
        store.finish_session(lease)
    said = store.replay(session.id).events[0].created_at
    clock.now += 5 * 86400  # ... and distilled five days after that
    store.work_distillation(lambda data: [KnowledgeCandidate("ferry", "the harbour ferry leaves at nine", 0.9)])
    said_day = day(said)
    assert said_day not in (day(store.get_session(session.id).created_at), day(clock.now))
    (note,) = [n for n in store.select_recall(workspace, "harbour ferry", 1000).notes if n["kind"] == "knowledge"]
    assert (note["key"], note["date"], note_line(note)) == (
        "ferry", said_day, f"[{said_day}] ferry: the harbour ferry leaves at nine")
    (hit,) = store.search(workspace, "harbour ferry", kinds="knowledge").hits
    assert (hit.key, hit.date) == ("ferry", said_day)
