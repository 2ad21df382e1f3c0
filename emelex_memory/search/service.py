"""`MemoryStore.search`: one ranked list of hits in a workspace's live Knowledge and Session transcripts.

The index (schema steps m014_search_index, m018_search_sessions) is written by triggers in the same transaction as
what it indexes, so a search never sees a row the store no longer holds: a tombstoned entry, a replaced version or
a deleted Session is not found. The ranking is `ranking.py`'s: BM25 with statistics of the searched workspace
alone, Knowledge and transcript events in one list. Raw events a Summary replaced stay indexed while they are
stored (as `sessions show --raw` shows them) and are marked with the seq of the Summary covering them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apsw

from ..core.database import Database, read_in_snapshot
from ..core.paging import Items, Page, take
from ..errors import InvalidInputError
from ..sessions.workspaces import WorkspaceLike, workspace_scope
from .query import query_terms
from .ranking import EVENTS, KNOWLEDGE as KNOWLEDGE_TABLE, Ranked, Tokens, rank
from .vectors import check_model, fuse, nearest, unit_vector
from .recall import RecallSelection, TokenCounter, check_budget, estimate_tokens, select_notes

KNOWLEDGE, SESSIONS = "knowledge", "sessions"
KINDS = (KNOWLEDGE, SESSIONS)
TABLES = {KNOWLEDGE: KNOWLEDGE_TABLE, SESSIONS: EVENTS}
HIT_OVERHEAD = 256  # byte estimate of a hit's citation on top of its snippet

# A hit's text from the index's own content tables (a lookup by rowid; a MATCH table's `rowid IN` is a scan).
_KNOWLEDGE_TEXTS = "SELECT id, c2 FROM knowledge_search_content WHERE id IN (SELECT value FROM json_each(?))"
_EVENT_TEXTS = "SELECT id, c1 FROM event_search_content WHERE id IN (SELECT value FROM json_each(?))"
_KNOWLEDGE_ROWS = (
    "SELECT k.id, k.key, k.head_version, k.pinned, v.confidence, v.created_at FROM knowledge k "
    "JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version = k.head_version "
    "WHERE k.id IN (SELECT value FROM json_each(?))"
)
# Each hit's event with its Session's title and creation time, the newest raw seq it covers if it is a Summary, and
# the seq of the Summary in effect covering it if it is a raw event (the oldest such).
_EVENT_ROWS = (
    "SELECT e.id, s.uuid, e.seq, e.turn, e.kind, s.title, s.created_at, "
    "(SELECT through_seq FROM summaries WHERE event_id = e.id), "
    "(SELECT c.seq FROM summaries m JOIN events c ON c.id = m.event_id WHERE m.session_id = e.session_id "
    "AND m.through_seq >= e.seq AND m.reverted_at IS NULL AND c.seq > e.seq ORDER BY m.through_seq LIMIT 1) "
    "FROM events e JOIN sessions s ON s.id = e.session_id WHERE e.id IN (SELECT value FROM json_each(?))"
)


def day(timestamp: float) -> str:
    """The UTC date of a store timestamp, as the index spells it: "2023-05-07"."""
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).date().isoformat()


@dataclass(frozen=True)
class KnowledgeHit:
    """A live Knowledge entry that matched: cite it as `key` at `version` (`knowledge show KEY`).

    `snippet` is a short extract of its key and content with the matched
    words in [brackets]; `score` is its rank (higher is better, comparable
    with every hit of the same search); `relevance` the share of the query's
    weight its words hold (0..1); `date` the UTC date its version was written.
    """

    key: str
    version: int
    pinned: bool
    confidence: float
    snippet: str
    score: float
    relevance: float = 0.0
    date: str = ""
    kind: str = KNOWLEDGE


@dataclass(frozen=True)
class SessionHit:
    """A transcript event that matched: cite it as Session `session_id`, seqs `first_seq`..`last_seq`, `turn`.

    For an ordinary event both seqs are its own (`seq`); a Summary
    (`event_kind` "summary") cites the raw range 1..through-seq it replaces.
    `covered_by` is the seq of the Summary in effect that replaced this raw
    event (replay shows that Summary instead; `sessions show --raw` shows the
    event), None when none did. `session_title` and `session_date` (UTC,
    "2023-05-07") are its Session's. `snippet`, `score` and `relevance` as for
    `KnowledgeHit`.
    """

    session_id: str
    seq: int
    first_seq: int
    last_seq: int
    turn: int
    event_kind: str
    covered_by: int | None
    snippet: str
    score: float
    relevance: float = 0.0
    session_title: str | None = None
    session_date: str = ""
    kind: str = SESSIONS


@dataclass(frozen=True)
class SearchPage(Page[KnowledgeHit | SessionHit]):
    """A page of hits, best first, Knowledge and transcript hits in one ranking. `hits` is the same list as
    `items`."""

    hits = Items[KnowledgeHit | SessionHit]()


def _check_kinds(kinds: object) -> tuple[str, ...]:
    if isinstance(kinds, str):
        kinds = (kinds,)
    if not isinstance(kinds, Iterable):
        raise InvalidInputError(f"kinds must be some of {KINDS}, got {kinds!r}")
    chosen = tuple(k for k in KINDS if k in set(kinds))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not chosen:
        raise InvalidInputError(f"kinds must be one or more of {', '.join(KINDS)}, got {list(kinds)!r}")
    return chosen


def _decode_cursor(cursor: object) -> int:
    """The offset in the ranking of a cursor from a previous page."""
    if cursor is None:
        return 0
    if isinstance(cursor, str) and cursor.startswith("rank:"):
        offset = cursor[len("rank:"):]
        if offset.isdigit() and offset.isascii() and len(offset) <= 9:
            return int(offset)
    raise InvalidInputError("the search cursor is not one a previous page of this search returned; start over")


def _hit_size(hit: KnowledgeHit | SessionHit) -> int:
    return len(hit.snippet.encode("utf-8")) + HIT_OVERHEAD


class Search:
    """`MemoryStore.search` over the store's full-text index."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    def search(
        self,
        workspace: WorkspaceLike,
        query: str,
        *,
        kinds: Iterable[str] = KINDS,
        limit: int | None = None,
        max_bytes: int | None = None,
        cursor: str | None = None,
        query_vector: Sequence[float] | None = None,
        embedding_model: str | None = None,
    ) -> SearchPage:
        """Search the workspace's live Knowledge and/or its Sessions' transcripts for any word of `query`.

        A page holds at most `limit` hits whose snippets (plus 256 bytes of
        citation each) add up to at most `max_bytes`, best first, Knowledge
        and transcript hits in one ranking (see `search/ranking.py`: BM25 with
        this workspace's statistics alone). `kinds` is "knowledge", "sessions"
        or both. Pass `next_cursor` back for the next page (a cursor is a
        position in the ranking: writes in between may shift what it continues
        with). A directory that is no known workspace has no hits.

        The query is cut into words (letters and digits), each searched for as
        a word of its own; FTS5 operators, quotes and NUL are only separators.
        With `query_vector` (the query embedded by the embedder whose model
        is `embedding_model`), the rows whose stored vectors are most similar
        are fused with the full-text ranking (`search/vectors.py`); rows not
        embedded yet are found by full text alone.

        Raises `InvalidInputError` for a query that is not text, not valid
        UTF-8, longer than 4096 bytes or without any word, for bad limits,
        kinds or cursor, and for a vector without its model or not 1..16,384
        finite numbers; nothing is written either way.
        """
        kinds = _check_kinds(kinds)
        terms = query_terms(query)
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=HIT_OVERHEAD * 4)
        offset = _decode_cursor(cursor)
        unit = None
        if query_vector is not None or embedding_model is not None:
            if query_vector is None:
                raise InvalidInputError("an embedding model was given without the query's vector")
            check_model(embedding_model)
            unit = unit_vector(query_vector)
        with self._db.read() as conn:
            scope = workspace_scope(conn, workspace)
            if scope is None:
                return SearchPage([], None)
            tables = tuple(TABLES[k] for k in kinds)
            ranked = rank(conn, scope, terms, tables)
            if unit is not None:
                ranked = fuse(ranked, nearest(conn, scope, embedding_model, unit, tables))
            hits = hits_of(conn, scope, terms, ranked[offset:offset + limit + 1])
        taken, more = take(hits, limit, max_bytes, _hit_size, lambda h: True, at_least_one=True)
        return SearchPage(taken, f"rank:{offset + len(taken)}" if more else None)

    def select_recall(
        self,
        workspace: WorkspaceLike,
        query: str,
        budget_tokens: int,
        *,
        count_tokens: TokenCounter | None = None,
    ) -> RecallSelection:
        """Select what a new Session starts with: pinned Knowledge first, then the Knowledge entries and transcript
        turns relevant to `query` (e.g. the first user message), best first, within `budget_tokens`; see
        `search/recall.py`.

        Returns the notes with the turn of each Knowledge note's source, read
        in one read transaction; record `payload()` before the model's first
        round (replay it on resume; never select again). A note costs
        `count_tokens(note_text)` tokens (default: one per 4 UTF-8 bytes).
        Tombstones and entries whose content is a JSON object or array are
        never selected; a query without words (or unrelated to anything: no
        note relevant enough) gets the pinned notes only; a query longer than
        4096 bytes is read from its start. Raises `InvalidInputError` for a
        budget outside 1..1,000,000 or a query that is not text; writes nothing.
        """
        budget_tokens = check_budget(budget_tokens)
        if not isinstance(query, str):
            raise InvalidInputError(f"a recall query is text, not {type(query).__name__}")
        with self._db.read() as conn:
            return read_in_snapshot(conn, _select_recall, workspace, query, budget_tokens, count_tokens or estimate_tokens)


