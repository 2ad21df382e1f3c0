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

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from emelex_memory import Event
from emelex_memory.agent.journal import CONTEXT_KIND, UNKNOWN_EFFECT, UnknownEffect
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_memory.sessions.transcript import SUMMARY_KIND
from emelex_workers.host.policies import NATIVE_PROTOCOL
from emelex_workers.host.types import ProposedCall, event_body

from .errors import RoundOutputError
from .schema import validate
from .tools import bounded

PROTOCOL_V1 = "emelex-tools/1"
PROTOCOL_V2 = "emelex-tools/2"
PROTOCOL_V3 = "emelex-tools/3"
PROTOCOL_NATIVE = NATIVE_PROTOCOL  # tools sent in the OpenAI `tools` field, messages in that API's tool-call form
PROTOCOL_VERSION = PROTOCOL_V3
PROTOCOLS = (PROTOCOL_V1, PROTOCOL_V2, PROTOCOL_V3, PROTOCOL_NATIVE)  # every version this code renders: a Session
# keeps its own
MAX_ANSWER_CHARS = 500
MAX_CALLS_PER_BATCH = 16
EXCERPT_BYTES = 300


@dataclass(frozen=True)
class RoundOutput:
    """One parsed model round: the `raw` text and either an `answer` or the proposed `calls` (never both);
    `stopped` is "repetition" for a round whose generation was ended at a runaway repetition inside a string
    (see `runaway_at`): `raw` is then the text generated up to the end of the repetition's first copy, closed
    as JSON."""

    raw: str
    answer: str | None
    calls: tuple[ProposedCall, ...]
    stopped: str | None = None


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def union_schema(tools: Sequence[ToolAuthority], calls_per_batch: int,
                 arguments: Mapping[str, dict] | None = None, answers: Sequence[str] | None = None,
                 calls_only: bool = False, answer_chars: int | None = MAX_ANSWER_CHARS) -> dict:
    """The JSON schema of one round over `tools` (the enabled ones), with 1 to `calls_per_batch` calls.

    With no tools it is the answer form alone. A tool's arguments follow
    `arguments[name]` when given (a round's restriction of its schema,
    see `AgentSession.round_plan`), else its own input schema. A free answer
    is at most `answer_chars` characters (None: unbounded but for the
    round's tokens), arguments are bounded by their tools' own schemas.
    With `answers` the answer is one of them (an enum); with `calls_only`
    (and tools) the round is the tool-call form alone.
    """
    if not 1 <= calls_per_batch <= MAX_CALLS_PER_BATCH:
        raise ValueError(f"calls_per_batch must be between 1 and {MAX_CALLS_PER_BATCH}")
    free = {"type": "string"} if answer_chars is None else {"type": "string", "maxLength": answer_chars}
    answer = {
        "type": "object",
        "properties": {"answer": free if not answers else {"type": "string", "enum": list(answers)}},
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
    return batch if calls_only else {"anyOf": [answer, batch]}


def _refuse(raw: str, why: str) -> RoundOutputError:
    excerpt = bounded(raw, EXCERPT_BYTES).replace("\n", " ")
    return RoundOutputError(f"the model's output is not a valid round ({why}): {excerpt!r}")


def _json_problem(raw: str, error: json.JSONDecodeError, token_limit: int | None) -> str:
    """Why `raw` is not JSON, honestly: cut by the token limit (`token_limit`: the limit the generation reached),
    stopped before its JSON was complete, text after a complete object, or the decoder's own complaint and where."""
    unfinished = error.pos >= len(raw.rstrip()) or error.msg.startswith("Unterminated string")
    if unfinished and token_limit is not None:
        return f"cut by the token limit: all {token_limit} tokens of the round were used before its JSON was complete"
    if unfinished:
        return f"its JSON stops unfinished at char {len(raw)}, before the token limit"
    if error.msg == "Extra data":
        return f"text follows the complete JSON object at char {error.pos}"
    return f"invalid JSON at char {error.pos}: {error.msg}"


def parse_round(raw: str, *, token_limit: int | None = None) -> RoundOutput:
    """Parse one round's text; `RoundOutputError` (with a bounded excerpt) when it is not the union form.

    A raw control character (a newline, a tab) inside a string, which the
    grammar admits, reads as that character. `token_limit` is the round's
    token limit when its generation used every token of it (None: it stopped
    earlier, or the caller does not know); only then does a refusal blame the
    limit. The diagnostic says what is wrong and at which character.
    """
    try:
        value = json.loads(raw, strict=False)
    except json.JSONDecodeError as error:
        raise _refuse(raw, _json_problem(raw, error, token_limit)) from None
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


@dataclass(frozen=True)
class OpenString:
    """The string a round's text ends inside (it is still being generated): its decoded `text` so far, `offsets`
    (the index in the raw text where each character of `text` starts, then where the text so far ends) and
    `closers`, the brackets that close the objects and arrays still open around it, innermost first."""

    text: str
    offsets: tuple[int, ...]
    closers: str


class StringScanner:
    """A round's text read as it streams, each character once: which brackets are open, whether the text so far
    ends inside a string, and that string's decoded characters with where each starts in the text.
    `feed(piece)` reads the next piece; `open()` then answers what `open_string` answers for all the text fed so
    far, and `tail(n)` the same for the open string's last `n` characters only (what a check of a string's end
    needs, at a cost that does not grow with the string); `closed` is the last string that closed. An escape cut by a piece's end waits for the next piece;
    one that is not JSON ends the reading there, as it ends `open_string`'s."""

    def __init__(self) -> None:
        self._closers: list[str] = []
        self._inside = False
        self._text: list[str] = []  # the open string's decoded characters
        self._offsets: list[int] = []  # where each starts in the text fed
        self._pending = ""  # the start of an escape cut by the end of the last piece
        self._at = 0  # where `_pending` starts in the text fed
        self._frozen = False  # an escape that is not JSON: nothing after it is read
        self._strings = 0
        self.closed = ""  # the decoded text of the last string that closed

    def feed(self, piece: str) -> None:
        """Read `piece`, the next part of the round's text."""
        if self._frozen:
            return
        text, base, index = self._pending + piece, self._at, 0
        size = len(text)
        while index < size:
            char = text[index]
            if not self._inside:
                if char in "{[":
                    self._closers.append("}" if char == "{" else "]")
                elif char in "}]" and self._closers:
                    self._closers.pop()
                elif char == '"':
                    self._inside, self._text, self._offsets = True, [], []
                    self._strings += 1
                index += 1
            elif char == '"':
                self.closed = "".join(self._text)
                self._inside, self._text, self._offsets = False, [], []
                index += 1
            elif char == "\\":
                step = 6 if text[index + 1:index + 2] == "u" else 2
                if index + step > size:
                    break  # the rest of the escape comes with the next piece
                try:
                    decoded = json.loads(f'"{text[index:index + step]}"')
                except ValueError:
                    self._frozen = True
                    break
                self._text.append(decoded)
                self._offsets.append(base + index)
                index += step
            else:
                self._text.append(char)
                self._offsets.append(base + index)
                index += 1
        self._pending, self._at = text[index:], base + index

    @property
    def depth(self) -> int:
        """How many brackets are open."""
        return len(self._closers)

    @property
    def inside(self) -> bool:
        """Whether the text fed so far ends inside a string."""
        return self._inside

    @property
    def strings(self) -> int:
        """How many strings have been opened so far (keys and values alike)."""
        return self._strings

    @property
    def length(self) -> int:
        """How many characters the open string has so far (0 outside a string)."""
        return len(self._text)

    def open(self) -> OpenString | None:
        """The string the text fed so far ends inside (see `open_string`), or None."""
        return self.tail(len(self._text))

    def tail(self, chars: int) -> OpenString | None:
        """As `open`, for the open string's last `chars` characters only (its offsets those characters' own)."""
        if not self._inside:
            return None
        start = max(0, len(self._text) - max(0, chars))
        return OpenString("".join(self._text[start:]), (*self._offsets[start:], self._at),
                          "".join(reversed(self._closers)))


def open_string(raw: str) -> OpenString | None:
    """The string `raw` (a round's text so far, JSON) ends inside, decoded (an escape not yet complete left
    out), or None when `raw` does not end inside a string."""
    scanner = StringScanner()
    scanner.feed(raw)
    return scanner.open()


LOOP_MIN_CHARS = 30  # a repeated unit is a loop once its copies span this many characters
LOOP_LONG_UNIT = 40  # a unit this long is a loop at its second copy; a shorter one needs three
LOOP_LINE_REPEATS = 3  # the same line (list markers aside) this often is a loop
LOOP_LINE_CHARS = 8  # shorter lines may repeat
_LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])?\s*")


