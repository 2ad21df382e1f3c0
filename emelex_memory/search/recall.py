"""The recall selection: what a new Session starts with, and what a host records of it.

Pinned Knowledge comes first (newest first), then the hits of the search ranking for the query (Knowledge entries
and transcript turns of the workspace, in one ranking, `ranking.py`) that are relevant enough: a hit is relevant
when the words it holds carry at least `RELEVANCE` of the query's weight (the sum of its words' inverse document
frequencies in the workspace), so an unrelated first message, whose only matches are common words, recalls nothing
but the pinned entries. Each note is taken while it fits the token budget (one that does not fit is skipped for
smaller ones after it). Only live entries are read (no tombstone is ever selected), and an entry whose content is
itself JSON (an object or array: raw tool-call output a distillation stored as a fact) is never selected. A note
carries its date (a transcript turn's Session date; a Knowledge entry's source Session date, or the date its version
was written) and a turn its Session's title. The selection's `payload()` names the query words searched for and
each note, so a host that records it in the Session's transcript (the chat does, as a `context` event) can replay
exactly what its model saw, without selecting again; `source_turns` gives the turn of each Knowledge note's source,
read in the same read transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import apsw

from ..errors import InvalidInputError
from ..knowledge.service import ENTRY_COLUMNS, entry_from_row
from ..knowledge.values import KnowledgeEntry
from ..knowledge.versions import ENTRY_JOIN
from .query import query_terms

MAX_BUDGET_TOKENS = 1_000_000
MAX_CANDIDATES = 50  # pinned entries, and then relevant hits, read at most per selection
RELEVANCE = 0.2  # the share of the query's weight a hit's words must carry to be recalled
MAX_TURN_CHARS = 600  # a recalled transcript turn is cut to this many characters
TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """A model-independent token estimate: one token per 4 UTF-8 bytes, rounded up (at least 1)."""
    return max(1, -(-len(text.encode("utf-8")) // 4))


def note_text(key: str, content: str) -> str:
    """A Knowledge note's text without its date: `key: content`."""
    return f"{key}: {content}"


def note_line(note: dict[str, Any]) -> str:
    """How a recorded note is shown to a model and what it costs in the budget: a Knowledge note
    `[2023-05-07] key: content`, a transcript turn `[2023-05-07, Session "title"] user: text` (a note recorded
    without a date: `key: content`)."""
    date = note.get("date")
    if note.get("kind") == "session":
        where = f'[{date}, Session "{note["title"]}"]' if note.get("title") else f"[{date}]"
        return f"{where} {note['speaker']}: {note['content']}"
    text = note_text(note["key"], note["content"])
    return f"[{date}] {text}" if date else text


def looks_like_tool_json(content: str) -> bool:
    """True when `content` is a JSON object or array (or the cut-off start of one): tool-call output, not a fact."""
    text = content.strip()
    if not text.startswith(("{", "[")):
        return False
    try:
        return isinstance(json.loads(text), (dict, list))
    except (ValueError, RecursionError):
        return text.startswith(('{"', "[{", '["'))


@dataclass(frozen=True)
class RecallSelection:
    """The notes selected, in order (pinned first), the tokens they cost of the budget, the query words searched
    for (`terms`), and for each note the turn of its source's first event as stored (`source_turns`: None for a
    transcript note, a Knowledge note without a source, or one whose Session is gone).

    Each note is a dict, as `payload()` records it: a Knowledge note has
    "kind" "knowledge", "key", "version", "content", "confidence",
    "pinned", "date" and "source" (Session, seq range and digest, or None);
    a transcript note has "kind" "session", "session" (its ID), "seq",
    "turn", "speaker" (the event's kind), "title", "date" and "content" (the
    turn's text, cut to 600 characters). `note_line` is how each is shown.
    """

    notes: tuple[dict[str, Any], ...]
    tokens: int
    budget_tokens: int
    terms: tuple[str, ...] = ()
    source_turns: tuple[int | None, ...] = ()

    def payload(self) -> dict[str, Any]:
        """What a host records of the selection before its model's first round: the query words, the budget and the
        notes."""
        return recall_payload(list(self.terms), self.budget_tokens, self.notes)


def _source(entry: KnowledgeEntry) -> dict[str, Any] | None:
    s = entry.head.source
    if s is None:
        return None
    return {"session": s.session_id, "first_seq": s.first_seq, "last_seq": s.last_seq, "digest": s.digest}


