"""The constrained tool-call protocol: the union schema a model round is generated under, parsing a round,
the execution gate, and rendering replayed history as plain chat text.

Every model round is one grammar-constrained generation of the union
`{"answer": str}` | `{"tool_calls": [1..N of anyOf({"name": const, "arguments": schema})]}`
built from the enabled tools, so a disabled tool cannot be proposed. The
protocol never relies on a chat template's tool support (SmolLM2's has
none): tools are described in the system message and past calls and results
are rendered as ordinary user and assistant text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emelex_memory import Event
from emelex_memory.agent.journal import CONTEXT_KIND, UNKNOWN_EFFECT, UnknownEffect
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_memory.sessions.transcript import SUMMARY_KIND
from emelex_workers.host.types import event_body

from .errors import RoundOutputError
from .schema import validate
from .tools import bounded

PROTOCOL_VERSION = "emelex-tools/1"
MAX_ANSWER_CHARS = 500
MAX_CALLS_PER_BATCH = 16
EXCERPT_BYTES = 300


@dataclass(frozen=True)
class ProposedCall:
    """One call a model round proposed: the tool's name and its arguments (not yet checked by the gate)."""

    tool: str
    arguments: dict


@dataclass(frozen=True)
class RoundOutput:
    """One parsed model round: the `raw` text and either an `answer` or the proposed `calls` (never both)."""

    raw: str
    answer: str | None
    calls: tuple[ProposedCall, ...]


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def union_schema(tools: Sequence[ToolAuthority], calls_per_batch: int,
                 arguments: Mapping[str, dict] | None = None) -> dict:
    """The JSON schema of one round over `tools` (the enabled ones), with 1 to `calls_per_batch` calls.

    With no tools it is the answer form alone. A tool's arguments follow
    `arguments[name]` when given (a round's restriction of its schema,
    see `AgentSession.round_schema`), else its own input schema. Every
    string is bounded: the answer by `MAX_ANSWER_CHARS`, arguments by their
    tools' own schemas.
    """
    if not 1 <= calls_per_batch <= MAX_CALLS_PER_BATCH:
        raise ValueError(f"calls_per_batch must be between 1 and {MAX_CALLS_PER_BATCH}")
    answer = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": MAX_ANSWER_CHARS}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    if not tools:
        return answer
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name},
                           "arguments": (arguments or {}).get(tool.name, tool.input_schema)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in sorted(tools, key=lambda t: t.name)
    ]
    batch = {
        "type": "object",
        "properties": {
            "tool_calls": {"type": "array", "minItems": 1, "maxItems": calls_per_batch, "items": {"anyOf": options}}
        },
        "required": ["tool_calls"],
        "additionalProperties": False,
    }
    return {"anyOf": [answer, batch]}


def _refuse(raw: str, why: str) -> RoundOutputError:
    excerpt = bounded(raw, EXCERPT_BYTES).replace("\n", " ")
    return RoundOutputError(f"the model's output is not a valid round ({why}): {excerpt!r}")


def parse_round(raw: str) -> RoundOutput:
    """Parse one round's text; `RoundOutputError` (with a bounded excerpt) when it is not the union form."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise _refuse(raw, "not complete JSON; it may have been cut by the token limit") from None
    if isinstance(value, dict) and set(value) == {"answer"} and isinstance(value["answer"], str):
        return RoundOutput(raw, value["answer"], ())
    if not (isinstance(value, dict) and set(value) == {"tool_calls"} and isinstance(value["tool_calls"], list)
            and value["tool_calls"]):
        raise _refuse(raw, 'neither {"answer": ...} nor a non-empty {"tool_calls": [...]}')
    proposed = []
    for item in value["tool_calls"]:
        if not (isinstance(item, dict) and set(item) == {"name", "arguments"} and isinstance(item["name"], str)
                and isinstance(item["arguments"], dict)):
            raise _refuse(raw, 'a call is not {"name": str, "arguments": {...}}')
        proposed.append(ProposedCall(item["name"], item["arguments"]))
    return RoundOutput(raw, None, tuple(proposed))


def gate(call: ProposedCall, snapshot: SessionSnapshot, enabled: frozenset[str]) -> str | None:
    """Why `call` must not run (a sentence for its error result), or None when it may.

    A call passes when its tool is in the snapshot, currently enabled, and
    its arguments satisfy the snapshot's input schema. Approval is separate:
    passing the gate never skips it.
    """
    authority = snapshot.tool(call.tool)
    if authority is None:
        return f"there is no tool named {bounded(call.tool, 64)!r} in this Session"
    if call.tool not in enabled:
        return f"tool {call.tool!r} is disabled in this chat"
    problem = validate(call.arguments, authority.input_schema)
    return f"invalid arguments for {call.tool!r}: {problem}" if problem else None


def system_message(snapshot: SessionSnapshot) -> str:
    """The system message: the snapshot's system prompt, the reply format and every snapshot tool."""
    lines = [snapshot.system_prompt.strip(), ""]
    if not snapshot.tools:
        lines.append('Reply with JSON only: {"answer": "<your reply to the user>"}.')
        return "\n".join(lines).strip()
    lines += [
        'Reply with JSON only, in one of two forms: {"answer": "<your reply to the user>"} when you can answer, or '
        f'{{"tool_calls": [{{"name": "<tool>", "arguments": {{...}}}}]}} to call 1 to {snapshot.calls_per_batch} '
        "tools; their results come back in the next message.",
        "Tools:",
    ]
    lines += [f"- {tool.name}: {tool.description} Arguments: {_compact(tool.input_schema)}"
              for tool in sorted(snapshot.tools, key=lambda t: t.name)]
    return "\n".join(lines).strip()


