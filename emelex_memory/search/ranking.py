"""One ranked list over a workspace's live Knowledge and its Sessions' transcript events, with statistics of that
workspace alone.

FTS5's own `bm25()` weighs a word by how rare it is in the whole table, so an unrelated workspace changed every
ranking, and Knowledge and transcripts, ranked apart, could not be compared. Here the index finds the rows and this
module scores them (BM25) with statistics it counts in the searched workspace only (its newest `WINDOW` rows):

- **Statistics.** A word's document frequency is the number of the workspace's indexed rows (events and Knowledge
  entries together, one corpus) that hold it, counted by FTS5 within the workspace's newest `WINDOW` rows of each
  table (all of them in a smaller workspace); the number of documents is the rows of that window. No other
  workspace's rows are counted, so adding or removing one changes no ranking. Words are the index's tokens
  (stemmed as the index stems them).
- **Common words.** They need no list: a word most rows hold gets an inverse document frequency near zero, so "the"
  or "what" weigh little, while a word found in few rows weighs most. A word more than half of the workspace's
  Sessions hold (`widespread`) weighs nothing: the name of the person a conversation is with (a vocative), greeted
  in nearly every Session, is in few rows, yet tells no turn from another.
- **Candidates.** The rows holding the query's words are gathered rarest word first, newest rows first, at most
  `CANDIDATES` in all, so a query of common words costs a bounded read, whatever the workspace's size.
- **Scores.** Each candidate is scored by BM25 over its own text (re-tokenized by the index's tokenizer), with the
  average length of the candidates of its table and a weak length normalization (b 0.2: in a conversation a
  short turn holding one query word, "What a day.", is not thereby more relevant). A Knowledge entry's text is its
  key and content; its score is multiplied by 0.9 + 0.1 x confidence, and by 1.1 when pinned: favoured among
  equals, never enough to lift a weak match (common words only) over a strong one (rare words). An event also
  gains `HEAD` of how well its Session's title and date match the query ("what did we decide in May").
- **Relevance.** `Ranked.relevance` is the share of the query's weight (the sum of its words' inverse document
  frequencies) that a row's own words hold: the recall selection keeps a note only above a threshold.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

import apsw

EVENTS, KNOWLEDGE, HEADS = "event_search", "knowledge_search", "session_search"
COLUMNS = {EVENTS: "body", KNOWLEDGE: "{key content}", HEADS: "head"}
WINDOW = 4_096  # newest indexed rows of each table whose statistics a search counts
SPREAD_WINDOW = 1_024  # newest events in which a query word's spread over Sessions is counted (`widespread`)
CANDIDATES = 100  # rows scored at most per search
SNIPPET_TOKENS = 16
MARK_START, MARK_END, ELLIPSIS = "[", "]", "…"
K1, B = 1.2, 0.2  # b: a short turn holding one query word is not thereby more relevant than a longer one
HEAD = 0.5  # weight of a Session title and date match on its events' scores
PRIOR = 50  # documents holding none of the query's words assumed beyond the workspace's own (a small one's words
# would all look common)
TOKENIZER = ("porter", ["unicode61", "remove_diacritics", "2"])  # the index's tokenizer (schema m014)


@dataclass(frozen=True)
class Ranked:
    """One ranked row: `table` (event_search or knowledge_search), its rowid (events.id or knowledge.id), its
    `score` (higher is better, comparable across both tables) and `relevance` (0..1, see the module)."""

    table: str
    rowid: int
    score: float
    relevance: float


class Tokens:
    """The index's tokenizer, from Python: the distinct tokens of a query, and each row's token counts."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._tokenize = conn.fts5_tokenizer(*TOKENIZER)

    def __call__(self, text: str, *, query: bool = False) -> list[str]:
        """The tokens of `text`, in order (with repeats)."""
        reason = apsw.FTS5_TOKENIZE_QUERY if query else apsw.FTS5_TOKENIZE_DOCUMENT
        return self._tokenize(text.encode("utf-8"), reason, None, include_offsets=False, include_colocated=False)

    def snippet(self, text: str, wanted: set[str] | dict[str, str]) -> str:
        """An extract of `text` of at most `SNIPPET_TOKENS` tokens, where most of the `wanted` tokens are, each
        of them in [brackets], with "…" where text was left out (as FTS5's `snippet()` makes them)."""
        data = text.encode("utf-8")
        spans = self._tokenize(data, apsw.FTS5_TOKENIZE_DOCUMENT, None, include_offsets=True,
                               include_colocated=False)
        if not spans:
            return text[:100]
        hits = [token in wanted for _, _, token in spans]
        starts = range(max(1, len(spans) - SNIPPET_TOKENS + 1))
        first = max(starts, key=lambda i: (len({spans[k][2] for k in range(i, min(i + SNIPPET_TOKENS, len(spans)))
                                                 if hits[k]}), -i))
        last = min(first + SNIPPET_TOKENS, len(spans)) - 1
        begin = 0 if first == 0 else spans[first][0]
        end = len(data) if last == len(spans) - 1 else spans[last][1]
        out, at = [], begin
        for k in range(first, last + 1):
            start, stop, _ = spans[k]
            if hits[k]:
                out += [data[at:start].decode("utf-8", "replace"), MARK_START,
                        data[start:stop].decode("utf-8", "replace"), MARK_END]
                at = stop
        out.append(data[at:end].decode("utf-8", "replace"))
        return (ELLIPSIS if first else "") + "".join(out) + (ELLIPSIS if end < len(data) else "")


