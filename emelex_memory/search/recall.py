"""The recall selection: which workspace Knowledge a new Session starts with, and the event that records it.

Pinned entries come first (newest first), then the entries most relevant to the query (the search ranking), each
taken while it fits the token budget (one that does not fit is skipped for smaller ones after it). Only live
entries are read (no tombstone is ever selected), and an entry whose content is itself JSON (an object or array:
raw tool-call output a distillation stored as a fact) is never selected. The event names the query words searched for and
each note's key, version, content, confidence and source, so a host that appends it to the Session's transcript can replay exactly what its
model saw, without selecting again.
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
from ..sessions.transcript import NewEvent
from .query import query_terms

RECALL_KIND = "recall"  # the event kind of a recorded selection
MAX_BUDGET_TOKENS = 1_000_000
MAX_CANDIDATES = 50  # pinned entries, and then relevant ones, read at most per selection
TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """A model-independent token estimate: one token per 4 UTF-8 bytes, rounded up (at least 1)."""
    return max(1, -(-len(text.encode("utf-8")) // 4))


def note_text(key: str, content: str) -> str:
    """What a note costs in the budget, and how a host may show it to its model: `key: content`."""
    return f"{key}: {content}"


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
    """The notes selected, in order (pinned first), the tokens they cost of the budget, and `event`: the
    `NewEvent` (kind "recall") to append to the Session before its model's first round, naming each note's key,
    version, content, confidence, whether it is pinned, its source (Session, seq range and digest, or None) and
    `said_at` (when its statement was said)."""

    notes: tuple[KnowledgeEntry, ...]
    tokens: int
    budget_tokens: int
    event: NewEvent


def _source(entry: KnowledgeEntry) -> dict[str, Any] | None:
    s = entry.head.source
    if s is None:
        return None
    return {"session": s.session_id, "first_seq": s.first_seq, "last_seq": s.last_seq, "digest": s.digest}


def recall_payload(terms: list[str], budget_tokens: int, notes: tuple[KnowledgeEntry, ...]) -> dict[str, Any]:
    """The payload of the recall event for `notes` selected for the query words `terms` within `budget_tokens`."""
    return {
        "terms": terms,
        "budget_tokens": budget_tokens,
        "notes": [{"key": e.key, "version": e.head.version, "content": e.content, "confidence": e.confidence,
                   "pinned": e.pinned, "source": _source(e), "said_at": e.head.said_at} for e in notes],
    }


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


def select_notes(
    conn: apsw.Connection,
    scope: int | None,
    query: str,
    budget_tokens: int,
    count_tokens: TokenCounter,
    ranked_ids: Callable[[apsw.Connection, int, list[str], int], list[int]],
) -> RecallSelection:
    """Inside a read transaction: the selection for workspace `scope` (None: no known workspace, nothing to
    recall); `ranked_ids(conn, scope, terms, limit)` gives the IDs of the live entries matching `terms`, best
    first."""
    chosen: list[KnowledgeEntry] = []
    used = 0
    try:
        terms = query_terms(query, cut=True)
    except InvalidInputError:
        terms = []  # a query without words: pinned notes only
    if scope is not None:
        candidates = [i for (i,) in conn.execute(_PINNED_IDS, (scope, MAX_CANDIDATES))]
        if terms:
            candidates += ranked_ids(conn, scope, terms, MAX_CANDIDATES)
        candidates = list(dict.fromkeys(candidates))
        rows = conn.execute(f"SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE k.id IN (SELECT value FROM json_each(?))",
                            (json.dumps(candidates),))
        entries = {row[0]: entry_from_row(row) for row in rows}
        for entry_id in candidates:
            entry = entries[entry_id]
            if entry.content is None or looks_like_tool_json(entry.content):
                continue
            cost = count_tokens(note_text(entry.key, entry.content))
            if used + cost <= budget_tokens:
                chosen.append(entry)
                used += cost
    notes = tuple(chosen)
    return RecallSelection(notes, used, budget_tokens,
                           NewEvent(RECALL_KIND, recall_payload(terms, budget_tokens, notes)))
