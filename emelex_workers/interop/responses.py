"""Items in the shape of OpenAI's Responses API, which Codex's rollout files (`response_item` payloads) and the
OpenAI Agents SDK's sessions both store: messages (`role`, `content` as text or `input_text`/`output_text` blocks),
`function_call` {name, arguments (JSON text), call_id}, `function_call_output` {call_id, output}, Codex's
`custom_tool_call`/`custom_tool_call_output`, `local_shell_call` and `web_search_call`. Reasoning, system and developer
messages are not what was said: skipped and counted.
"""

from __future__ import annotations

import json
from typing import Any

from emelex_memory import ImportedEvent

from .events import Conversion, block_text

# Context Codex puts in user messages, not the user's words (its own markers).
CONTEXT_MARKERS = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions", "<permissions")


def _arguments(conv: Conversion, text: Any) -> Any:
    if isinstance(text, str):
        try:
            return conv.value(json.loads(text))
        except ValueError:
            return {"text": conv.text(text)}
    return conv.value(text)


def _output(output: Any) -> tuple[str, bool]:
    """(text, failed) of a function call's output: a string, content blocks, or {content, success}."""
    if isinstance(output, dict):
        failed = output.get("success") is False
        return _output(output.get("content", output.get("output", "")))[0], failed
    if isinstance(output, str):
        return output, False
    return block_text(output) or json.dumps(output, ensure_ascii=False)[:65536], False


def feed_item(conv: Conversion, item: Any, at: float, line: int) -> list[ImportedEvent] | None:
    """The events of one Responses item (None: skipped)."""
    if not isinstance(item, dict):
        return None
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        text = block_text(item.get("content"))
        if role not in ("user", "assistant") or not text.strip():
            return None
        if role == "user" and text.lstrip().startswith(CONTEXT_MARKERS):
            return None
        return [conv.event(role, {"text": conv.text(text)}, at, line, new_turn=role == "user")]
    if kind in ("function_call", "custom_tool_call") and isinstance(item.get("call_id"), str):
        name = str(item.get("name") or "tool")
        conv.tools[item["call_id"]] = name
        args = _arguments(conv, item.get("arguments")) if kind == "function_call" else {
            "input": conv.text(str(item.get("input", "")))}
        return [conv.event("tool_calls", {"calls": [{"call_id": item["call_id"], "tool": name, "arguments": args}]},
                           at, line)]
    if kind == "local_shell_call":
        call_id = item.get("call_id") or item.get("id") or f"line-{line}"
        conv.tools[str(call_id)] = "shell"
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        return [conv.event("tool_calls", {"calls": [{"call_id": str(call_id), "tool": "shell",
                                                     "arguments": conv.value(action)}]}, at, line)]
    if kind == "web_search_call":
        call_id = str(item.get("id") or f"line-{line}")
        return [conv.event("tool_calls", {"calls": [{"call_id": call_id, "tool": "web_search",
                                                     "arguments": conv.value(item.get("action"))}]}, at, line)]
    if kind in ("function_call_output", "custom_tool_call_output") and isinstance(item.get("call_id"), str):
        text, failed = _output(item.get("output"))
        return [conv.event("tool_result", {"call_id": item["call_id"], "tool": conv.tools.get(item["call_id"], "tool"),
                                           "outcome": "error" if failed else "ok", "output": conv.text(text)}, at, line)]
    return None
