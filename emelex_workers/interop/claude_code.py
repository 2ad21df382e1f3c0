"""Claude Code session files: `~/.claude/projects/<encoded project path>/<session ID>.jsonl`, one JSON object a line.

Read: `user` and `assistant` lines (`message.content` a string or blocks: `text`, `tool_use` {id, name, input},
`tool_result` {tool_use_id, content, is_error}); `cwd` names the workspace, `timestamp` the time; `custom-title`,
`ai-title` and (in older files) `summary` records title the Session. A user line of text opens a turn; `isMeta` lines
(command echoes and caveats the tool adds) and `thinking` blocks are not what was said. Every other line type
(`file-history-snapshot`, `system`, ...; new ones appear as the tool evolves) is skipped and counted, never refused.
"""

from __future__ import annotations

from typing import Any

from emelex_memory import ImportedEvent

from .events import Conversion, block_text

FORMAT = "claude-code"
CONVERSATION_TYPES = frozenset({"user", "assistant"})
KNOWN_TYPES = CONVERSATION_TYPES | {"summary", "file-history-snapshot", "system", "queue-operation", "attachment"}
SUMMARY_RANK = 1
# Records that title a session, with the field holding the title and how far it is trusted: the user's /rename
# (`custom-title`) over the title Claude Code generates (`ai-title`, rewritten as the session goes on) over the
# `summary` records older versions wrote.
TITLES = {"custom-title": ("customTitle", 3), "ai-title": ("aiTitle", 2), "summary": ("summary", SUMMARY_RANK)}


def detect(obj: dict[str, Any]) -> bool:
    """True when a line looks like Claude Code's: any record of a session (a `type` and its `sessionId`; the
    bookkeeping types that lead most files come and go), or a known type with its session fields."""
    if isinstance(obj.get("type"), str) and isinstance(obj.get("sessionId"), str):
        return True
    return obj.get("type") in KNOWN_TYPES and any(k in obj for k in ("parentUuid", "leafUuid", "uuid", "messageId",
                                                                        "snapshot"))


def feed(conv: Conversion, obj: dict[str, Any], line: int) -> list[ImportedEvent] | None:
    """The events of one line (None: a line skipped)."""
    kind = obj.get("type")
    if kind in TITLES:
        field, rank = TITLES[kind]
        if rank == SUMMARY_RANK and conv.title_rank >= rank:
            return []  # of several summary records, the first titles the session
        conv.titled(obj.get(field), rank)
        return []
    if kind not in CONVERSATION_TYPES or obj.get("isMeta"):
        return None
    if conv.workspace is None and isinstance(obj.get("cwd"), str):
        conv.workspace = obj["cwd"]
    message = obj.get("message")
    if not isinstance(message, dict):
        return None
    at = conv.when(obj.get("timestamp"))
    content = message.get("content")
    blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
    extra = {"sidechain": True} if obj.get("isSidechain") else {}
    events: list[ImportedEvent] = []
    texts = [b for b in blocks if isinstance(b, dict) and b.get("type") in ("text", "image", "document")
             or isinstance(b, str)]
    text = block_text(texts)
    if text.strip():
        speaker = "assistant" if kind == "assistant" else "user"
        events.append(conv.event(speaker, {"text": conv.text(text), **extra}, at, line, new_turn=speaker == "user"))
    calls = []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
            name = str(block.get("name") or "tool")
            conv.tools[block["id"]] = name
            calls.append({"call_id": block["id"], "tool": name, "arguments": conv.value(block.get("input"))})
        elif block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
            call_id = block["tool_use_id"]
            output = block_text(block.get("content"))
            events.append(conv.event("tool_result", {
                "call_id": call_id, "tool": conv.tools.get(call_id, "tool"),
                "outcome": "error" if block.get("is_error") else "ok", "output": conv.text(output), **extra,
            }, at, line))
    if calls:
        events.append(conv.event("tool_calls", {"calls": calls, **extra}, at, line))
    return events or None
