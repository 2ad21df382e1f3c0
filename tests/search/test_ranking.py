"""The one ranking (search/ranking.py): Knowledge and transcript hits on one scale, statistics of the searched
workspace alone, common words weighing little, Session titles and dates searchable."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from emelex_memory import KnowledgeHit, MemoryStore, SessionHit

from .test_search_index import say

SMALL_TALK = ["Wow Jon, same here!", "What a day.", "Haha, that's great Jon.", "What are you up to, Jon?",
              "Not much, the usual.", "The weather is strange lately.", "What a week, honestly.", "Same, Jon."]


def chat(store: MemoryStore, workspace: Path, *facts: str) -> str:
    """A Session of small talk about Jon with `facts` said in the middle; its ID."""
    texts = SMALL_TALK[:4] + list(facts) + SMALL_TALK[4:]
    return say(store, workspace, *(texts + ["ok"] * (len(texts) % 2)))


def ranking(store: MemoryStore, workspace: Path, query: str) -> list[tuple]:
    """The hits of `query` as comparable tuples: what each is and its score."""
    out = []
    for hit in store.search(workspace, query, limit=50).hits:
        what = ("k", hit.key) if isinstance(hit, KnowledgeHit) else ("s", hit.session_id, hit.seq)
        out.append((*what, round(hit.score, 9)))
    return out


def test_a_weak_knowledge_match_never_outranks_a_strong_transcript_match(store: MemoryStore,
                                                                           workspace: Path) -> None:
    for _ in range(3):
        chat(store, workspace, "I went for a run by the river.", "Nice, how far?")
    sid = chat(store, workspace, "I'm currently reading The Lean Startup.", "Is it any good?")
    for n, note in enumerate(["Wow Jon, same here!", "What a day.", "A good book, honestly."]):
        store.remember(workspace, f"note.{n}", note, confidence=1.0)
        store.pin(workspace, f"note.{n}")
    hits = store.search(workspace, "What book is Jon currently reading?", limit=20).hits
    best = hits[0]
    assert isinstance(best, SessionHit) and (best.session_id, best.seq) == (sid, 5)
    assert all(isinstance(h, SessionHit) or h.score < best.score for h in hits)
    assert any(isinstance(h, KnowledgeHit) and h.score > 0 for h in hits)  # the weak match is there, and ranked
    # a strong Knowledge match still comes first: the same scale for both kinds
    store.remember(workspace, "reading", "Jon is currently reading The Lean Startup", confidence=0.5)
    assert store.search(workspace, "What is Jon currently reading, The Lean Startup?", limit=1).hits[0].kind \
        == "knowledge"


def test_adding_another_workspace_changes_no_ranking(store: MemoryStore, workspace: Path, tmp_path: Path) -> None:
    chat(store, workspace, "Jon adopted a beagle called Biscuit.", "Cute!")
    chat(store, workspace, "The deploy uses Helm now, not Terraform.", "Good call.")
    chat(store, workspace, "Biscuit chewed the Helm chart printout.", "Ha!")
    store.remember(workspace, "deploy", "We deploy with Helm", confidence=0.9)
    queries = ["What did Jon adopt?", "How do we deploy?", "Biscuit Helm", "what the day"]
    before = {q: ranking(store, workspace, q) for q in queries}
    other = tmp_path / "other"
    other.mkdir()
    for n in range(100):  # the words rare here are everywhere there, and the reverse
        say(store, other, f"Biscuit and Helm and Terraform {n}", "deploy deploy Jon beagle",
            "a b c", "the the the day what")
        store.remember(other, f"k{n}", "Helm Biscuit deploy adopt")
    assert {q: ranking(store, workspace, q) for q in queries} == before


def test_common_words_weigh_little_and_absent_ones_find_nothing(store: MemoryStore, workspace: Path) -> None:
    for _ in range(5):
        chat(store, workspace, "What a lovely day it was.", "The day was long.")
    sid = chat(store, workspace, "The ferry to the island leaves at nine.", "Good to know.")
    (best, *_) = store.search(workspace, "When does the ferry leave, what day?").hits
    assert (best.session_id, best.seq) == (sid, 5)
    assert store.search(workspace, "zeppelin").hits == []


def test_a_sessions_title_and_date_are_searchable_and_shown(store: MemoryStore, workspace: Path) -> None:
    clock = store.db.clock
    may = dt.datetime(2023, 5, 7, 18, tzinfo=dt.timezone.utc).timestamp()
    store.db.clock = lambda: may
    try:
        in_may = store.create_session(workspace, title="release planning").id
    finally:
        store.db.clock = clock
    say(store, workspace, "we agreed on the release checklist", "noted", session_id=in_may)
    later = say(store, workspace, "the release checklist changed again", "noted")
    (first, second) = [h for h in store.search(workspace, "release checklist May 2023").hits if h.event_kind == "user"]
    assert (first.session_id, first.session_date, first.session_title) == (in_may, "2023-05-07", "release planning")
    assert second.session_id == later and first.score > second.score
    assert [h.session_id for h in store.search(workspace, "checklist Sunday").hits][0] == in_may  # 7 May 2023


def test_a_name_said_in_every_session_does_not_outrank_the_answer(store: MemoryStore, workspace: Path) -> None:
    """The person a conversation is with is greeted by name in nearly every Session: the name (and any word most
    Sessions hold) tells no turn from another, so the turn that answers leads, not the greetings."""
    for n in range(5):
        say(store, workspace, f"Jon! How does it go, Jon? Day {n} here.", "All good, thanks.")
    answer = say(store, workspace, "Jon! How does it go, Jon?",
                 "I started to play the ukulele last month; my fingers hurt every evening after work.")
    hits = store.search(workspace, "What does Jon play?").hits
    assert (hits[0].session_id, hits[0].seq) == (answer, 2)
    assert len(store.search(workspace, "Jon").hits) == 6  # a query of such words alone still finds them (newest first)
    assert store.select_recall(workspace, "Jon, how does it go?", 512).notes == ()  # but recalls none of them
