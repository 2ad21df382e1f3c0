"""The search index never disagrees with the store: every write path keeps it in step, in the same transaction."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import apsw
import pytest

from emelex_memory.search.service import day
from emelex_memory import (
    COMPACTION_KIND,
    Event,
    InvalidInputError,
    KnowledgeHit,
    MemoryStore,
    NewEvent,
    SessionHit,
    Settings,
    compaction_handler,
    run_one_job,
)
from emelex_memory.core.migrations import MIGRATIONS, migrate
from emelex_memory.maintenance.backup import backup_store, restore_backup
from emelex_memory.maintenance.doctor import diagnose

from ..support import Clock


def say(store: MemoryStore, workspace: Path, *texts: str, session_id: str | None = None) -> str:
    """Append one user/assistant turn per pair of `texts` to a Session (a new one by default); return its ID."""
    session_id = session_id or store.create_session(workspace).id
    with store.acquire_lease(session_id, workspace) as lease:
        list(lease.replay_all())
        for user, answer in zip(texts[::2], texts[1::2]):
            lease.append_turn([NewEvent("user", {"text": user}), NewEvent("assistant", {"text": answer})])
        lease.release()
    return session_id


def found(store: MemoryStore, workspace: Path, query: str, kinds=("knowledge", "sessions")) -> list:
    return store.search(workspace, query, kinds=kinds).hits


def index_agrees(settings_or_path, database: Path | None = None) -> bool:
    """What doctor's "search index" check says."""
    report = diagnose(settings_or_path, database=database)
    (check,) = [c for c in report.checks if c.name == "search index"]
    return check.ok


def test_an_appended_turn_is_found_with_its_citation(store: MemoryStore, workspace: Path, db_path: Path) -> None:
    sid = say(store, workspace, "how does the tokenizer treat tabs", "it splits on tabs and spaces")
    hits = found(store, workspace, "tokenizer", kinds="sessions")
    assert hits == [SessionHit(sid, 1, 1, 1, 1, "user", None, "how does the [tokenizer] treat tabs", hits[0].score,
                               1.0, None, day(store.get_session(sid).created_at))]
    assert {(h.seq, h.event_kind) for h in found(store, workspace, "tabs")} == {(1, "user"), (2, "assistant")}
    assert index_agrees(store.settings, db_path)