def _periodic_tail(text: str, unit: int) -> int:
    """The length of the longest end of `text` that repeats with period `unit` (every character equal to the one
    `unit` further on)."""
    index = len(text) - unit - 1
    while index >= 0 and text[index] == text[index + unit]:
        index -= 1
    return len(text) - index - 1


def runaway_at(text: str) -> int | None:
    """Where a runaway repetition at the end of `text` (a string being generated) stops making sense, as the
    length of `text` to keep (the first copy kept, every later one dropped), or None when it does not end in one.

    The kept text ends at a word's end (at most one more unit on). A loop is
    an end of `text` that repeats a unit back to back: a unit of
    at least `LOOP_LONG_UNIT` characters twice, a shorter one three times
    and over at least `LOOP_MIN_CHARS` characters; or, line by line, the
    last complete line (a list marker such as "3." or "-" aside, at least
    `LOOP_LINE_CHARS` characters) for the `LOOP_LINE_REPEATS`th time.
    """
    for unit in range(1, len(text) // 2 + 1):
        tail = _periodic_tail(text, unit)
        if tail >= 2 * unit and (unit >= LOOP_LONG_UNIT or (tail >= 3 * unit and tail >= LOOP_MIN_CHARS)):
            cut = len(text) - tail + unit
            end = min(len(text), cut + unit)
            while cut < end and text[cut - 1].isalnum() and text[cut].isalnum():
                cut += 1  # not inside a word: the copy may have been found starting mid-word
            return cut
    lines = text.split("\n")[:-1]  # complete lines only
    if lines:
        key = _LIST_MARKER.sub("", lines[-1]).strip()
        starts, offset = [], 0
        for line in lines:
            if _LIST_MARKER.sub("", line).strip() == key:
                starts.append(offset)
            offset += len(line) + 1
        if len(key) >= LOOP_LINE_CHARS and len(starts) >= LOOP_LINE_REPEATS:
            return starts[1]
    return None


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


NATIVE_GUIDE = ("Call the tools when you need to look at or change files in the workspace; their results come back "
                "as tool messages. Answer the user in your own words once you have what they asked for, and never "
                "repeat a call whose result you already have.")


def system_message(snapshot: SessionSnapshot) -> str:
    """The system message of `snapshot`'s protocol version: the snapshot's system prompt, the reply format and
    every snapshot tool; from "emelex-tools/2" on also a worked example of a tool round and of an answer (see
    `EXAMPLE`); under `openai-tools/1`, whose tools go in the request's `tools` field, the system prompt and
    `NATIVE_GUIDE`. A Session keeps the rendering of the version its snapshot records."""
    if snapshot.protocol == PROTOCOL_V1:
        return _system_message_v1(snapshot)
    if snapshot.protocol == PROTOCOL_NATIVE:
        return "\n\n".join([snapshot.system_prompt.strip(), NATIVE_GUIDE]) if snapshot.tools else \
            snapshot.system_prompt.strip()
    lines = [snapshot.system_prompt.strip(), ""]
    if not snapshot.tools:
        lines.append('Reply with one JSON object and nothing else: {"answer": "<your reply to the user>"}.')
        return "\n".join(lines).strip()
    lines += [
        "Reply with one JSON object and nothing else, in one of two forms:",
        f'- {{"tool_calls": [{{"name": "<tool>", "arguments": {{...}}}}]}} calls 1 to {snapshot.calls_per_batch} '
        "tools; their results come back in the next message.",
        '- {"answer": "<your reply to the user>"} ends your turn.',
        "Tools:",
    ]
    lines += [f"- {tool.name}: {tool.description} Arguments: {_arguments_text(tool.input_schema)}"
              for tool in sorted(snapshot.tools, key=lambda t: t.name)]
    closing = ("Answer as soon as the results hold what the user asked for, and quote them exactly. "
               "Never repeat a call you already made: its result is above.")
    if snapshot.protocol == PROTOCOL_V3:
        closing = ("Answer as soon as the results hold what the user asked for: once tools have answered, your "
                   'answer is the line of their results that answers the user, as "<file>: <line>". '
                   "Never repeat a call you already made: its result is above.")
    lines += ["", *_example_lines(snapshot), "", closing]
    return "\n".join(lines).strip()


@dataclass(frozen=True)
class Example:
    """A worked example of the system message (protocol "emelex-tools/2"): the user's `question`, the `call`
    that looks it up and the tool's `result` (None: answered without a tool) and the `answer`."""

    question: str
    call: ProposedCall | None
    result: str | None
    answer: str


EXAMPLE = Example("What is the port in config.ini?", ProposedCall("read_file", {"path": "config.ini"}),
                  "[server]\nport = 8080", "The port in config.ini is 8080.")
QUOTED_EXAMPLE = dataclasses.replace(EXAMPLE, answer="config.ini: port = 8080")  # "emelex-tools/3": quoted
EXAMPLE_WITHOUT_TOOL = Example("Say hello.", None, None, "Hello! What can I do in this workspace?")


def _example_lines(snapshot: SessionSnapshot) -> list[str]:
    """The worked example: `EXAMPLE` (a tool round, then an answer quoting its result) when the snapshot has its
    tool with a schema that admits its arguments, else `EXAMPLE_WITHOUT_TOOL` (an answer alone)."""
    tool = snapshot.tool(EXAMPLE.call.tool)
    example = EXAMPLE if tool is not None and validate(EXAMPLE.call.arguments, tool.input_schema) is None \
        else EXAMPLE_WITHOUT_TOOL
    if example is EXAMPLE and snapshot.protocol == PROTOCOL_V3:
        example = QUOTED_EXAMPLE
    lines = ["Example:", f"user: {example.question}"]
    if example.call is not None:
        call = {"round": 1, "calls": [{"call_id": "1", "tool": example.call.tool, "arguments": example.call.arguments}]}
        result = {"call_id": "1", "tool": example.call.tool, "outcome": "ok", "output": example.result}
        lines += [f"assistant: {calls_text(call)}",
                  f"user: {result_text(result, snapshot.protocol, example.call.arguments)}"]
    return [*lines, f"assistant: {answer_text(example.answer)}"]


def _arguments_text(schema: dict) -> str:
    """A tool's arguments as a model reads them best: "name (type, its description), other (optional, type)"; a
    schema that is not an object of properties as compact JSON."""
    properties = schema.get("properties") if schema.get("type") == "object" else None
    if not isinstance(properties, dict):
        return _compact(schema)
    if not properties:
        return "none"
    required = set(schema.get("required", ()))
    parts = []
    for name, spec in properties.items():
        notes = [] if name in required else ["optional"]
        if "enum" in spec:
            notes.append("one of " + ", ".join(_compact(value) for value in spec["enum"]))
        else:
            notes.append(spec.get("type", "value"))
        if spec.get("description"):
            notes.append(spec["description"])
        parts.append(f"{name} ({', '.join(map(str, notes))})")
    return ", ".join(parts)


def _system_message_v1(snapshot: SessionSnapshot) -> str:
    """The system message of protocol "emelex-tools/1", unchanged: Sessions made with it keep rendering it."""
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


def result_text(payload: dict, version: str = PROTOCOL_VERSION, arguments: dict | None = None) -> str:
    """How one `tool_result` payload reads to the model under protocol `version`: "Result of <tool>
    <arguments> (<outcome>): <output>", naming the call by its `arguments` (a small model copied a call ID into
    its answers); under "emelex-tools/1" "Result of <tool> (<call_id>, <outcome>): <output>"."""
    output = payload.get("output")
    body = output if isinstance(output, str) else _compact(output)
    if version == PROTOCOL_V1:
        return f"Result of {payload.get('tool')} ({payload.get('call_id')}, {payload.get('outcome')}): {body}"
    shown = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return f"Result of {payload.get('tool')} {shown} ({payload.get('outcome')}): {body}"


def calls_text(payload: dict) -> str:
    """A `tool_calls` payload as the assistant's own round output (the union form, in the order the grammar
    generates it: each call's name, then its arguments as proposed)."""
    value = {"tool_calls": [{"name": c.get("tool"), "arguments": c.get("arguments")} for c in payload.get("calls", [])]}
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def context_message(payload: dict) -> dict[str, str]:
    """A context note (`emelex_workers.agent.context`) as the model sees it: a system message of its "text"."""
    return {"role": "system", "content": payload.get("text") if isinstance(payload.get("text"), str) else ""}


def answer_text(text: str) -> str:
    """An answer as the assistant's own round output (the union form)."""
    return _compact({"answer": text})


def answer_message(snapshot: SessionSnapshot, text: str) -> dict:
    """The assistant's answer `text` as a message of `snapshot`'s protocol: its own words under `openai-tools/1`,
    else the union form."""
    return {"role": "assistant", "content": text if snapshot.protocol == PROTOCOL_NATIVE else answer_text(text)}


def calls_message(snapshot: SessionSnapshot, payload: dict) -> dict:
    """The assistant's calls (a `tool_calls` payload) as a message of `snapshot`'s protocol: under `openai-tools/1`
    an assistant message with OpenAI `tool_calls` (each named by its call ID, its arguments as JSON text), else the
    union form as text."""
    if snapshot.protocol != PROTOCOL_NATIVE:
        return {"role": "assistant", "content": calls_text(payload)}
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": c.get("call_id"), "type": "function",
         "function": {"name": c.get("tool"), "arguments": json.dumps(c.get("arguments"), ensure_ascii=False)}}
        for c in payload.get("calls", [])]}


