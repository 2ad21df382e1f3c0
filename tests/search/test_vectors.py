"""Vectors (search/vectors.py) in step with the store: written only for the text their row still holds, gone with
the row in the transaction that changes or deletes it, fused with the full-text ranking. The embedder here is a
plugin test double (a deterministic bag-of-letters vector): real inference is in tests/plugins/test_embedders.py."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import apsw
import pytest

from emelex_memory import COMPACTION_KIND, InvalidInputError, MemoryStore, Settings, compaction_handler, run_one_job
from emelex_memory.core.migrations import MIGRATIONS, migrate
from emelex_memory.maintenance.backup import backup_store, restore_backup
from emelex_memory.maintenance.doctor import diagnose
from emelex_memory.search.ranking import EVENTS, Ranked
from emelex_memory.search import vectors
from emelex_memory.search.vectors import fuse, nearest, unit_vector
from emelex_workers.host.types import Embedder
from emelex_workers.worker.embedding import embed_pending

from ..support import Clock
from .test_search_index import say, tokens

MODEL = "letters"


def letters(text: str) -> list[float]:
    """A deterministic vector of `text`: how often each letter a-z occurs, plus one."""
    low = text.lower()
    return [1.0 + low.count(chr(c)) for c in range(ord("a"), ord("z") + 1)]


EMBEDDER = Embedder(MODEL, lambda texts: [letters(t) for t in texts])


def vectors_agree(settings: Settings, database: Path | None = None) -> bool:
    """What doctor's "search vectors" check says."""
    (check,) = [c for c in diagnose(settings, database=database).checks if c.name == "search vectors"]
    return check.ok


def vectored(store: MemoryStore) -> set[tuple[str, int]]:
    with store.db.read() as conn:
        return set(conn.execute("SELECT item, item_id FROM search_vectors WHERE model = ?", (MODEL,)).fetchall())


def by_vector(store: MemoryStore, workspace: Path, query: str) -> list:
    return store.search(workspace, query, query_vector=letters(query), embedding_model=MODEL).hits


def test_vectors_are_written_outside_the_append_and_found_fused(store: MemoryStore, workspace: Path,
                                                                 db_path: Path) -> None:
    sid = say(store, workspace, "the otter sleeps by the river", "noted")
    assert vectored(store) == set()  # an append writes no vector
    assert [h.seq for h in by_vector(store, workspace, "otter")] == [1]  # full text finds what is not embedded yet
    assert embed_pending(store, EMBEDDER) == 2
    assert store.embedding_counts(MODEL) == (2, 0)
    hits = by_vector(store, workspace, "zzz sleeps")
    assert [(h.session_id, h.seq) for h in hits][0] == (sid, 1)
    assert vectors_agree(store.settings, db_path)


def test_a_deleted_sessions_rows_and_vectors_are_never_returned(store: MemoryStore, workspace: Path,
                                                                  db_path: Path) -> None:
    gone = say(store, workspace, "the secret walrus plan", "agreed")
    kept = say(store, workspace, "the public penguin plan", "agreed")
    embed_pending(store, EMBEDDER)
    store.delete_session(gone)
    assert {h.session_id for h in by_vector(store, workspace, "walrus plan secret")} == {kept}
    assert vectored(store) == {("event", i) for i in (3, 4)}
    assert vectors_agree(store.settings, db_path)


def test_a_changed_row_loses_its_vector_and_a_stale_one_is_never_written(store: MemoryStore,
                                                                          workspace: Path) -> None:
    store.remember(workspace, "pet", "a beagle named Biscuit")
    (item,) = store.pending_embeddings(MODEL)
    store.remember(workspace, "pet", "a corgi named Pepper")  # the text changed after it was read
    assert store.put_embeddings(MODEL, [(item, letters(item.text))]) == 0
    embed_pending(store, EMBEDDER)
    assert vectored(store) == {("knowledge", 1)}
    store.remember(workspace, "pet", "a corgi named Pepper, two years old")
    assert vectored(store) == set()
    embed_pending(store, EMBEDDER)
    store.forget(workspace, "pet")
    assert vectored(store) == set()
    assert store.embedding_counts(MODEL) == (0, 0)


def test_bad_vectors_are_refused_and_nothing_is_written(store: MemoryStore, workspace: Path) -> None:
    say(store, workspace, "one", "two")
    first, second = store.pending_embeddings(MODEL)
    for bad in ([], [0.0, 0.0], [float("nan")], ["x"]):
        with pytest.raises(InvalidInputError):
            store.put_embeddings(MODEL, [(first, letters("one")), (second, bad)])
    with pytest.raises(InvalidInputError, match="same length"):
        store.put_embeddings(MODEL, [(first, [1.0, 2.0]), (second, [1.0])])
    store.put_embeddings(MODEL, [(first, [1.0, 2.0])])
    with pytest.raises(InvalidInputError, match="has vectors of 2 numbers"):
        store.put_embeddings(MODEL, [(second, [1.0, 2.0, 3.0])])
    with pytest.raises(InvalidInputError, match="without the query's vector"):
        store.search(workspace, "one", embedding_model=MODEL)
    assert vectored(store) == {("event", 1)}