def test_tool_calls_and_results_are_indexed_other_kinds_are_not(store: MemoryStore, workspace: Path) -> None:
    sid = store.create_session(workspace).id
    with store.acquire_lease(sid, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([
            NewEvent("tool_calls", {"round": 1, "calls": [
                {"call_id": "callzebra", "tool": "read_file", "arguments": {"path": "src/walrus.py"}}]}),
            NewEvent("tool_result", {"call_id": "callzebra", "tool": "read_file", "outcome": "ok",
                                     "output": "def narwhal(): pass"}),
            NewEvent("audit", {"note": "platypus"}),
        ])
        lease.release()
    assert [h.event_kind for h in found(store, workspace, "walrus")] == ["tool_calls"]
    assert [h.event_kind for h in found(store, workspace, "narwhal")] == ["tool_result"]
    assert found(store, workspace, "callzebra") == []  # a call ID is no word anyone searches for
    assert found(store, workspace, "platypus") == []


def test_a_long_event_is_indexed_within_its_bound(store: MemoryStore, workspace: Path) -> None:
    say(store, workspace, "early " + "filler " * 2000 + "latecomer", "ok")
    assert [h.seq for h in found(store, workspace, "early")] == [1]
    assert found(store, workspace, "latecomer") == []  # past the first 8192 characters


def test_knowledge_upsert_tombstone_and_revival_keep_the_index_in_step(store: MemoryStore, workspace: Path) -> None:
    store.remember(workspace, "build.indent", "the build uses tabs")
    assert [(h.key, h.version) for h in found(store, workspace, "tabs")] == [("build.indent", 1)]
    store.remember(workspace, "build.indent", "the build uses spaces")
    assert found(store, workspace, "tabs") == []  # the replaced version is no longer found
    assert [(h.key, h.version) for h in found(store, workspace, "spaces")] == [("build.indent", 2)]
    assert [h.key for h in found(store, workspace, "indent")] == ["build.indent"]  # the key is indexed too
    store.forget(workspace, "build.indent")
    assert found(store, workspace, "spaces") == []
    store.remember(workspace, "build.indent", "the build uses spaces again")
    assert [(h.key, h.version) for h in found(store, workspace, "spaces")] == [("build.indent", 4)]
    assert index_agrees(store.settings, store.db.path)


def test_pinned_and_confident_entries_rank_first(store: MemoryStore, workspace: Path) -> None:
    for key, confidence in (("a", 0.2), ("b", 0.9), ("c", 0.5)):
        store.remember(workspace, key, "the deploy script runs nightly", confidence=confidence)
    assert [h.key for h in found(store, workspace, "deploy")] == ["b", "c", "a"]
    store.pin(workspace, "a")
    assert [h.key for h in found(store, workspace, "deploy")] == ["a", "b", "c"]


def test_another_workspace_sees_nothing(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    say(store, workspace, "the secret word is marmalade", "noted")
    store.remember(workspace, "w", "marmalade")
    assert found(store, other, "marmalade") == []
    say(store, other, "hello", "hi")
    assert found(store, other, "marmalade") == []
    assert len(found(store, workspace, "marmalade")) == 2


def tokens(event: Event) -> int:
    return 100


def test_a_summary_is_indexed_and_the_raw_prefix_it_replaced_is_marked(cstore: MemoryStore, workspace: Path) -> None:
    sid = cstore.create_session(workspace).id
    say(cstore, workspace, *[f"question {i} about zeppelins" if i % 2 == 0 else f"answer {i}" for i in range(20)],
        session_id=sid)
    assert cstore.queue_compaction(sid, context_window=2000, count_tokens=tokens).job is not None
    handler = compaction_handler(lambda events, job: "the talk was about airships", model_ref="m@sha256:0")
    assert run_one_job(cstore, handler, kinds=COMPACTION_KIND).status == "done"
    (summary,) = found(cstore, workspace, "airships")
    summary_seq = summary.seq
    assert (summary.event_kind, summary.first_seq, summary.covered_by) == ("summary", 1, None)
    assert (summary_seq, summary.last_seq) == (21, 12)  # appended after the 20 events, replacing the first 12
    raw = found(cstore, workspace, "zeppelins")
    assert len(raw) == 10  # raw events stay searchable while they are stored ...
    assert {h.covered_by for h in raw if h.seq <= 12} == {21}  # ... marked with the Summary that replaced them
    assert {h.covered_by for h in raw if h.seq > 12} == {None}
    cstore.revert_compaction(sid)
    assert {h.covered_by for h in found(cstore, workspace, "zeppelins")} == {None}


def test_a_deleted_session_is_never_found_again(store: MemoryStore, workspace: Path, db_path: Path) -> None:
    gone = say(store, workspace, "my password is hunter2 obviously", "please do not say it")
    kept = say(store, workspace, "the obviously fine session", "yes")
    store.delete_session(gone)
    assert [h.session_id for h in found(store, workspace, "obviously")] == [kept]
    assert found(store, workspace, "hunter2") == []
    assert index_agrees(store.settings, db_path)
    store.close()
    conn = apsw.Connection(str(db_path))
    assert b"hunter2" not in b"".join(  # neither in the index's own pages (FTS5 secure-delete)
        bytes(block) for (block,) in conn.execute("SELECT block FROM event_search_data"))
    conn.close()


def test_retention_keeps_the_index_in_step(db_path: Path, home: Path, workspace: Path) -> None:
    clock = Clock(time.time())
    settings = Settings(home=home, session_retention_days=1, knowledge_retention_days=1, knowledge_keep_versions=1)
    store = MemoryStore.open_path(db_path, settings, clock=clock)
    say(store, workspace, "ancient history of quokkas", "indeed")
    store.remember(workspace, "old", "quokkas live on islands")
    store.remember(workspace, "pruned", "first wombat version")
    store.remember(workspace, "pruned", "second wombat version")
    store.pin(workspace, "pruned")
    clock.now += 40 * 86_400
    store.unpin(workspace, "pruned")
    store.remember(workspace, "pruned", "third wombat version")
    report = store.maintain()
    assert (report.sessions_deleted, report.knowledge_tombstoned) == (1, 1)
    assert found(store, workspace, "quokkas") == []
    clock.now += 40 * 86_400
    store.remember(workspace, "pruned", "fourth wombat version")
    report = store.maintain()
    assert report.versions_pruned >= 1 and report.knowledge_purged >= 1
    assert [(h.key, h.version) for h in found(store, workspace, "wombat")] == [("pruned", 4)]
    assert index_agrees(settings, db_path)
    store.close()


def knowledge_index_writes(store: MemoryStore) -> list[str]:
    """Record each statement that writes the Knowledge index from now on ("delete" or "insert"), as SQLite traces the
    statements of the triggers it runs (a trigger whose WHEN clause is false runs none)."""
    writes: list[str] = []

    def trace(event: dict) -> None:
        verb, _, table = event["sql"].partition(" ")
        if table.startswith(("INTO knowledge_search ", "FROM knowledge_search ")):
            writes.append(verb.lower())

    store.db.conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
    return writes


def test_each_knowledge_write_reindexes_its_entry_once(db_path: Path, home: Path, workspace: Path) -> None:
    clock = Clock(time.time())
    store = MemoryStore.open_path(db_path, Settings(home=home, knowledge_keep_versions=1), clock=clock)
    writes = knowledge_index_writes(store)
    reindexed = ["delete", "insert"]  # an entry's indexed row is replaced by what its head now says
    store.remember(workspace, "k", "first koala version")
    assert writes == reindexed
    writes.clear()
    store.remember(workspace, "k", "second koala version")  # the head moves, then its version is written
    assert writes == reindexed
    store.remember(workspace, "k", "third koala version")
    clock.now += 40 * 86_400
    writes.clear()
    assert store.maintain().versions_pruned == 2
    assert writes == []  # pruning versions older than the head changes nothing that is indexed
    store.forget(workspace, "k")
    assert writes == reindexed
    assert index_agrees(store.settings, db_path)
    store.close()


def test_an_appended_turn_is_one_index_segment(store: MemoryStore, workspace: Path) -> None:
    """FTS5 writes its pending terms as a new segment at the end of every statement that wrote them: a turn written
    event by event would cost a segment (and a later merge) per event; `append_turn` writes each turn as one."""
    sid = store.create_session(workspace).id
    segments: list[str] = []

    def trace(event: dict) -> None:
        if event["sql"].startswith("INSERT INTO 'main'.'event_search_idx'"):  # a new segment's first-term entry
            segments.append(event["sql"])

    with store.acquire_lease(sid, workspace) as lease:
        list(lease.replay_all())
        store.db.conn.trace_v2(apsw.SQLITE_TRACE_STMT, trace)
        lease.append_turn([NewEvent("user", {"text": f"question {n} about otters"}) for n in range(4)])
        store.db.conn.trace_v2(0, None)
        lease.release()
    assert len(segments) == 1
    assert len(found(store, workspace, "otters")) == 4


def test_reinit_starts_with_an_empty_index(db_path: Path, settings: Settings, workspace: Path) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        say(store, workspace, "lost words of lemurs", "gone")
    for side in ("", "-wal", "-shm"):
        Path(f"{db_path}{side}").unlink(missing_ok=True)
    MemoryStore.reinitialize_path(db_path, confirm=True)
    with MemoryStore.open_path(db_path, settings) as store:
        assert found(store, workspace, "lemurs") == []
        say(store, workspace, "new words of lemurs", "here")
        assert [h.snippet for h in found(store, workspace, "lemurs")] == ["new words of [lemurs]"]
    assert index_agrees(settings, db_path)


def test_a_restored_backup_finds_what_the_store_found(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    sid = say(store, workspace, "the meerkat plan", "agreed")
    store.remember(workspace, "plan", "meerkats first")
    backup_store(store, tmp_path / "backup")
    restored = Settings(home=tmp_path / "restored")
    restore_backup(tmp_path / "backup", restored)
    with MemoryStore.open(restored, create=False) as copy:
        hits = found(copy, workspace, "meerkat")
    assert [(h.kind, getattr(h, "key", None), getattr(h, "session_id", None)) for h in hits] == [
        ("knowledge", "plan", None), ("sessions", None, sid)]
    assert index_agrees(restored)


def test_the_migration_indexes_an_existing_store(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "old.sqlite3"))
    step = [m.name for m in MIGRATIONS].index("m014_search_index")
    migrate(conn, MIGRATIONS[:step])  # a store of the release before the index, with rows no trigger indexed
    with conn:
        conn.execute("INSERT INTO workspaces (path, device, inode, created_at) VALUES ('/w', 1, 2, 0)")
        conn.execute("INSERT INTO sessions (uuid, workspace_id, created_at, updated_at) VALUES ('s', 1, 0, 0)")
        conn.executemany(
            "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, created_at) "
            "VALUES (1, ?, 1, ?, ?, ?, 1, ?, 0)",
            [(1, 0, "user", '{"text":"old capybara words"}', 1), (2, 1, "assistant", '{"text":"old reply"}', 2)])
        conn.execute("INSERT INTO knowledge (workspace_id, key, head_version, created_at, updated_at) "
                     "VALUES (1, 'k', 2, 0, 0)")
        conn.executemany(
            "INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, origin, "
            "created_at) VALUES (1, ?, 0, ?, 1, 1.0, 'user', 0)", [(1, "stale capybara"), (2, "fresh capybara")])
    assert migrate(conn) == [m.name for m in MIGRATIONS[step:]]
    match = "SELECT rowid FROM {0} WHERE {0} MATCH ? ORDER BY rowid"
    assert conn.execute(match.format("event_search"), ('"capybara"',)).fetchall() == [(1,)]
    assert conn.execute(match.format("event_search"), ('"reply"',)).fetchall() == [(2,)]
    assert conn.execute("SELECT key, content FROM knowledge_search").fetchall() == [("k", "fresh capybara")]
    assert conn.execute("SELECT rowid, ws, head FROM session_search").fetchall() == [  # m018: titles and dates
        (1, "w1", "1970-01-01 January 1970 Thursday")]
    conn.close()


def test_doctor_finds_an_index_that_disagrees(store: MemoryStore, workspace: Path, db_path: Path) -> None:
    say(store, workspace, "alpha beta", "gamma")
    store.remember(workspace, "k", "delta")
    assert index_agrees(store.settings, db_path)
    with store.db.write() as conn:
        conn.execute("DELETE FROM event_search WHERE rowid = (SELECT min(id) FROM events)")
    assert not index_agrees(store.settings, db_path)
    with store.db.write() as conn:
        conn.execute("INSERT INTO event_search (rowid, ws, body) SELECT min(id), 'w1', 'alpha beta' FROM events")
        conn.execute("INSERT INTO knowledge_search (rowid, ws, key, content) VALUES (999, 'w1', 'x', 'stale')")
    assert not index_agrees(store.settings, db_path)


@pytest.mark.parametrize("query", ["", "   ", '"""', "*", "()", "^", "-", "x" * (1 << 20), "\x00",
                                   b"\xff\xfe", "\udcff", 42, None])
def test_bad_queries_are_refused_with_a_typed_error(store: MemoryStore, workspace: Path, query) -> None:
    say(store, workspace, "something", "else")
    with pytest.raises(InvalidInputError):
        store.search(workspace, query)


@pytest.mark.parametrize("query", ['a AND b', 'NEAR(a b)', 'col:a', '"unbalanced', 'a OR', 'x*', '{ws}: w1',
                                   'NOT', "a\x00b", "(((a", "-a", "a' OR 1=1 --"])
def test_syntax_heavy_queries_are_only_words(store: MemoryStore, workspace: Path, query: str) -> None:
    say(store, workspace, "something", "else")
    assert store.search(workspace, query).hits == []


def test_operators_in_a_query_are_searched_as_words(store: MemoryStore, workspace: Path) -> None:
    say(store, workspace, "we should NEAR the goal and NOT stop", "ok")
    assert [h.seq for h in found(store, workspace, "NEAR(")] == [1]
    assert [h.seq for h in found(store, workspace, '"NOT"')] == [1]


def test_pages_are_bounded_and_continue(store: MemoryStore, workspace: Path) -> None:
    for n in range(3):
        store.remember(workspace, f"k{n}", f"ocelot fact {n}")
    say(store, workspace, "ocelot one", "ocelot two", "ocelot three", "ocelot four")
    seen, cursor = [], None
    while True:
        page = store.search(workspace, "ocelot", limit=2, cursor=cursor)
        assert 1 <= len(page.hits) <= 2
        seen += page.hits
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(h.kind for h in seen) == ["knowledge"] * 3 + ["sessions"] * 4
    assert [h.score for h in seen] == sorted((h.score for h in seen), reverse=True)
    assert len({(getattr(h, "key", None), getattr(h, "seq", None)) for h in seen}) == 7
    with pytest.raises(InvalidInputError):
        store.search(workspace, "ocelot", cursor="knowledge:x")
    with pytest.raises(InvalidInputError):
        store.search(workspace, "ocelot", kinds=("facts",))
    assert [h.kind for h in store.search(workspace, "ocelot", kinds="knowledge", limit=10).hits] == ["knowledge"] * 3


CHILD = r"""
import sys
from pathlib import Path
from emelex_memory import MemoryStore, NewEvent, Settings
store = MemoryStore.open(Settings(home=Path(sys.argv[1])))
ws = Path(sys.argv[2])
sid = store.create_session(ws).id
lease = store.acquire_lease(sid, ws, ttl_s=600)
list(lease.replay_all())
n = 0
while True:
    lease.append_turn([NewEvent("user", {"text": f"crash word{n} question"}),
                       NewEvent("assistant", {"text": f"answer word{n}"})])
    store.remember(ws, f"k{n % 7}", f"fact word{n}")
    if n % 5 == 0:
        store.forget(ws, f"k{n % 7}")
    n += 1
    if n == 20:
        print("writing", flush=True)
"""


def test_a_writer_killed_during_indexed_writes_leaves_store_and_index_agreeing(
    settings: Settings, workspace: Path
) -> None:
    MemoryStore.open(settings).close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(settings.home), str(workspace)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([child.stdout], [], [], 60)[0], "the writer did not start within 60 s"
        assert child.stdout.readline().strip() == "writing"
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert index_agrees(settings)
    with MemoryStore.open(settings, create=False) as store:
        with store.db.read() as conn:
            (last,) = conn.execute("SELECT payload ->> '$.text' FROM events WHERE kind = 'user' "
                                   "ORDER BY id DESC LIMIT 1").fetchone()
        word = last.split()[1]  # "crash wordN question": the newest committed turn
        hits = store.search(workspace, word, kinds="sessions").hits
        assert sorted(h.event_kind for h in hits) == ["assistant", "user"]
