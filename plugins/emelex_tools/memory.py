"""The built-in "recall" plugin: the agent's memory tools, `recall` (no approval) and `remember` (every call
approved by the user).

`recall` searches this workspace's live Knowledge and its other Sessions' transcripts (`MemoryStore.search`) and
returns at most `RECALL_HITS` hits in at most `RECALL_BYTES`, each with its citation: a Knowledge key and version, or
a Session ID prefix, seq and turn. The calling Session's own events are left out (the model has them already).

`remember` writes one Knowledge entry (`MemoryStore.remember`) whose provenance is the calling agent turn: the
Session's events from the turn's user input through the last one recorded (`ToolInvocation.session_id` and
`turn_seq`). The content passes the checks distillation applies to every candidate (`guard_candidates`: a confidence
in [0, 1], a valid key and content, no JSON or machinery text, at least two content words, supported by the turn's
events), and, as distillation, it never changes a pinned entry; a refusal is a typed error (`InvalidKnowledgeError`,
`KnowledgePinnedError`) that the model reads as the call's error output, and nothing is written.
"""

from __future__ import annotations

from emelex_memory import (
    EmelexError,
    Event,
    InvalidKnowledgeError,
    KnowledgeCandidate,
    KnowledgeHit,
    KnowledgeNotFoundError,
    KnowledgePinnedError,
    KnowledgeVersion,
    MemoryStore,
)
from emelex_workers.faithfulness import guard_candidates
from emelex_workers.hookspecs import hookimpl
from emelex_workers.plugin_api import ToolInvocation, ToolOutput, ToolSpec

NAME = "recall"
RECALL_HITS = 8  # hits one recall call returns at most
RECALL_BYTES = 8192  # and their snippets and citations at most these bytes
PREFIX = 8  # characters of a Session ID a citation shows (the other commands accept such a prefix)
MAX_KEY_CHARS = 200
MAX_CONTENT_CHARS = 1000
REFUSALS = {
    "confidence": "its confidence is not a number from 0 to 1",
    "invalid": "its key or content is not valid Knowledge (empty, too long or with control characters)",
    "machinery": "its content is tool-call JSON or machinery text, not a fact in words",
    "vacuous": "its content has fewer than two content words",
    "example": "its content matches a worked example",
    "unsupported": "this turn's conversation and tool results do not support its content",
}


# the verbs a request that asks to remember begins a clause with (`ToolSpec.requested_by`)
REMEMBER_WORDS = frozenset({"remember", "note", "memorize", "record", "save", "keep"})


def hit_line(hit) -> str:
    """One hit as the recall tool shows it: its citation and date, then its snippet."""
    if isinstance(hit, KnowledgeHit):
        pinned = ", pinned" if hit.pinned else ""
        return f"knowledge {hit.key} (version {hit.version}{pinned}, {hit.date}): {hit.snippet}"
    return (f"session {hit.session_id[:PREFIX]} seq {hit.seq} turn {hit.turn} ({hit.event_kind}, "
            f"{hit.session_date}): {hit.snippet}")


def search_memory(store: MemoryStore, workspace, query: str, *, session_id: str | None = None) -> str:
    """The recall tool's text for `query` in `workspace`: one line per hit, best first (Knowledge and transcripts in
    one ranking), leaving out Session `session_id`'s own events; raises `InvalidInputError` for a query without a
    word."""
    page = store.search(workspace, query, limit=RECALL_HITS, max_bytes=RECALL_BYTES)
    hits = [h for h in page.hits if isinstance(h, KnowledgeHit) or h.session_id != session_id]
    if not hits:
        return f"nothing in this workspace's memory matches {query!r}"
    return "\n".join(hit_line(h) for h in hits)


def turn_events(store: MemoryStore, session_id: str, first_seq: int) -> list[Event]:
    """The Session's events from seq `first_seq` through its last one, oldest first."""
    events: list[Event] = []
    after, done = first_seq - 1, False
    while not done:
        page = store.replay(session_id, after)
        events.extend(page.events)
        after, done = page.next_cursor, page.done or not page.events
    return events


