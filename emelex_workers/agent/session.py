"""`AgentSession`: the in-memory half of an agent: model messages, the bound model, the snapshot's tools and the
enabled subset, and what each round's grammar offers. It touches no database; `DurableAgentSession` (in
`durable.py`) drives it and persists.

A round's grammar is narrower than the snapshot's authority, never wider:
the enabled tools only; each path argument a tool declares
(`ToolSpec.workspace_paths`) restricted to what exists in the workspace at
that round (`workspace.narrow_path`); no call identical to one already done
in the turn where the grammar can say so (a tool whose only argument is an
enum loses the values already called, and a tool with no admissible value
left is not offered); and, when the turn is forced to end, the answer form
alone. The gate still checks every call against the snapshot only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from emelex_memory import Event
from emelex_memory.agent.journal import CONTEXT_KIND, REPEATED, UnknownEffect
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_memory.sessions.transcript import SUMMARY_KIND
from emelex_workers.host.manager import accepts_keyword
from emelex_workers.host.tools import ToolSpec
from emelex_workers.host.types import AgentBinding, GenerationInterrupted, GenerationProgress, event_body

from . import protocol
from .errors import UnknownToolError
from .protocol import ProposedCall, RoundOutput
from .quotes import Quote, answers, choose, note_files, note_quotes, result_quotes
from .request import asks_for, mentioned, set_off, small_talk, small_talk_answer, spans, verbs
from .schema import validate
from .tools import RegisteredTool, bounded
from .workspace import WorkspaceEntries, narrow_path, scan

_NOT_DONE = ("not_executed", REPEATED)  # outcomes that do not make a call "already done"
_NO_EFFECT = ("denied", "not_executed", REPEATED)  # outcomes of a call that cannot have changed the workspace
_ENUM_ONLY = {"type", "enum", "description", "title"}
EARLIER_RESULTS = 50  # results of earlier turns an answer may quote before its turn has one
QUOTED_BYTES = 200  # of the user's request, quoted in the note of a forced round
# The end of a streamed string a runaway repetition is looked for in, after each piece: a round's whole string
# fits (round_tokens of a few characters each), and the cost per piece stays the same however long a reply gets
RUNAWAY_WINDOW = 4096


def call_key(tool: str, arguments: dict) -> str:
    """The identity of a call: its tool and its canonical arguments (identical calls have equal keys)."""
    return json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class AgentSession:
    """Messages, model, tools and the protocol for one agent Session, in memory.

    `enabled_tools` starts as every snapshot tool; `disable_tool` and
    `enable_tool` only remove or restore snapshot tools (never grant a new
    one). `generate_round` is blocking: run it on the model thread, one call
    at a time.
    """

    def __init__(self, binding: AgentBinding, snapshot: SessionSnapshot, tools: Mapping[str, RegisteredTool], *,
                 exclude: Collection[tuple[int, int]] = ()) -> None:
        """An agent over `binding` and `snapshot`; `tools` are the registered tools that run the snapshot's calls
        (their `workspace_paths` narrow each round's grammar); `exclude` holds the (st_dev, st_ino) of directories
        a round never offers (the Emelex Home)."""
        self.binding = binding
        self.snapshot = snapshot
        self.tools = dict(tools)
        self.exclude = frozenset(exclude)
        self.enabled_tools: frozenset[str] = frozenset(t.name for t in snapshot.tools)
        self.messages: list[dict[str, str]] = protocol.history_messages(snapshot, ())
        self._done: dict[str, dict] = {}  # call key -> result of that call, done in this turn since the last effect
        self._seen: set[str] = set()  # (tool, outcome, output) of every result in this turn
        self._results: list[tuple[ProposedCall, dict]] = []  # every call completed in this turn, with its result
        self._earlier: list[tuple[ProposedCall, dict]] = []  # those of earlier turns, the latest EARLIER_RESULTS
        self._effected = False  # a call of a tool with `requested_by` words ran in this turn
        self._notes: list[dict] = []  # the context notes recorded with the latest turn's input
        self._pending: list[dict] = []  # the context notes added since, for the next input
        self._asked = ""  # the user's input of the latest turn

    def _known(self, name: str) -> str:
        if self.snapshot.tool(name) is None:
            known = ", ".join(t.name for t in self.snapshot.tools) or "none"
            raise UnknownToolError(f"there is no tool named {name!r} in this Session (its tools: {known})")
        return name

    def disable_tool(self, name: str) -> None:
        """Stop offering snapshot tool `name` (and let the gate refuse it); `UnknownToolError` for any other name."""
        self.enabled_tools = self.enabled_tools - {self._known(name)}

    def enable_tool(self, name: str) -> None:
        """Offer snapshot tool `name` again; `UnknownToolError` for a name the snapshot does not have."""
        self.enabled_tools = self.enabled_tools | {self._known(name)}

    def load_history(self, events: Iterable[Event], unknown: Sequence[UnknownEffect] = ()) -> None:
        """Replace the messages with the rendering of replayed `events` and the Session's calls of `unknown` effect
        (see `protocol.history_messages`), and rebuild what the open turn (if any) has already done from its
        replayed calls and results, so a resumed turn offers and answers exactly what the live one would."""
        events = list(events)
        self.messages = protocol.history_messages(self.snapshot, events, unknown)
        self._results, self._earlier = [], []
        self._new_turn()
        self._notes, self._pending = [], []
        calls: dict[str, ProposedCall] = {}
        for event in events:
            payload = event.payload if event.kind != SUMMARY_KIND else None
            if event.kind == CONTEXT_KIND and isinstance(payload, dict):
                self._pending.append(payload)
            elif event.kind in ("user", "assistant", "turn_failed", SUMMARY_KIND):
                self._new_turn()
                if event.kind == "user":
                    self._asked = event_body(event)
                    self._notes, self._pending = self._pending, []
            elif event.kind == "tool_calls" and isinstance(payload, dict):
                calls = {c.get("call_id"): ProposedCall(c.get("tool"), c.get("arguments"))
                         for c in payload.get("calls", []) if isinstance(c, dict)}
            elif event.kind == "tool_result" and isinstance(payload, dict) and payload.get("call_id") in calls:
                self.record(calls[payload["call_id"]], payload)

    def _new_turn(self) -> None:
        self._earlier = [*self._earlier, *self._results][-EARLIER_RESULTS:]
        self._done.clear()
        self._seen.clear()
        self._results.clear()
        self._effected = False

    def add_context(self, payload: dict) -> None:
        """Append a context note (see `protocol.context_message`); it belongs to the next input's turn."""
        self._pending.append(payload)
        self.messages.append(protocol.context_message(payload))

    def add_user(self, text: str) -> None:
        """Append the user's input; a new turn has done nothing yet, and has the context notes added before it."""
        self._new_turn()
        self._asked = text
        self._notes, self._pending = self._pending, []
        self.messages.append({"role": "user", "content": text})

    def earlier_result(self, call: ProposedCall) -> dict | None:
        """The `tool_result` of a call identical to `call` already done in this turn (since the last call that may
        have changed the workspace), or None."""
        return self._done.get(call_key(call.tool, call.arguments))

    def record(self, call: ProposedCall, result: dict) -> bool:
        """Note that `call` completed with `result` in this turn; True when the result is new to the turn (not a
        repeat, and no earlier result of the same tool had the same outcome and output).

        A call of an "always" tool (one that may have effects) that did not
        end `denied`, `not_executed` or `repeated` may have changed the
        workspace: what was done before it no longer counts as done.
        """
        outcome = result.get("outcome")
        self._results.append((call, result))
        authority = self.snapshot.tool(call.tool)
        if authority is not None and self._requested_by(call.tool) and outcome not in _NO_EFFECT:
            self._effected = True
        if authority is not None and authority.approval == "always" and outcome not in _NO_EFFECT:
            self._done.clear()
        if outcome not in _NOT_DONE:
            self._done.setdefault(call_key(call.tool, call.arguments), result)
        seen = call_key(call.tool, {"outcome": outcome, "output": result.get("output")})
        new = outcome != REPEATED and seen not in self._seen
        self._seen.add(seen)
        return new

    def add_batch(self, round: int, calls: Sequence[tuple[str, ProposedCall]], results: Sequence[dict]) -> None:
        """Append one complete round: the assistant's calls `(call_id, call)` and their `tool_result` payloads."""
        payload = {"round": round, "calls": [{"call_id": cid, "tool": c.tool, "arguments": c.arguments}
                                             for cid, c in calls]}
        self.messages.append({"role": "assistant", "content": protocol.calls_text(payload)})
        arguments = {cid: c.arguments for cid, c in calls}
        self.messages.append({"role": "user", "content": "\n".join(
            protocol.result_text(r, self.snapshot.protocol, arguments.get(r.get("call_id"))) for r in results)})

    def add_answer(self, text: str) -> None:
        """Append the assistant's final answer; the turn is over."""
        self._new_turn()
        self.messages.append({"role": "assistant", "content": protocol.answer_text(text)})

    def round_messages(self, forced: str | None = None) -> list[dict[str, str]]:
        """The messages a round is generated from: the history plus, when the turn is `forced` to end ("chain_limit",
        "repeat" or "answered"), a note to answer from the results in context, else, while tools are disabled, a note
        naming them. The notes are never part of `messages`."""
        if forced is not None:
            why = {"chain_limit": f"this turn has used its {self.snapshot.chain_limit} tool rounds",
                   "repeat": "the last tool calls told you nothing new",
                   "answered": "the tool results above answer it"}[forced]
            note = (f"No more tool calls ({why}). Answer the user's request {bounded(self._asked, QUOTED_BYTES)!r} "
                    "with what the tool results above show.")
            return [*self.messages, {"role": "system", "content": note}]
        disabled = sorted(t.name for t in self.snapshot.tools if t.name not in self.enabled_tools)
        if not disabled:
            return list(self.messages)
        note = f"These tools are disabled now; do not call them: {', '.join(disabled)}."
        return [*self.messages, {"role": "system", "content": note}]

    def round_schema(self, workspace: Path | None = None, forced: str | None = None) -> dict:
        """The union schema of the next round: the answer form alone when `forced`; else over the enabled tools,
        each with its arguments narrowed (to what exists in `workspace` when given, and without calls already done
        in this turn where the grammar can express it; see the module docstring), a tool left with no admissible
        arguments not offered. Every call it admits is one the snapshot's schema admits."""
        quotes = self.answer_quotes()
        if forced is not None:
            return protocol.union_schema((), self.snapshot.calls_per_batch, answers=quotes)
        enabled = self._offered()
        declares = any(self._paths(t) or self._spans(t.name) for t in enabled)
        entries = scan(workspace, self.exclude) if workspace is not None and declares else None
        offered, arguments = [], {}
        for tool in enabled:
            schema = self._arguments(tool, entries)
            if schema is not None:
                offered.append(tool)
                arguments[tool.name] = schema
        return protocol.union_schema(offered, self.snapshot.calls_per_batch, arguments, answers=quotes,
                                     calls_only=self._must_act())

    def _must_act(self) -> bool:
        """Whether the next round must call a tool: under "emelex-tools/3", while the turn has no result yet and
        the request's first clause asks for a tool with `requested_by` words ("Create out.txt ..."), the round is
        the tool-call form alone, so the model does what was asked (the user still approves it) instead of
        answering that it did."""
        return self._v3 and not self._results and bool(self._requested_tools(first=True) & self.enabled_tools)

    def answer_quotes(self) -> list[str] | None:
        """The quotes the next round's answer chooses among (`emelex_workers.agent.quotes`), or None for a free
        answer: under protocol "emelex-tools/3" the quotes of the turn's tool results and of the context notes
        recorded with its input most relevant to the user's request (`quotes.choose`), or, once a tool the
        request asks for (`requested_by`) ran, of that tool's results only; before the turn's first result those of
        the notes and of earlier turns' results, only when one has a word of the request, and
        `request.small_talk_answer` for a request that is only talk. Always None under older protocols."""
        if not self._v3:
            return None
        if not self._results and small_talk(self._asked):
            return [small_talk_answer(self._asked)]
        chosen = choose(self._asked, self._quotes(), relevant_only=not self._results, named=note_files(self._notes))
        return chosen or None

    def answered(self) -> bool:
        """Whether the turn holds its answer, so that its next round is the answer form alone (`forced`
        "answered"): under protocol "emelex-tools/3", once the turn has a result, when a tool the request asks for
        (`requested_by`) ran (the answer then quotes its results only, and no such tool is offered again), or when
        the quotes the answer would choose among answer the request (`quotes.answers`). False under older
        protocols."""
        if not self._v3 or not self._results:
            return False
        return self._effected or answers(self._asked, self._quotes(), note_files(self._notes))

    def _quotes(self) -> list[Quote]:
        """The quotes an answer is chosen among (`answer_quotes`): of the results of the tools the request asks for
        that ran in the turn, when there are any; else of the turn's results (or, before it has any, of earlier
        turns' results) and of the context notes recorded with its input."""
        done = [(call, result) for call, result in self._results or self._earlier
                if result.get("outcome") not in _NOT_DONE and isinstance(result.get("output"), str)]
        results = done if self._results else []
        requested = self._requested_tools()
        effects = [(call, result) for call, result in results
                   if call.tool in requested and result.get("outcome") not in _NO_EFFECT]
        quotes = []
        for call, result in effects or done:
            outcome = result["outcome"]
            label = self._label(call) + ("" if outcome == "ok" else f" ({outcome})")
            quotes += result_quotes(label, result["output"], "" if effects else self._asked)  # an effect: no count
        if not effects:
            quotes += note_quotes(self._notes, self._asked)
        return quotes

    @property
    def _v3(self) -> bool:
        """Whether the Session's protocol is "emelex-tools/3" (quoted answers, tools and arguments narrowed by the
        request)."""
        return self.snapshot.protocol == protocol.PROTOCOL_V3

    def _label(self, call: ProposedCall) -> str:
        """What a quote of `call`'s result is labelled with: the path of a declared "file" or "new" path argument
        (a file read, a file written), or of a "directory" one when it is the call's only string argument (a
        directory listed; "." as "./"); else the tool's name and its string arguments ("search_text pineapple",
        "run_command python3 greet.py"), so that only what a file holds is labelled with its path."""
        authority = self.snapshot.tool(call.tool)
        paths = self._paths(authority) if authority is not None else {}
        strings = {name: v for name, v in call.arguments.items() if isinstance(v, str)}
        for name, kind in paths.items():
            if name in strings and (kind in ("file", "new") or len(strings) == 1):
                return "./" if strings[name] in (".", "") else strings[name]
        return bounded(" ".join([call.tool, *strings.values()]), 80)

    def _offered(self) -> list[ToolAuthority]:
        """The tools the next round offers: the enabled ones; under protocol "emelex-tools/3" narrowed by what the
        request asks for (`_requested_tools`): a tool whose registered spec names `requested_by` words only when
        the request asks for it, and only until one of its calls (or another such tool's) ran in the turn; while
        the turn has no result yet, none for a request that is only talk (`request.small_talk`: "hi", "thanks"),
        and when the request's first clause asks for such a tool, only those tools."""
        enabled = [t for t in self.snapshot.tools if t.name in self.enabled_tools]
        if not self._v3:
            return enabled
        if not self._results and small_talk(self._asked):
            return []
        effects = {t.name for t in enabled if self._requested_by(t.name)}
        requested = self._requested_tools() & effects
        if self._effected:
            return [t for t in enabled if t.name not in effects]
        if not self._results and (first := self._requested_tools(first=True) & effects):
            return [t for t in enabled if t.name in first]
        return [t for t in enabled if t.name not in effects or t.name in requested]

    def _requested_tools(self, first: bool = False) -> set[str]:
        """The snapshot tools the user's request asks for: those whose registered `requested_by` words one of its
        clauses begins with (`request.verbs`, `request.asks_for`: one typo forgiven); with `first`, those its first
        clause begins with."""
        asked = verbs(self._asked)[:1] if first else verbs(self._asked)
        return {t.name for t in self.snapshot.tools if asks_for(asked, self._requested_by(t.name))}

    def _spec(self, name: str) -> ToolSpec:
        """The registered spec of tool `name` (`_UNREGISTERED`, declaring nothing, for a tool not registered here)."""
        registered = self.tools.get(name)
        return registered.spec if registered is not None else _UNREGISTERED

    def _spans(self, name: str) -> Mapping[str, str]:
        return self._spec(name).request_spans

    def _requested_by(self, name: str) -> frozenset[str]:
        return self._spec(name).requested_by

    def _paths(self, tool: ToolAuthority) -> Mapping[str, str]:
        return self._spec(tool.name).workspace_paths

    def _arguments(self, tool: ToolAuthority, entries: WorkspaceEntries | None) -> dict | None:
        """`tool`'s argument schema for the next round, or None when no argument admissible now is left."""
        schema = tool.input_schema
        properties = dict(schema.get("properties", {}))
        required = schema.get("required", [])
        for name, kind in self._paths(tool).items() if entries is not None else ():
            if name not in properties:
                continue
            narrowed = narrow_path(properties[name], kind, entries)
            named = [p for p in mentioned(self._asked) if validate(p, narrowed) is None] \
                if narrowed is not None and kind == "new" and self._v3 else []
            if named:
                properties[name] = {"type": "string", "enum": named}
            elif narrowed is not None:
                properties[name] = narrowed
            elif name in required:
                return None
            else:
                del properties[name]
        for name, kind in self._spans(tool.name).items() if self._v3 else ():
            if name in properties:
                files = frozenset(entries.files) if entries is not None else frozenset()
                offered = spans(self._asked, _program, lambda word: _interpreter(word, files)) \
                    if kind == "command" else set_off(self._asked)
                fitting = [span for span in offered if validate(span, properties[name]) is None]
                if fitting:
                    properties[name] = {**properties[name], "enum": fitting}
        if len(properties) == 1:
            (name, only), = properties.items()
            if "enum" in only and set(only) <= _ENUM_ONLY:
                left = [v for v in only["enum"] if call_key(tool.name, {name: v}) not in self._done]
                if left:
                    properties[name] = {**only, "enum": left}
                elif name in required:
                    return None
                else:
                    del properties[name]
        if not properties and call_key(tool.name, {}) in self._done:
            return None
        return {**schema, "properties": properties}

    def generate_round(self, *, stop: threading.Event, on_token: Callable[[str], None] | None = None,
                       workspace: Path | None = None, forced: str | None = None,
                       on_progress: Callable[[GenerationProgress], None] | None = None) -> RoundOutput:
        """One constrained model round, streamed to `on_token` (and its progress to `on_progress`, when the
        binding's `stream_chat` reports it), under `round_schema(workspace, forced)`;
        `GenerationInterrupted` when `stop` was set between tokens, `RoundOutputError` when the output is not a
        valid round (blaming the token limit only when the round used all of its tokens). A string (an answer, an
        argument) that runs into a runaway repetition (`protocol.runaway_at`, looked for in its last
        `RUNAWAY_WINDOW` characters) is ended there through the binding's stop event: the round is its text up to
        the end of the repetition's first copy, closed as JSON, `stopped` "repetition" (`RoundOutputError` when
        that is no valid round). The streamed text is read once, as it comes (`protocol.StringScanner`), so a
        round costs time in proportion to its length. Does not change `messages`."""
        limit = self.snapshot.round_tokens
        reports = {} if on_progress is None or not accepts_keyword(self.binding.stream_chat, "on_progress") \
            else {"on_progress": on_progress}
        ended = _RoundStop(stop)
        pieces: list[str] = []
        scanner = protocol.StringScanner()  # each streamed character read once: a round costs its length

        def on_text(piece: str) -> None:
            pieces.append(piece)
            if on_token is not None:
                on_token(piece)
            scanner.feed(piece)
            inside = scanner.tail(RUNAWAY_WINDOW)
            if inside is not None and protocol.runaway_at(inside.text) is not None:
                ended.set()

        try:
            raw = self.binding.stream_chat(
                self.round_messages(forced), max_tokens=limit, json_schema=self.round_schema(workspace, forced),
                stop=ended, on_text=on_text, temperature=self.snapshot.temperature, seed=self.snapshot.seed,
                **reports)
        except GenerationInterrupted:
            if stop.is_set() or not ended.is_set():
                raise
            inside = scanner.tail(RUNAWAY_WINDOW)
            cut = inside.offsets[protocol.runaway_at(inside.text)]
            closed = "".join(pieces)[:cut].rstrip() + '"' + inside.closers
            out = protocol.parse_round(closed)
            return dataclasses.replace(out, stopped="repetition")
        used = max(len(pieces), self.binding.count_tokens(raw)) if raw else 0
        return protocol.parse_round(raw, token_limit=limit if used >= limit else None)

    def gate(self, call: ProposedCall) -> str | None:
        """Why `call` must not run now (not a snapshot tool, disabled, invalid arguments), or None."""
        return protocol.gate(call, self.snapshot, self.enabled_tools)


def _program(word: str) -> bool:
    """Whether `word` names a program on PATH (a command starts with one)."""
    return "/" not in word and shutil.which(word) is not None


INTERPRETERS = {".py": "python3", ".sh": "sh", ".js": "node", ".rb": "ruby", ".pl": "perl"}


def _interpreter(word: str, files: frozenset[str]) -> str | None:
    """The interpreter that runs `word` when it is a script of `files` (workspace-relative paths) with a suffix of
    `INTERPRETERS` whose program is on PATH; else None."""
    interpreter = INTERPRETERS.get(os.path.splitext(word)[1])
    return interpreter if word in files and interpreter and shutil.which(interpreter) else None


_UNREGISTERED = ToolSpec("unregistered", "A snapshot tool no plugin registers here.", {}, lambda invocation: None)


class _RoundStop(threading.Event):
    """The stop event one round is generated under: set by the round itself (a runaway repetition), and set too
    whenever the turn's own stop event (`outer`) is."""

    def __init__(self, outer: threading.Event) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        """True once this round or the turn was stopped."""
        return super().is_set() or self._outer.is_set()
