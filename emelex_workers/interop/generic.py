"""Emelex's generic history format, for any agent: JSON Lines, documented in docs/interop.md.

    {"emelex_history": 1, "session": "ID", "workspace": "/abs/dir", "title": "..."}     optional first line
    {"role": "user", "text": "...", "at": "2026-12-01T10:00:00Z"}                      what the user said
    {"role": "assistant", "text": "...", "at": ...}                                    what the agent answered
    {"role": "tool_call", "id": "c1", "tool": "read_file", "arguments": {...}, "at": ...}
    {"role": "tool_result", "id": "c1", "output": "...", "error": false, "at": ...}

`at` is ISO 8601 or seconds since the epoch (optional). Being our own format, a line of another shape is refused
(naming the file and line), not skipped.
"""

from __future__ import annotations

from typing import Any

from emelex_memory import ImportedEvent

from .events import Conversion

FORMAT = "jsonl"
ROLES = ("user", "assistant", "tool_call", "tool_result")


class GenericLineError(ValueError):
    """A line of the generic format that is not one of its shapes."""


def detect(obj: dict[str, Any]) -> bool:
    """True for the generic format's header or one of its lines."""
    return "emelex_history" in obj or obj.get("role") in ROLES and "type" not in obj


def feed(conv: Conversion, obj: dict[str, Any], line: int) -> list[ImportedEvent] | None:
    """The events of one line; raises `GenericLineError` for a line of no known shape."""
    if "emelex_history" in obj:
        if line != 1 or obj.get("emelex_history") != 1:
            raise GenericLineError("a header line (emelex_history: 1) may only be the first line")
        for name in ("session", "workspace", "title"):
            if obj.get(name) is not None and not isinstance(obj[name], str):
                raise GenericLineError(f"the header's {name!r} must be text")
        conv.key = obj.get("session") or conv.key
        conv.workspace = obj.get("workspace") or conv.workspace
        conv.titled(obj.get("title"), 1)
        return []
    role = obj.get("role")
    at = conv.when(obj.get("at"))
    if role in ("user", "assistant"):
        if not isinstance(obj.get("text"), str):
            raise GenericLineError(f"a {role} line needs its \"text\"")
        return [conv.event(role, {"text": conv.text(obj["text"])}, at, line, new_turn=role == "user")]
    if role in ("tool_call", "tool_result"):
        if not isinstance(obj.get("id"), str) or not obj["id"]:
            raise GenericLineError(f"a {role} line needs the call's \"id\"")
        if role == "tool_call":
            if not isinstance(obj.get("tool"), str) or not obj["tool"]:
                raise GenericLineError("a tool_call line needs its \"tool\"")
            conv.tools[obj["id"]] = obj["tool"]
            call = {"call_id": obj["id"], "tool": obj["tool"], "arguments": conv.value(obj.get("arguments", {}))}
            return [conv.event("tool_calls", {"calls": [call]}, at, line)]
        output = obj.get("output", "")
        text = output if isinstance(output, str) else None
        return [conv.event("tool_result", {
            "call_id": obj["id"], "tool": obj.get("tool") or conv.tools.get(obj["id"], "tool"),
            "outcome": "error" if obj.get("error") else "ok",
            "output": conv.text(text) if text is not None else conv.value(output)}, at, line)]
    raise GenericLineError(f"a line needs a \"role\" of {', '.join(ROLES)}")
