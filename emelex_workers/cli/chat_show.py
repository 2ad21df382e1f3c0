"""How `emelex chat` shows tool calls as they happen: the proposed call, then its outcome with a bounded preview.

The outcome of a call that ran is shown once the adapter journaled its
result (`on_result`), so a result that could not be recorded is never shown
as "ok"; denied and aborted calls are shown by the approval prompt, refused
ones when they are proposed.
"""

from __future__ import annotations

import json

from emelex_workers.agent.protocol import ProposedCall
from emelex_workers.agent.tools import bounded

ARGUMENTS_BYTES = 200
PREVIEW_BYTES = 300
PREVIEW_LINES = 4


def call_text(call: ProposedCall) -> str:
    """One call as "tool {arguments}" (arguments bounded)."""
    return f"{call.tool} {bounded(json.dumps(call.arguments, ensure_ascii=False), ARGUMENTS_BYTES)}"


def call_line(call: ProposedCall) -> str:
    """One proposed call as a line: "-> tool {arguments}"."""
    return f"-> {call_text(call)}"


def preview(text: str | dict) -> str:
    """A tool output cut to `PREVIEW_LINES` lines and `PREVIEW_BYTES` bytes, each line indented; "(no output)"
    when empty."""
    body = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    lines = body.rstrip("\n").splitlines() or ["(no output)"]
    shown = lines[:PREVIEW_LINES] + ([f"... ({len(lines) - PREVIEW_LINES} more lines)"]
                                     if len(lines) > PREVIEW_LINES else [])
    return "\n".join(f"     {bounded(line, PREVIEW_BYTES)}" for line in shown)


def outcome_lines(tool: str, outcome: str, output: str | dict) -> str:
    """The outcome of one call: "<- tool: outcome" and the output preview."""
    return f"<- {tool}: {outcome}\n{preview(output)}"