def test_a_summary_is_embedded_after_it_is_published_and_its_raw_prefix_keeps_its_vectors(
        cstore: MemoryStore, workspace: Path, db_path: Path) -> None:
    sid = cstore.create_session(workspace).id
    say(cstore, workspace, *[f"question {i} about zeppelins" if i % 2 == 0 else f"answer {i}" for i in range(20)],
        session_id=sid)
    assert embed_pending(cstore, EMBEDDER) == 20
    assert cstore.queue_compaction(sid, context_window=2000, count_tokens=tokens).job is not None
    handler = compaction_handler(lambda events, job: "the talk was about airships", model_ref="m@sha256:0")
    assert run_one_job(cstore, handler, kinds=COMPACTION_KIND).status == "done"
    assert [(i.item, i.text) for i in cstore.pending_embeddings(MODEL)] == [("event", "the talk was about airships")]
    assert embed_pending(cstore, EMBEDDER) == 1
    (best, *_) = by_vector(cstore, workspace, "airships")
    assert (best.event_kind, best.first_seq, best.last_seq) == ("summary", 1, 12)
    cstore.revert_compaction(sid)
    assert cstore.embedding_counts(MODEL) == (21, 0)  # the reverted Summary's event is kept, marked reverted
    assert vectors_agree(cstore.settings, db_path)


def test_vectors_stay_in_step_across_retention_and_restore(db_path: Path, home: Path, workspace: Path,
                                                             tmp_path: Path) -> None:
    clock = Clock(time.time())
    settings = Settings(home=home, session_retention_days=1)
    with MemoryStore.open_path(db_path, settings, clock=clock) as store:
        say(store, workspace, "ancient quokka words", "indeed")
        embed_pending(store, EMBEDDER)
        clock.now += 40 * 86_400
        kept = say(store, workspace, "fresh quokka words", "indeed")
        embed_pending(store, EMBEDDER)
        assert store.maintain().sessions_deleted == 1
        assert vectored(store) == {("event", 3), ("event", 4)}
        assert {h.session_id for h in by_vector(store, workspace, "quokka")} == {kept}
        backup_store(store, tmp_path / "backup")
    restored = Settings(home=tmp_path / "restored")
    restore_backup(tmp_path / "backup", restored)
    with MemoryStore.open(restored, create=False) as copy:
        assert vectored(copy) == {("event", 3), ("event", 4)}
        assert {h.session_id for h in by_vector(copy, workspace, "quokka")} == {kept}
    assert vectors_agree(restored)


def test_a_crash_during_the_embedding_pass_leaves_vectors_in_step(db_path: Path, settings: Settings,
                                                                   workspace: Path) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        for n in range(40):
            say(store, workspace, f"turn {n} about lemurs", "ok")
    child = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from emelex_memory import MemoryStore, Settings
        from emelex_workers.host.types import Embedder
        from emelex_workers.worker.embedding import embed_pending
        from tests.search.test_vectors import letters

        def slow(texts):
            print("embedding", flush=True)
            time.sleep(0.05)
            return [letters(t) for t in texts]

        with MemoryStore.open_path({str(db_path)!r}, Settings(home={str(settings.home)!r})) as store:
            embed_pending(store, Embedder("letters", slow))
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(2):  # let one batch be stored, then kill it while it embeds the next
            assert proc.stdout.readline() == "embedding\n"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    with MemoryStore.open_path(db_path, settings) as store:
        done, pending = store.embedding_counts(MODEL)
        assert done + pending == 80 and 0 < done < 80
        assert vectors_agree(settings, db_path)
        assert embed_pending(store, EMBEDDER) == pending
        assert store.embedding_counts(MODEL) == (80, 0)


def test_a_rows_vectors_are_found_by_index_when_it_changes_or_goes(store: MemoryStore) -> None:
    """Each trigger that deletes the vectors of a changed or deleted row reaches them through an index: a scan of
    every stored vector per changed row would make a distillation or a deleted Session cost the whole table."""
    with store.db.read() as conn:
        bodies = [sql for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_schema WHERE type = 'trigger' AND sql LIKE '%DELETE FROM search_vectors%'")]
        assert len(bodies) == 7
        for body in bodies:
            statement = body[body.index("DELETE FROM search_vectors"):body.rindex(";")]
            statement = re.sub(r"\b(OLD|NEW)\.\w+", "1", statement)
            plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement))
            assert "SCAN search_vectors" not in plan and "SEARCH search_vectors USING" in plan, (statement, plan)


def test_the_vectors_of_a_store_before_m023_are_kept(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "old.sqlite3"))
    step = [m.name for m in MIGRATIONS].index("m023_search_vectors_rows")
    migrate(conn, MIGRATIONS[:step])
    with conn:
        conn.execute("INSERT INTO workspaces (path, device, inode, created_at) VALUES ('/w', 1, 2, 0)")
        conn.executemany("INSERT INTO search_vectors (item, item_id, model, workspace_id, digest, vector) "
                         "VALUES (?, ?, 'm', 1, zeroblob(32), ?)",
                         [("knowledge", 3, b"\0\0\x80\x3f"), ("event", 7, b"\0\0\0\x40")])
    assert migrate(conn) == [m.name for m in MIGRATIONS[step:]]
    assert conn.execute("SELECT item, item_id, model, workspace_id, vector FROM search_vectors ORDER BY id").fetchall() \
        == [("event", 7, "m", 1, b"\0\0\0\x40"), ("knowledge", 3, "m", 1, b"\0\0\x80\x3f")]
    conn.close()