def tool_message(payload: dict) -> dict:
    """One `tool_result` payload as an OpenAI tool message (`openai-tools/1`): its output, after its outcome in
    brackets when that is not "ok" ("[denied] the user denied this call")."""
    output = payload.get("output")
    body = output if isinstance(output, str) else _compact(output)
    outcome = payload.get("outcome")
    return {"role": "tool", "tool_call_id": payload.get("call_id"),
            "content": body if outcome == "ok" else f"[{outcome}] {body}"}


def batch_messages(snapshot: SessionSnapshot, payload: dict, results: Sequence[dict]) -> list[dict]:
    """One complete round as messages of `snapshot`'s protocol: the assistant's calls (a `tool_calls` payload) and
    their `tool_result` payloads (one tool message each under `openai-tools/1`, else one user message)."""
    if snapshot.protocol == PROTOCOL_NATIVE:
        return [calls_message(snapshot, payload), *(tool_message(r) for r in results)]
    arguments = {c.get("call_id"): c.get("arguments") for c in payload.get("calls", [])}
    return [calls_message(snapshot, payload),
            {"role": "user", "content": "\n".join(result_text(r, snapshot.protocol, arguments.get(r.get("call_id")))
                                                  for r in results)}]


def history_messages(snapshot: SessionSnapshot, events: Iterable[Event],
                     unknown: Sequence[UnknownEffect] = ()) -> list[dict]:
    """The model messages for replayed `events`: the system message, then each event as plain chat text (under
    `openai-tools/1`, calls and results as that API's tool calls and tool messages).

    A Summary reads as a system note, and so does a `context` note (its
    "text"); `user` as the user; `assistant` and
    `tool_calls` as the assistant's union output; consecutive `tool_result`s
    as one user message (each a tool message under `openai-tools/1`);
    `turn_failed` as a system note; `audit` and other kinds are not shown. Calls to tools that are disabled now still render.
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

    arguments: dict[str, dict] = {}  # call ID -> the call's arguments, as its result names it
    for event in events:
        payload = event.payload if event.kind != SUMMARY_KIND else None
        if event.kind == "tool_result" and isinstance(payload, dict) and snapshot.protocol == PROTOCOL_NATIVE:
            messages.append(tool_message(payload))
            continue
        if event.kind == "tool_result" and isinstance(payload, dict):
            results.append(result_text(payload, snapshot.protocol, arguments.get(payload.get("call_id"))))
            continue
        if event.kind == "tool_calls" and isinstance(payload, dict):
            arguments.update((c.get("call_id"), c.get("arguments")) for c in payload.get("calls", []))
        flush()
        if event.kind == SUMMARY_KIND:
            messages.append({"role": "system", "content": f"Summary of the earlier conversation: {event_body(event)}"})
        elif event.kind == "user":
            messages.append({"role": "user", "content": event_body(event)})
        elif event.kind == "assistant":
            messages.append(answer_message(snapshot, event_body(event)))
        elif event.kind == "tool_calls" and isinstance(payload, dict):
            messages.append(calls_message(snapshot, payload))
        elif event.kind == CONTEXT_KIND and isinstance(payload, dict):
            messages.append(context_message(payload))
        elif event.kind == "turn_failed" and isinstance(payload, dict):
            messages.append({"role": "system", "content": f"The previous turn ended without an answer "
                                                          f"({payload.get('reason')}): {payload.get('diagnostic')}"})
    flush()
    return messages