def _match(scope: int, table: str, word: str | None = None) -> str:
    """The MATCH expression of workspace `scope`'s rows of `table` (holding `word`, if given: letters and digits)."""
    ws = f'ws : "w{scope}"'
    return ws if word is None else f'{ws} AND {COLUMNS[table]} : "{word}"'


def _window(conn: apsw.Connection, scope: int, table: str) -> tuple[int, int]:
    """(rows, lowest rowid) of workspace `scope`'s newest `WINDOW` rows of `table`."""
    rows, low = conn.execute(
        f"SELECT count(*), min(rowid) FROM (SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid DESC "
        "LIMIT ?)", (_match(scope, table), WINDOW)).fetchone()
    return rows, low or 0


def _df(conn: apsw.Connection, scope: int, table: str, word: str, low: int) -> int:
    return conn.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH ? AND rowid >= ?",
                        (_match(scope, table, word), low)).fetchone()[0]


def idf(docs: int, df: int) -> float:
    """BM25's inverse document frequency of a word `df` of `docs` documents hold (never negative), with `PRIOR`
    documents more that do not hold it."""
    return math.log(1 + (docs + PRIOR - df + 0.5) / (df + 0.5))


class Statistics:
    """A query's words (token -> a word of the query that spells it) and their weights in workspace `scope`."""

    def __init__(self, conn: apsw.Connection, scope: int, words: list[str], tokens: Tokens) -> None:
        self.scope = scope
        self.words: dict[str, str] = {}
        for word in words:
            for token in tokens(word, query=True):
                self.words.setdefault(token, word)
        windows = {t: _window(conn, scope, t) for t in (EVENTS, KNOWLEDGE)}
        docs = sum(rows for rows, _ in windows.values())
        self.df = {token: sum(_df(conn, scope, t, word, windows[t][1]) for t in (EVENTS, KNOWLEDGE) if windows[t][0])
                   for token, word in self.words.items()}
        self.idf = {token: idf(docs, df) for token, df in self.df.items()}
        common = widespread(conn, scope, list(self.words.values()))  # they tell no row from another: no weight
        self.idf = {token: 0.0 if self.words[token] in common else weight for token, weight in self.idf.items()}
        heads, head_low = _window(conn, scope, HEADS)
        self.head_idf = {token: idf(heads, _df(conn, scope, HEADS, word, head_low)) if heads else 0.0
                         for token, word in self.words.items()}
        self.weight = sum(self.idf.values()) or 1.0

    def rarest_first(self) -> list[str]:
        """The query's tokens that some row holds, rarest first."""
        return sorted((t for t, df in self.df.items() if df), key=lambda t: (self.df[t], t))


def widespread(conn: apsw.Connection, scope: int, words: list[str]) -> set[str]:
    """Inside a read transaction: those of the query `words` (letters and digits) that more than half of workspace
    `scope`'s Sessions hold, counted in its newest `SPREAD_WINDOW` events, with one Session more assumed that holds
    none of them (so in a workspace of one Session no word is widespread).

    Such a word tells no turn from another: the name of the person a conversation is with, said in every Session's
    greeting, or a word every Session uses. An embedding of the query is drawn to the short turns that say it ("Wow
    Jon, same here!"), and full text would rank them above the turn that answers. The cost is bounded: one read of
    the window's Sessions, then at most `SPREAD_WINDOW` index entries per word."""
    window = conn.execute(f"SELECT rowid FROM {EVENTS} WHERE {EVENTS} MATCH ? ORDER BY rowid DESC LIMIT ?",
                          (_match(scope, EVENTS), SPREAD_WINDOW)).fetchall()
    if not window:
        return set()
    session_of = dict(conn.execute("SELECT id, session_id FROM events WHERE id IN (SELECT value FROM json_each(?))",
                                   (json.dumps([rowid for (rowid,) in window]),)))
    needed, low = (len(set(session_of.values())) + 1) / 2, window[-1][0]
    found = set()
    for word in words:
        rows = conn.execute(f"SELECT rowid FROM {EVENTS} WHERE {EVENTS} MATCH ? AND rowid >= ?",
                            (_match(scope, EVENTS, word), low))
        if len({session_of[rowid] for (rowid,) in rows}) > needed:
            found.add(word)
    return found