def recall_payload(terms: list[str], budget_tokens: int, notes: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The payload of the recall event for `notes` selected for the query words `terms` within `budget_tokens`."""
    return {"terms": terms, "budget_tokens": budget_tokens, "notes": list(notes)}


def check_budget(budget_tokens: object) -> int:
    """`budget_tokens` if it is an integer in [1, 1,000,000], else `InvalidInputError`."""
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) \
            or not 1 <= budget_tokens <= MAX_BUDGET_TOKENS:
        raise InvalidInputError(f"a recall budget is 1 to {MAX_BUDGET_TOKENS} tokens, got {budget_tokens!r}")
    return budget_tokens


_PINNED_IDS = (
    "SELECT id FROM knowledge WHERE workspace_id = ? AND pinned = 1 AND tombstoned_at IS NULL "
    "ORDER BY updated_at DESC, id DESC LIMIT ?"
)
# Each entry's date: its source Session's creation, else its version's.
_ENTRY_DATES = (
    "SELECT k.id, coalesce(s.created_at, v.created_at) FROM knowledge k JOIN knowledge_versions v "
    "ON v.knowledge_id = k.id AND v.version = k.head_version LEFT JOIN sessions s ON s.id = v.source_session_id "
    "WHERE k.id IN (SELECT value FROM json_each(?))"
)
RankedHits = Callable[[apsw.Connection, int, list[str], int], list[tuple[Any, Any]]]


def _knowledge_notes(conn: apsw.Connection, ids: list[int], day: Callable[[float], str]) -> dict[int, dict]:
    """Knowledge id -> its note, for the live entries of `ids` that may be recalled (not JSON)."""
    rows = conn.execute(f"SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE k.id IN (SELECT value FROM json_each(?))",
                        (json.dumps(ids),))
    entries = {row[0]: entry_from_row(row) for row in rows}
    dates = dict(conn.execute(_ENTRY_DATES, (json.dumps(ids),)).fetchall())
    return {i: {"kind": "knowledge", "key": e.key, "version": e.head.version, "content": e.content,
                "confidence": e.confidence, "pinned": e.pinned, "date": day(dates[i]), "source": _source(e)}
            for i, e in entries.items() if e.content is not None and not looks_like_tool_json(e.content)}


def _turn_note(conn: apsw.Connection, event_id: int, hit: Any) -> dict:
    (body,) = conn.execute("SELECT body FROM event_search WHERE rowid = ?", (event_id,)).fetchone()
    text = body if len(body) <= MAX_TURN_CHARS else body[:MAX_TURN_CHARS - 1] + "…"
    return {"kind": "session", "session": hit.session_id, "seq": hit.seq, "turn": hit.turn,
            "speaker": hit.event_kind, "title": hit.session_title, "date": hit.session_date, "content": text}


def select_notes(
    conn: apsw.Connection,
    scope: int | None,
    query: str,
    budget_tokens: int,
    count_tokens: TokenCounter,
    ranked_hits: RankedHits,
    day: Callable[[float], str],
) -> RecallSelection:
    """Inside a read transaction: the selection for workspace `scope` (None: no known workspace, nothing to
    recall); `ranked_hits(conn, scope, terms, limit)` gives (ranked row, hit) pairs of both kinds, best first, and
    `day` a timestamp's date."""
    chosen: list[dict] = []
    used = 0
    try:
        terms = query_terms(query, cut=True)
    except InvalidInputError:
        terms = []  # a query without words: pinned notes only
    if scope is not None:
        pinned = [i for (i,) in conn.execute(_PINNED_IDS, (scope, MAX_CANDIDATES))]
        relevant = [(r, h) for r, h in ranked_hits(conn, scope, terms, MAX_CANDIDATES) if r.relevance >= RELEVANCE] \
            if terms else []
        entry_ids = pinned + [r.rowid for r, h in relevant if h.kind == "knowledge"]
        entries = _knowledge_notes(conn, entry_ids, day)
        candidates = [entries.get(i) for i in pinned]
        for r, hit in relevant:
            if hit.kind == "knowledge":
                candidates.append(entries.get(r.rowid) if r.rowid not in pinned else None)
            else:
                candidates.append(_turn_note(conn, r.rowid, hit))
        for note in candidates:
            if note is None:
                continue
            cost = count_tokens(note_line(note))
            if used + cost <= budget_tokens:
                chosen.append(note)
                used += cost
    return RecallSelection(tuple(chosen), used, budget_tokens, tuple(terms), _source_turns(conn, chosen))


_SOURCE_TURNS = (  # the turn of each source's first event, by the source's index: [[Session ID, first seq], ...]
    "SELECT j.key, e.turn FROM json_each(?) j JOIN sessions s ON s.uuid = j.value ->> 0 "
    "JOIN events e ON e.session_id = s.id AND e.seq = j.value ->> 1"
)


def _source_turns(conn: apsw.Connection, notes: list[dict]) -> tuple[int | None, ...]:
    """In the selection's read transaction, with one statement: the turn of each Knowledge note's source's first
    event as stored (None for a transcript note, a note without a source, or one whose Session is gone)."""
    sources = [(n["source"]["session"], n["source"]["first_seq"]) if n["kind"] == "knowledge" and n["source"]
               else None for n in notes]
    wanted = [[session, seq] for session, seq in filter(None, sources)]
    turns = dict(conn.execute(_SOURCE_TURNS, (json.dumps(wanted),))) if wanted else {}
    found, index = [], 0
    for source in sources:
        found.append(None if source is None else turns.get(index))
        index += source is not None
    return tuple(found)
