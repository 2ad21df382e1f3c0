"""Codex CLI rollout files: `~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<ID>.jsonl`, one `{timestamp, type,
payload}` object a line. `session_meta` names the conversation (`id`) and workspace (`cwd`); `response_item` payloads
are the conversation (see `responses.py`); `event_msg` (which repeats the messages for the screen), `turn_context` and
`compacted` lines, and types newer than this reader, are skipped and counted.
"""

from __future__ import annotations

from typing import Any

from emelex_memory import ImportedEvent

from .events import Conversion
from .responses import feed_item

FORMAT = "codex"
KNOWN_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def detect(obj: dict[str, Any]) -> bool:
    """True when a line looks like a Codex rollout line."""
    return obj.get("type") in KNOWN_TYPES and "payload" in obj


def feed(conv: Conversion, obj: dict[str, Any], line: int) -> list[ImportedEvent] | None:
    """The events of one line (None: a line skipped)."""
    payload = obj.get("payload")
    kind = obj.get("type")
    if kind == "session_meta" and isinstance(payload, dict):
        if conv.workspace is None and isinstance(payload.get("cwd"), str):
            conv.workspace = payload["cwd"]
        conv.when(payload.get("timestamp") or obj.get("timestamp"))
        return []
    if kind == "turn_context" and isinstance(payload, dict) and conv.workspace is None \
            and isinstance(payload.get("cwd"), str):
        conv.workspace = payload["cwd"]
    if kind != "response_item":
        return None
    return feed_item(conv, payload, conv.when(obj.get("timestamp")), line)
