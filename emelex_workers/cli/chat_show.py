"""How `emelex chat` shows tool calls as they happen: the proposed call, then its outcome with a bounded preview.

The outcome of a call that ran comes from a wrapper around the tool's own
`run` (the snapshot records a tool's authority, not its function, so the
wrapper changes nothing the Session records); denied and aborted calls are
shown by the approval prompt, refused ones when they are proposed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

from emelex_workers.agent.protocol import ProposedCall
from emelex_workers.agent.tools import RegisteredTool, ToolInvocation, ToolOutput, bounded

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


def showing(tools: Mapping[str, RegisteredTool], report: Callable[[str], None]) -> dict[str, RegisteredTool]:
    """`tools` with each `run` wrapped to `report` the outcome lines when the tool returns or raises (called on
    the tool's thread); the authorities are unchanged."""

    def wrap(tool: RegisteredTool) -> RegisteredTool:
        run = tool.spec.run

        def reporting(invocation: ToolInvocation) -> ToolOutput:
            try:
                output = run(invocation)
            except Exception as exc:
                report(outcome_lines(invocation.tool, "error", f"{type(exc).__name__}: {exc}"))
                raise
            if isinstance(output, ToolOutput):
                report(outcome_lines(invocation.tool, "error" if output.is_error else "ok", output.text))
            return output

        return dataclasses.replace(tool, spec=dataclasses.replace(tool.spec, run=reporting))

    return {name: wrap(tool) for name, tool in tools.items()}