def _candidates(conn: apsw.Connection, stats: Statistics, tables: tuple[str, ...]) -> dict[str, list[int]]:
    """table -> rowids holding the query's words, rarest word first, newest first, at most `CANDIDATES` in all."""
    found: dict[str, dict[int, None]] = {t: {} for t in tables}
    total = 0
    for token in stats.rarest_first():
        for table in tables:
            if total >= CANDIDATES:
                break
            rows = conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid DESC LIMIT ?",
                                (_match(stats.scope, table, stats.words[token]), CANDIDATES - total))
            for (rowid,) in rows:
                if rowid not in found[table]:
                    found[table][rowid] = None
                    total += 1
    return {t: list(ids) for t, ids in found.items()}


def _bm25(stats: Statistics, counts: list[Counter]) -> list[tuple[float, float]]:
    """(score, the share of the query's weight the row holds) of each row's token `counts`."""
    if not counts:
        return []
    avg = sum(sum(c.values()) for c in counts) / len(counts) or 1.0
    scored = []
    for c in counts:
        norm = K1 * (1 - B + B * sum(c.values()) / avg)
        held = [t for t in stats.idf if c[t]]
        scored.append((sum(stats.idf[t] * c[t] * (K1 + 1) / (c[t] + norm) for t in held),
                       sum(stats.idf[t] for t in held) / stats.weight))
    return scored


def rank(conn: apsw.Connection, scope: int, words: list[str], tables: tuple[str, ...]) -> list[Ranked]:
    """Inside a read transaction: the rows of `tables` (some of event_search, knowledge_search) in workspace `scope`
    holding any of the query `words` (letters and digits only), best first (ties: newer first)."""
    tokens = Tokens(conn)
    stats = Statistics(conn, scope, words, tokens)
    found = _candidates(conn, stats, tables)
    ranked: list[Ranked] = []
    if found.get(KNOWLEDGE):
        rows = conn.execute(  # the index's own content table: a lookup by rowid (a MATCH table's rowid IN is a scan)
            "SELECT f.id, f.c1 || ' ' || f.c2, k.pinned, v.confidence FROM knowledge_search_content f "
            "JOIN knowledge k ON k.id = f.id JOIN knowledge_versions v ON v.knowledge_id = k.id "
            "AND v.version = k.head_version WHERE f.id IN (SELECT value FROM json_each(?))",
            (json.dumps(found[KNOWLEDGE]),)).fetchall()
        scores = _bm25(stats, [Counter(tokens(text)) for _, text, _, _ in rows])
        for (rowid, _, pinned, confidence), (score, held) in zip(rows, scores):
            ranked.append(Ranked(KNOWLEDGE, rowid, score * (0.9 + 0.1 * confidence) * (1.1 if pinned else 1.0), held))
    if found.get(EVENTS):
        ranked += _rank_events(conn, stats, tokens, found[EVENTS])
    ranked.sort(key=lambda r: (-r.score, -r.rowid))
    return ranked


def _rank_events(conn: apsw.Connection, stats: Statistics, tokens: Tokens, ids: list[int]) -> list[Ranked]:
    rows = conn.execute(
        "SELECT f.id, f.c1, e.session_id FROM event_search_content f JOIN events e ON e.id = f.id "
        "WHERE f.id IN (SELECT value FROM json_each(?))", (json.dumps(ids),)).fetchall()
    scores = _bm25(stats, [Counter(tokens(body)) for _, body, _ in rows])
    heads = _head_scores(conn, stats, tokens, {session for _, _, session in rows})
    return [Ranked(EVENTS, rowid, score + HEAD * heads.get(session, 0.0), held)
            for (rowid, _, session), (score, held) in zip(rows, scores)]


def _head_scores(conn: apsw.Connection, stats: Statistics, tokens: Tokens, sessions: set[int]) -> dict[int, float]:
    """Session id -> the summed weight of the query's words its title and date hold."""
    if not any(stats.head_idf.values()):
        return {}
    rows = conn.execute("SELECT id, c1 FROM session_search_content WHERE id IN (SELECT value FROM json_each(?))",
                        (json.dumps(sorted(sessions)),))
    return {rowid: sum(stats.head_idf[t] for t in set(tokens(head)) if t in stats.head_idf) for rowid, head in rows}