def test_the_query_is_embedded_without_the_words_most_sessions_hold(store: MemoryStore, workspace: Path,
                                                                    tmp_path: Path) -> None:
    for n in range(4):
        say(store, workspace, f"Evening Jon! Quick catch-up number {n}?", "Pretty good, thanks for asking!")
    say(store, workspace, "Hi Jon, what are you up to?", "I'm currently reading The Lean Startup.")
    question = "What book is Jon currently reading?"
    assert store.embedding_query(workspace, question) == "What book is currently reading"  # Jon: 5 of 5 Sessions
    other = tmp_path / "other"
    other.mkdir()
    say(store, other, "Jon Jon Jon", "Jon")
    assert store.embedding_query(other, question) == question  # one Session: no word is in most of them
    assert store.embedding_query(workspace, question) == "What book is currently reading"  # the other changes nothing
    assert store.embedding_query(workspace, "Jon?") == "Jon?"  # every word widespread: the query as it is
    assert store.embedding_query(tmp_path, question) == question  # no workspace there
    with pytest.raises(InvalidInputError, match="no word"):
        store.embedding_query(workspace, "?!")


def test_the_nearest_vector_counts_as_much_as_the_best_full_text_match() -> None:
    """Equal weights: a row only the query's vector finds (a paraphrase sharing no word
    with the query) comes right after a row both find first, ahead of the second full-text match."""
    ranked = [Ranked(EVENTS, rowid, 10.0 - rowid, 0.5) for rowid in (1, 2, 3)]
    fused = fuse(ranked, [(EVENTS, 9, 0.8), (EVENTS, 1, 0.7)])
    assert [r.rowid for r in fused] == [1, 9, 2, 3]
    assert [r.relevance for r in fused] == [0.5, 0.0, 0.5, 0.5]


def test_rows_both_sides_find_weakly_never_outrank_the_nearest_row() -> None:
    """A full-text list long with weak matches (rows holding only a little of the query's weight), which the
    vectors also reach far down their list, does not push the nearest row down: each side's scores are normalised
    and summed, and a row counts as a full-text match only when it holds the share of the query's weight recall
    asks of a note. The weak rows follow, in their order."""
    strong = Ranked(EVENTS, 1, 12.0, 0.9)
    weak = [Ranked(EVENTS, rowid, 1.0, 0.1) for rowid in range(2, 32)]
    near = [(EVENTS, 100, 0.9)] + [(EVENTS, rowid, 0.35 - rowid / 1000) for rowid in range(2, 32)]
    fused = fuse([strong, *weak], near)
    assert {r.rowid for r in fused[:2]} == {1, 100}
    assert [r.rowid for r in fused[2:]] == list(range(2, 32))
    assert {r.rowid: r.relevance for r in fused}[100] == 0.0


def test_a_query_only_weak_rows_match_leaves_the_order_to_the_vectors() -> None:
    """Rows holding less of the query's weight than recall asks of a note (a common word or two) are no full-text
    match in the fusion: the nearest row, which holds none of the query's words, leads, and they follow by their
    vectors."""
    weak = [Ranked(EVENTS, rowid, 1.0 - rowid / 1000, 0.1) for rowid in range(2, 32)]
    near = [(EVENTS, 100, 0.9)] + [(EVENTS, rowid, 0.35 - rowid / 1000) for rowid in range(2, 32)]
    fused = fuse(weak, near)
    assert [r.rowid for r in fused] == [100, *range(2, 32)]


def test_the_nearest_rows_come_with_their_cosine_similarity(store: MemoryStore, workspace: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan's similarity is the cosine of the query's vector and the row's, best first, over every row of the
    workspace read page by page."""
    monkeypatch.setattr(vectors, "SCAN_PAGE", 7)
    texts = [f"note {n} " + "ab" * n for n in range(1, 40)]
    say(store, workspace, *texts, *texts[:1])
    embed_pending(store, EMBEDDER)
    query = letters("zebra bank")
    with store.db.read() as conn:
        (scope,) = conn.execute("SELECT DISTINCT workspace_id FROM search_vectors").fetchone()
        near = nearest(conn, scope, MODEL, unit_vector(query), (EVENTS,), limit=100)
        bodies = dict(conn.execute("SELECT rowid, body FROM event_search").fetchall())

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    expected = sorted(((cosine(query, letters(body)), rowid) for rowid, body in bodies.items()), reverse=True)
    assert len(near) == len(bodies) == 40
    assert [rowid for _, rowid, _ in near] == [rowid for _, rowid in expected]
    assert [s for _, _, s in near] == pytest.approx([s for s, _ in expected], abs=1e-6)