def _select_recall(
    conn: apsw.Connection, workspace: WorkspaceLike, query: str, budget_tokens: int, count_tokens: TokenCounter
) -> RecallSelection:
    """`select_recall` inside its read transaction."""
    return select_notes(conn, workspace_scope(conn, workspace), query, budget_tokens, count_tokens, _ranked_hits, day)


def hits_of(conn: apsw.Connection, scope: int, terms: list[str], ranked: list[Ranked]) -> list[KnowledgeHit | SessionHit]:
    """The hits of `ranked` rows (in order) with their citations and snippets of the query `terms`."""
    by_table: dict[str, list[int]] = {}
    for r in ranked:
        by_table.setdefault(r.table, []).append(r.rowid)
    built: dict[tuple[str, int], KnowledgeHit | SessionHit] = {}
    scores = {(r.table, r.rowid): r for r in ranked}
    tokens = Tokens(conn)
    wanted = {token for term in terms for token in tokens(term, query=True)}
    if by_table.get(KNOWLEDGE_TABLE):
        ids = json.dumps(by_table[KNOWLEDGE_TABLE])
        texts = dict(conn.execute(_KNOWLEDGE_TEXTS, (ids,)).fetchall())
        for entry_id, key, version, pinned, confidence, created in conn.execute(_KNOWLEDGE_ROWS, (ids,)):
            r = scores[(KNOWLEDGE_TABLE, entry_id)]
            built[(KNOWLEDGE_TABLE, entry_id)] = KnowledgeHit(
                key, version, bool(pinned), confidence, tokens.snippet(texts[entry_id], wanted), r.score, r.relevance,
                day(created))
    if by_table.get(EVENTS):
        ids = json.dumps(by_table[EVENTS])
        texts = dict(conn.execute(_EVENT_TEXTS, (ids,)).fetchall())
        for event_id, uuid, seq, turn, kind, title, created, through, covered_by in conn.execute(_EVENT_ROWS, (ids,)):
            first, last = (1, through) if kind == "summary" and through is not None else (seq, seq)
            r = scores[(EVENTS, event_id)]
            built[(EVENTS, event_id)] = SessionHit(uuid, seq, first, last, turn, kind, covered_by,
                                                   tokens.snippet(texts[event_id], wanted), r.score, r.relevance,
                                                   title, day(created))
    return [built[(r.table, r.rowid)] for r in ranked]


def _ranked_hits(conn: apsw.Connection, scope: int, terms: list[str], limit: int) -> list[tuple[Ranked, KnowledgeHit | SessionHit]]:
    """The best `limit` rows of both kinds in workspace `scope` for the query `terms`, each with its hit."""
    ranked = rank(conn, scope, terms, (KNOWLEDGE_TABLE, EVENTS))[:limit]
    return list(zip(ranked, hits_of(conn, scope, terms, ranked)))
