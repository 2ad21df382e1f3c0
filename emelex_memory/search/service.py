"""`MemoryStore.search`: ranked full-text hits in a workspace's live Knowledge and Session transcripts.

The index (schema step m014_search_index) is written by triggers in the same transaction as what it indexes, so a
search never sees a row the store no longer holds: a tombstoned entry, a replaced version or a deleted Session is
not found. Knowledge is ranked by BM25 (a key match weighs twice a content match), favouring pinned entries (twice
the score) and higher confidence (score times 0.5 + confidence); transcript events by BM25. Raw events a Summary
replaced stay indexed while they are stored (as `sessions show --raw` shows them) and are marked with the seq of
the Summary covering them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import apsw

from ..core.database import Database
from ..core.paging import Items, Page, take
from ..errors import InvalidInputError
from ..sessions.workspaces import WorkspaceLike, workspace_scope
from .query import match_expression, query_terms
from .recall import RecallSelection, TokenCounter, check_budget, estimate_tokens, select_notes

KNOWLEDGE, SESSIONS = "knowledge", "sessions"
KINDS = (KNOWLEDGE, SESSIONS)
HIT_OVERHEAD = 256  # byte estimate of a hit's citation on top of its snippet
SNIPPET_TOKENS = 16
MARK_START, MARK_END, ELLIPSIS = "[", "]", "…"

# Knowledge ranking: BM25 with a key match weighing twice a content match, pinned entries twice the score, higher
# confidence more (BM25 is negative: lower is better). A page is ranked first, without snippets (SQLite would compute
# a snippet for every match before sorting them), and only the page's rows get one.
_KNOWLEDGE_RANKED = (
    "SELECT k.id, k.key, k.head_version, k.pinned, v.confidence, "
    "bm25(knowledge_search, 0.0, 2.0, 1.0) * (1 + k.pinned) * (0.5 + v.confidence) AS score "
    "FROM knowledge_search f JOIN knowledge k ON k.id = f.rowid "
    "JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version = k.head_version "
    "WHERE knowledge_search MATCH ? ORDER BY score, k.id LIMIT ? OFFSET ?"
)
_EVENTS_RANKED = (
    "SELECT rowid, bm25(event_search, 0.0, 1.0) AS score FROM event_search WHERE event_search MATCH ? "
    "ORDER BY score, rowid LIMIT ? OFFSET ?"
)
_SNIPPETS = (
    "SELECT rowid, snippet({table}, {column}, '" + MARK_START + "', '" + MARK_END + "', '" + ELLIPSIS + "', "
    f"{SNIPPET_TOKENS}) FROM {{table}} WHERE {{table}} MATCH ? AND rowid IN (SELECT value FROM json_each(?))"
)
# Each hit's event with the newest raw seq it covers if it is a Summary, and the seq of the Summary in effect covering
# it if it is a raw event (the oldest such).
_EVENT_ROWS = (
    "SELECT e.id, s.uuid, e.seq, e.turn, e.kind, "
    "(SELECT through_seq FROM summaries WHERE event_id = e.id), "
    "(SELECT c.seq FROM summaries m JOIN events c ON c.id = m.event_id WHERE m.session_id = e.session_id "
    "AND m.through_seq >= e.seq AND m.reverted_at IS NULL AND c.seq > e.seq ORDER BY m.through_seq LIMIT 1) "
    "FROM events e JOIN sessions s ON s.id = e.session_id WHERE e.id IN (SELECT value FROM json_each(?))"
)


@dataclass(frozen=True)
class KnowledgeHit:
    """A live Knowledge entry that matched: cite it as `key` at `version` (`knowledge show KEY`).

    `snippet` is a short extract of its content with the matched words in
    [brackets]; `score` is its rank (lower is better, comparable only within
    one search's Knowledge hits).
    """

    key: str
    version: int
    pinned: bool
    confidence: float
    snippet: str
    score: float
    kind: str = KNOWLEDGE


@dataclass(frozen=True)
class SessionHit:
    """A transcript event that matched: cite it as Session `session_id`, seqs `first_seq`..`last_seq`, `turn`.

    For an ordinary event both seqs are its own (`seq`); a Summary
    (`event_kind` "summary") cites the raw range 1..through-seq it replaces.
    `covered_by` is the seq of the Summary in effect that replaced this raw
    event (replay shows that Summary instead; `sessions show --raw` shows the
    event), None when none did. `snippet` and `score` as for `KnowledgeHit`.
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
    kind: str = SESSIONS


@dataclass(frozen=True)
class SearchPage(Page[KnowledgeHit | SessionHit]):
    """A page of hits, best first: Knowledge hits, then transcript hits. `hits` is the same list as `items`."""

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


def _decode_cursor(cursor: object, kinds: tuple[str, ...]) -> tuple[int, int]:
    """(index into `kinds`, offset within that kind's ranking) of a cursor from a previous page."""
    if cursor is None:
        return 0, 0
    if isinstance(cursor, str):
        kind, _, offset = cursor.partition(":")
        if kind in kinds and offset.isdigit() and len(offset) <= 9 and offset.isascii():
            return kinds.index(kind), int(offset)
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
    ) -> SearchPage:
        """Search the workspace's live Knowledge and/or its Sessions' transcripts for any word of `query`.

        A page holds at most `limit` hits whose snippets (plus 256 bytes of
        citation each) add up to at most `max_bytes`, best first: every
        Knowledge hit in rank order before any transcript hit. `kinds` is
        "knowledge", "sessions" or both. Pass `next_cursor` back for the next
        page (a cursor is a position in the ranking: writes in between may
        shift what it continues with). A directory that is no known workspace
        has no hits.

        The query is cut into words (letters and digits), each searched for as
        a word of its own; FTS5 operators, quotes and NUL are only separators.
        Raises `InvalidInputError` for a query that is not text, not valid
        UTF-8, longer than 4096 bytes or without any word, and for bad limits,
        kinds or cursor; nothing is written either way.
        """
        kinds = _check_kinds(kinds)
        terms = query_terms(query)
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=HIT_OVERHEAD * 4)
        phase, offset = _decode_cursor(cursor, kinds)
        with self._db.read() as conn:
            scope = workspace_scope(conn, workspace)
            if scope is None:
                return SearchPage([], None)
            hits: list[KnowledgeHit | SessionHit] = []
            while phase < len(kinds) and len(hits) < limit:
                kind = kinds[phase]
                want = limit - len(hits)
                found = (self._knowledge if kind == KNOWLEDGE else self._events)(conn, scope, terms, want + 1, offset)
                budget = max_bytes - sum(map(_hit_size, hits))
                taken, more = take(found, want, budget, _hit_size, lambda h: True, at_least_one=not hits)
                hits.extend(taken)
                if more:  # this kind has more hits than the page took
                    return SearchPage(hits, f"{kind}:{offset + len(taken)}")
                phase, offset = phase + 1, 0
        return SearchPage(hits, f"{kinds[phase]}:0" if phase < len(kinds) else None)

    def select_recall(
        self,
        workspace: WorkspaceLike,
        query: str,
        budget_tokens: int,
        *,
        count_tokens: TokenCounter | None = None,
    ) -> RecallSelection:
        """Select the workspace Knowledge a new Session starts with: pinned entries first, then those most relevant
        to `query` (e.g. the first user message), within `budget_tokens`; see `search/recall.py`.

        Returns the notes and the "recall" event to append before the model's
        first round (replay it on resume; never select again). A note costs
        `count_tokens("key: content")` tokens (default: one per 4 UTF-8
        bytes). Tombstones and entries whose content is a JSON object or array
        are never selected; a query without words (or longer than 4096 bytes:
        its start is read) still gets the pinned notes. Raises
        `InvalidInputError` for a budget outside 1..1,000,000 or a query that is
        not text; writes nothing.
        """
        budget_tokens = check_budget(budget_tokens)
        if not isinstance(query, str):
            raise InvalidInputError(f"a recall query is text, not {type(query).__name__}")
        with self._db.read() as conn:
            scope = workspace_scope(conn, workspace)
            return select_notes(conn, scope, query, budget_tokens, count_tokens or estimate_tokens, _ranked_ids)

    @staticmethod
    def _knowledge(conn: apsw.Connection, scope: int, terms: list[str], limit: int, offset: int) -> list[KnowledgeHit]:
        match = match_expression(scope, "{key content}", terms)
        rows = conn.execute(_KNOWLEDGE_RANKED, (match, limit, offset)).fetchall()
        snippets = _snippets(conn, "knowledge_search", 2, match, [row[0] for row in rows])
        return [KnowledgeHit(key, version, bool(pinned), confidence, snippets[entry_id], score)
                for entry_id, key, version, pinned, confidence, score in rows]

    @staticmethod
    def _events(conn: apsw.Connection, scope: int, terms: list[str], limit: int, offset: int) -> list[SessionHit]:
        match = match_expression(scope, "body", terms)
        ranked = conn.execute(_EVENTS_RANKED, (match, limit, offset)).fetchall()
        ids = json.dumps([event_id for event_id, _ in ranked])
        events = {row[0]: row for row in conn.execute(_EVENT_ROWS, (ids,))}
        snippets = _snippets(conn, "event_search", 1, match, [event_id for event_id, _ in ranked])
        hits = []
        for event_id, score in ranked:
            _, uuid, seq, turn, kind, through, covered_by = events[event_id]
            first, last = (1, through) if kind == "summary" and through is not None else (seq, seq)
            hits.append(SessionHit(uuid, seq, first, last, turn, kind, covered_by, snippets[event_id], score))
        return hits


def _ranked_ids(conn: apsw.Connection, scope: int, terms: list[str], limit: int) -> list[int]:
    """The IDs of workspace `scope`'s live entries matching any of `terms`, best first, at most `limit`."""
    rows = conn.execute(_KNOWLEDGE_RANKED, (match_expression(scope, "{key content}", terms), limit, 0))
    return [row[0] for row in rows]


def _snippets(conn: apsw.Connection, table: str, column: int, match: str, rowids: list[int]) -> dict[int, str]:
    """rowid -> the snippet of `column` of `table`'s rows `rowids` for the MATCH expression `match`."""
    if not rowids:
        return {}
    sql = _SNIPPETS.format(table=table, column=column)
    return dict(conn.execute(sql, (match, json.dumps(rowids))).fetchall())
