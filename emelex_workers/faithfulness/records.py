"""Records of the agent's machinery: what a Summary says about tool rounds and failed turns, made by rule.

A chat Session is mostly tool rounds: `tool_calls` events (each call's
tool and arguments) and `tool_result` events (each call's outcome and
output). They are not what was said, so no sentence of theirs is quoted
into a Summary; instead each call becomes one *record*, written by a fixed
rule from the two events, and a failed turn (`turn_failed`) one more:

- a call: "<tool> <argument>=`<value>` ...: <outcome>." with its arguments
  in name order (the value alone when there is one argument), each value at
  most 40 characters (a string as it is, any other value as compact JSON; a
  longer one cut, ending "..."; an empty one `""`), and, for the outcome
  "ok", the first non-empty line of the output, at most 40 characters, for
  "error" at most 72 (cut the same way; a failed tool's "tool '<name>'
  failed: " left out): "read_file `config.toml`: ok, `[server]`.",
  "write_file content=`hello` path=`hello.txt`: ok, `wrote 6 bytes to
  hello.txt`.". The outcome is
  the result's own ("ok", "error", "denied", "not executed", "unknown
  effect", underscores read as spaces), "no result" when the source holds
  none for the call;
- a failed turn: "The turn ended without an answer (<reason>): `<the
  diagnostic's first line, at most 72 characters>`."

Inside a code span a backtick reads as `'` and a line break as a space, so
a record is one sentence (`checks.sentences`). Records are derived, never
invented: the worker's Summary guard derives the same records from the
job's source and counts them as source text (`guards.source_texts`), the
calls' under the speaker "tool", the failed turns' under "system", so a
Summary line that quotes them is supported and keeps its label. They never
become Knowledge: a fact a tool result established is Knowledge only in
the words the assistant said it in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from emelex_memory import Event
from emelex_memory.agent.journal import REPEATED

TOOL_SPEAKER = "tool"
FAILURE_SPEAKER = "system"
MAX_ARGUMENT_CHARS = 40
EXCERPT_CHARS = {"ok": 40, "error": 72}  # the outcomes whose record quotes the output's first line, and how much


def _span(text: str, limit: int) -> str:
    flat = " ".join(text.replace("`", "'").split())
    if not flat:
        return '""'
    return "`" + (flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "...") + "`"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def call_record(call: Mapping[str, Any], result: Mapping[str, Any] | None) -> str:
    """The record of one call (an item of a `tool_calls` payload) with its `tool_result` payload (None when the
    source holds no result for it; see the module docstring)."""
    arguments = call.get("arguments") if isinstance(call.get("arguments"), Mapping) else {}
    values = {name: _span(_value(arguments[name]), MAX_ARGUMENT_CHARS) for name in sorted(arguments)}
    shown = list(values.values()) if len(values) == 1 else [f"{name}={value}" for name, value in values.items()]
    outcome = result.get("outcome") if result is not None else None
    record = " ".join([str(call.get("tool")), *shown]) + ": " + (
        str(outcome).replace("_", " ") if outcome is not None else "no result")
    output = result.get("output") if result is not None else None
    if outcome in EXCERPT_CHARS and isinstance(output, str) and output.strip():
        first = next(line for line in output.splitlines() if line.strip())
        first = first.removeprefix(f"tool {call.get('tool')!r} failed: ")  # the tool's name is said already
        record += f", {_span(first, EXCERPT_CHARS[outcome])}"
    return record + "."


def failure_record(payload: Mapping[str, Any]) -> str:
    """The record of a `turn_failed` payload: its reason and the first line of its diagnostic (72 characters at
    most, cut as an error's output is)."""
    record = f"The turn ended without an answer ({payload.get('reason')})"
    diagnostic = payload.get("diagnostic")
    lines = [line for line in diagnostic.splitlines() if line.strip()] if isinstance(diagnostic, str) else []
    return record + (f": {_span(lines[0], EXCERPT_CHARS['error'])}." if lines else ".")


def machinery_records(events: Sequence[Event]) -> list[tuple[int, str, list[str]]]:
    """(event index, speaker, records) for each `tool_calls` event of `events` (its calls', speaker "tool", each
    with the result of the same call ID in `events`; a call answered from an identical earlier call's result, outcome
    "repeated", is not recorded again) and each `turn_failed` event (speaker "system"), in order."""
    results = {e.payload.get("call_id"): e.payload for e in events
               if e.kind == "tool_result" and isinstance(e.payload, dict)}
    out: list[tuple[int, str, list[str]]] = []
    for index, event in enumerate(events):
        payload = event.payload
        if not isinstance(payload, dict):
            continue
        if event.kind == "tool_calls" and isinstance(payload.get("calls"), list):
            calls = [c for c in payload["calls"] if isinstance(c, Mapping)]
            made = [call_record(c, results.get(c.get("call_id"))) for c in calls
                    if (results.get(c.get("call_id")) or {}).get("outcome") != REPEATED]
            if made:
                out.append((index, TOOL_SPEAKER, made))
        elif event.kind == "turn_failed":
            out.append((index, FAILURE_SPEAKER, [failure_record(payload)]))
    return out


def record_texts(events: Sequence[Event]) -> dict[str, list[str]]:
    """Every record of `events` (`machinery_records`), by speaker."""
    by_speaker: dict[str, list[str]] = {}
    for _index, speaker, made in machinery_records(events):
        by_speaker.setdefault(speaker, []).extend(made)
    return by_speaker