def remember_in_turn(store: MemoryStore, workspace, session_id: str, turn_seq: int, key: str, content: str,
                     confidence: float = 1.0) -> KnowledgeVersion:
    """Write Knowledge `key` = `content` in `workspace` with the agent turn that began at seq `turn_seq` of Session
    `session_id` as its provenance (that seq through the Session's last one); return the version written (the
    current one when nothing changed).

    Raises `InvalidKnowledgeError` naming the reason when distillation's
    guard (`guard_candidates` against the turn's events) would drop the
    candidate, and `KnowledgePinnedError` when the entry is pinned; nothing is
    written then.
    """
    events = turn_events(store, session_id, turn_seq)
    candidate = KnowledgeCandidate(key, content, confidence)
    guarded = guard_candidates([candidate], events=events)
    if not guarded.candidates:
        reason = next(r[len("rejected_"):] for r, n in guarded.rejected.items() if n)
        raise InvalidKnowledgeError(
            f"not remembered: {REFUSALS[reason]}; remember a fact this turn established, stated in words"
        )
    try:
        pinned = store.get_knowledge(workspace, key).pinned
    except KnowledgeNotFoundError:
        pinned = False
    if pinned:
        raise KnowledgePinnedError(f"Knowledge {key!r} is pinned; the user changes it, with "
                                   "`emelex memory knowledge remember` after `knowledge unpin`")
    source = store.knowledge_source(session_id, turn_seq, events[-1].seq)
    return store.remember(workspace, key, content, confidence=confidence, source=source)


def _session_of(invocation: ToolInvocation) -> str | None:
    """Why `invocation` cannot use the memory tools (no store, or no Session turn), or None."""
    if invocation.store is None or invocation.session_id is None or invocation.turn_seq is None:
        return f"the {invocation.tool} tool needs a durable agent Session (a store and the calling turn)"
    return None


def run_recall(invocation: ToolInvocation) -> ToolOutput:
    """The recall tool: `search_memory` for the "query" argument; a refused query is an error output."""
    if problem := _session_of(invocation):
        return ToolOutput(problem, is_error=True)
    try:
        return ToolOutput(search_memory(invocation.store, invocation.workspace, invocation.arguments["query"],
                                        session_id=invocation.session_id))
    except EmelexError as exc:
        return ToolOutput(str(exc), is_error=True)


def run_remember(invocation: ToolInvocation) -> ToolOutput:
    """The remember tool: `remember_in_turn` for the "key", "content" and optional "confidence" arguments; a
    refusal is an error output naming its reason."""
    if problem := _session_of(invocation):
        return ToolOutput(problem, is_error=True)
    args = invocation.arguments
    try:
        version = remember_in_turn(invocation.store, invocation.workspace, invocation.session_id,
                                   invocation.turn_seq, args["key"], args["content"], args.get("confidence", 1.0))
    except EmelexError as exc:
        return ToolOutput(str(exc), is_error=True)
    return ToolOutput(f"remembered {version.key} (version {version.version})")


def _object(required: list[str], **properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def tool_specs() -> list[ToolSpec]:
    """The two memory tools."""
    return [
        ToolSpec("recall", "Search this workspace's memory: Knowledge notes and earlier Sessions' conversations. "
                 "Returns cited matches.", _object(["query"], query={"type": "string", "minLength": 1,
                                                                      "maxLength": 200}),
                 run_recall, approval="never"),
        ToolSpec("remember", "Save one fact this conversation established as a Knowledge note for later Sessions "
                 "(a short key, the fact in words).",
                 _object(["key", "content"], key={"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS},
                         content={"type": "string", "minLength": 1, "maxLength": MAX_CONTENT_CHARS},
                         confidence={"type": "number"}),
                 run_remember, approval="always", requested_by=REMEMBER_WORDS),
    ]


@hookimpl
def register_tools(register) -> None:
    """Register recall and remember."""
    for spec in tool_specs():
        register(spec)