def result_text(payload: dict) -> str:
    """How one `tool_result` payload reads to the model: "Result of <tool> (<call_id>, <outcome>): <output>"."""
    output = payload.get("output")
    body = output if isinstance(output, str) else _compact(output)
    return f"Result of {payload.get('tool')} ({payload.get('call_id')}, {payload.get('outcome')}): {body}"


def calls_text(payload: dict) -> str:
    """A `tool_calls` payload as the assistant's own round output (the union form)."""
    return _compact({"tool_calls": [{"name": c.get("tool"), "arguments": c.get("arguments")}
                                    for c in payload.get("calls", [])]})


def context_message(payload: dict) -> dict[str, str]:
    """A context note (`emelex_workers.agent.context`) as the model sees it: a system message of its "text"."""
    return {"role": "system", "content": payload.get("text") if isinstance(payload.get("text"), str) else ""}


def answer_text(text: str) -> str:
    """An answer as the assistant's own round output (the union form)."""
    return _compact({"answer": text})


def history_messages(snapshot: SessionSnapshot, events: Iterable[Event],
                     unknown: Sequence[UnknownEffect] = ()) -> list[dict[str, str]]:
    """The model messages for replayed `events`: the system message, then each event as plain chat text.

    A Summary reads as a system note, and so does a `context` note (its
    "text"); `user` as the user; `assistant` and
    `tool_calls` as the assistant's union output; consecutive `tool_result`s
    as one user message; `turn_failed` as a system note; `audit` and other
    kinds are not shown. Calls to tools that are disabled now still render.
    Each call of `unknown` (the Session's `journal.unknown_effects`) whose
    result a Summary hides follows the system message as a system note
    with its safety note, so it stays visible whatever compaction did.
    """
    events = list(events)
    messages = [{"role": "system", "content": system_message(snapshot)}]
    shown = {e.payload.get("call_id") for e in events if e.kind == "tool_result" and isinstance(e.payload, dict)}
    for call in unknown:
        if call.call_id not in shown:
            messages.append({"role": "system", "content": f"Earlier in this Session, {call.tool} "
                                                          f"{_compact(call.arguments)} (call {call.call_id}): "
                                                          f"{UNKNOWN_EFFECT}."})
    results: list[str] = []

    def flush() -> None:
        if results:
            messages.append({"role": "user", "content": "\n".join(results)})
            results.clear()

    for event in events:
        payload = event.payload if event.kind != SUMMARY_KIND else None
        if event.kind == "tool_result" and isinstance(payload, dict):
            results.append(result_text(payload))
            continue
        flush()
        if event.kind == SUMMARY_KIND:
            messages.append({"role": "system", "content": f"Summary of the earlier conversation: {event_body(event)}"})
        elif event.kind == "user":
            messages.append({"role": "user", "content": event_body(event)})
        elif event.kind == "assistant":
            messages.append({"role": "assistant", "content": answer_text(event_body(event))})
        elif event.kind == "tool_calls" and isinstance(payload, dict):
            messages.append({"role": "assistant", "content": calls_text(payload)})
        elif event.kind == CONTEXT_KIND and isinstance(payload, dict):
            messages.append(context_message(payload))
        elif event.kind == "turn_failed" and isinstance(payload, dict):
            messages.append({"role": "system", "content": f"The previous turn ended without an answer "
                                                          f"({payload.get('reason')}): {payload.get('diagnostic')}"})
    flush()
    return messages
