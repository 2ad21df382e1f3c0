"""`AgentSession`: the in-memory half of an agent: model messages, the bound model, the snapshot's tools and the
enabled subset, and what each round offers. It touches no database; `DurableAgentSession` (in `durable.py`) drives
it and persists.

What a round may propose, how its answer is formed and when an answer is forced is the Session's turn policy's
(`emelex_workers.host.policies.TurnPolicy`, the one its snapshot records: `policies.policy_for`); this class keeps
what every policy shares: the turn's record (the `TurnState` a policy reads, rebuilt from the replayed history on
resume), no identical call run twice in a turn, and a round's plan (`RoundPlan`) that is never wider than the
snapshot. The gate checks every call against the snapshot only. Where the round's constraint is out of this
process's hands (a binding whose server applies the grammar, `AgentBinding.remote_constraint`, or a round whose tools
are called natively) a call the round did not offer is refused too (`refusal`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from emelex_memory import Event
from emelex_memory.agent.journal import CONTEXT_KIND, REPEATED, UnknownEffect
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority
from emelex_memory.sessions.transcript import SUMMARY_KIND
from emelex_workers.host.manager import accepts_keyword
from emelex_workers.host.policies import TurnPolicy, TurnState, call_key
from emelex_workers.host.types import AgentBinding, GenerationInterrupted, GenerationProgress, ProposedCall, \
    event_body

from . import protocol
from .errors import UnknownToolError
from .policies import policy_for
from .protocol import RoundOutput
from .schema import validate
from .tools import RegisteredTool
from .workspace import WorkspaceWalk

__all__ = ["EARLIER_RESULTS", "AgentSession", "RoundPlan", "call_key"]

_NOT_DONE = ("not_executed", REPEATED)  # outcomes that do not make a call "already done"
_NO_EFFECT = ("denied", "not_executed", REPEATED)  # outcomes of a call that cannot have changed the workspace
EARLIER_RESULTS = 50  # results of earlier turns a policy may read (`TurnState.earlier`)
# The end of a streamed string a runaway repetition is looked for in, after each piece: a round's whole string
# fits (round_tokens of a few characters each), and the cost per piece stays the same however long a reply gets
RUNAWAY_WINDOW = 4096


@dataclass(frozen=True)
class RoundPlan:
    """What one round offers: the `tools` (each with its `arguments` schema for this round), the `answers` its
    answer chooses among (None: a free answer, at most `answer_chars` characters when that is set), whether the
    round must call a tool (`calls_only`) or must answer (`answer_only`: it offers no tool), and at most
    `calls_per_batch` calls."""

    tools: tuple[ToolAuthority, ...]
    arguments: Mapping[str, dict]
    answers: list[str] | None
    answer_chars: int | None
    calls_only: bool
    calls_per_batch: int

    @property
    def answer_only(self) -> bool:
        """True when the round offers no tool: its output can only be an answer."""
        return not self.tools

    def schema(self) -> dict:
        """The union JSON schema a round under this plan is generated under (`protocol.union_schema`)."""
        return protocol.union_schema(self.tools, self.calls_per_batch, self.arguments, answers=self.answers,
                                     calls_only=self.calls_only, answer_chars=self.answer_chars)

    def native_tools(self) -> list[dict]:
        """The round's tools as OpenAI function tools (for a binding that calls tools natively): each with its
        description and this round's arguments schema."""
        return [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                  "parameters": self.arguments[tool.name]}} for tool in self.tools]

    def refusal(self, call: ProposedCall, index: int) -> str | None:
        """Why `call`, the `index`-th (from 0) of its round, is outside this plan (a tool the round did not offer,
        arguments outside its narrowing, a call past the round's count), or None."""
        if index >= self.calls_per_batch:
            return f"this round allows at most {self.calls_per_batch} tool calls; this one was not run"
        if call.tool not in self.arguments:
            return f"tool {call.tool!r} was not offered in this round"
        problem = validate(call.arguments, self.arguments[call.tool])
        return f"not offered in this round: {problem}" if problem else None


class AgentSession:
    """Messages, model, tools, the turn policy and the protocol for one agent Session, in memory.

    `enabled_tools` starts as every snapshot tool; `disable_tool` and
    `enable_tool` only remove or restore snapshot tools (never grant a new
    one). `generate_round` is blocking: run it on the model thread, one call
    at a time.
    """

    def __init__(self, binding: AgentBinding, snapshot: SessionSnapshot, tools: Mapping[str, RegisteredTool], *,
                 exclude: Collection[tuple[int, int]] = (), policy: TurnPolicy | None = None) -> None:
        """An agent over `binding` and `snapshot`; `tools` are the registered tools that run the snapshot's calls
        (their specs tell the policy what they declare); `exclude` holds the (st_dev, st_ino) of directories a round
        never offers (the Emelex Home); `policy` is the snapshot's turn policy (default: the built-in one it records,
        `policies.policy_for`)."""
        self.binding = binding
        self.snapshot = snapshot
        self.policy = policy_for(snapshot) if policy is None else policy
        self.tools = dict(tools)
        self.exclude = frozenset(exclude)
        self.enabled_tools: frozenset[str] = frozenset(t.name for t in snapshot.tools)
        self.messages: list[dict] = protocol.history_messages(snapshot, ())
        self._done: dict[str, dict] = {}  # call key -> result of that call, done in this turn since the last effect
        self._seen: set[str] = set()  # (tool, outcome, output) of every result in this turn
        self._results: list[tuple[ProposedCall, dict]] = []  # every call completed in this turn, with its result
        self._earlier: list[tuple[ProposedCall, dict]] = []  # those of earlier turns, the latest EARLIER_RESULTS
        self._notes: list[dict] = []  # the context notes recorded with the latest turn's input
        self._pending: list[dict] = []  # the context notes added since, for the next input
        self._asked = ""  # the user's input of the latest turn
        self._previous = ""  # the answer of the turn before it
        self.walk: WorkspaceWalk | None = None  # the turn's walk of the workspace (set by the adapter per turn)
        self.plan: RoundPlan | None = None  # the plan of the latest round generated

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
        self._notes, self._pending, self._previous = [], [], ""
        calls: dict[str, ProposedCall] = {}
        for event in events:
            payload = event.payload if event.kind != SUMMARY_KIND else None
            if event.kind == CONTEXT_KIND and isinstance(payload, dict):
                self._pending.append(payload)
            elif event.kind in ("user", "assistant", "turn_failed", SUMMARY_KIND):
                self._new_turn()
                if event.kind == "assistant":
                    self._previous = event_body(event)
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
        workspace: what was done before it no longer counts as done, and the
        turn's walk reads the workspace again.
        """
        outcome = result.get("outcome")
        self._results.append((call, result))
        authority = self.snapshot.tool(call.tool)
        if authority is not None and authority.approval == "always" and outcome not in _NO_EFFECT:
            self._done.clear()
            if self.walk is not None:
                self.walk.forget()  # what the workspace holds may have changed: read it again
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
        self.messages.extend(protocol.batch_messages(self.snapshot, payload, results))

    def add_answer(self, text: str) -> None:
        """Append the assistant's final answer; the turn is over."""
        self._new_turn()
        self._previous = text
        self.messages.append(protocol.answer_message(self.snapshot, text))

    def turn_state(self, workspace: Path | None = None) -> TurnState:
        """What the policy reads of the turn so far (see `TurnState`), with the turn's walk of `workspace` (None:
        the round has no workspace)."""
        return TurnState(self._asked, tuple(self._results), tuple(self._earlier), tuple(self._notes),
                         frozenset(self._done), self.snapshot, self.enabled_tools,
                         {name: tool.spec for name, tool in self.tools.items()},
                         None if workspace is None else self._walk(workspace), self._previous)

    def round_messages(self, forced: str | None = None) -> list[dict]:
        """The messages a round is generated from: the history plus, when the turn is `forced` to end ("chain_limit",
        "repeat" or "answered"), the policy's note to answer from the results in context, else, while tools are
        disabled, its note naming them. The notes are never part of `messages`."""
        if forced is not None:
            return [*self.messages, {"role": "system", "content": self.policy.forced_note(forced, self.turn_state())}]
        disabled = sorted(t.name for t in self.snapshot.tools if t.name not in self.enabled_tools)
        if not disabled:
            return list(self.messages)
        return [*self.messages, {"role": "system", "content": self.policy.disabled_note(disabled)}]

    def round_plan(self, workspace: Path | None = None, forced: str | None = None) -> RoundPlan:
        """What the next round offers: the answer form alone when `forced`; else the tools the policy offers of the
        enabled ones, each with the arguments the policy admits now (with the workspace's entries, when given: its
        paths narrowed to what exists), a tool left with nothing admissible not offered. Every call it admits is one
        the snapshot's schema admits."""
        policy, turn = self.policy, self.turn_state(workspace)
        answers = policy.answers(turn)
        if forced is not None:
            return RoundPlan((), {}, answers, policy.answer_chars, False, self.snapshot.calls_per_batch)
        offered, arguments = [], {}
        for tool in policy.offered(turn):
            if tool.name not in self.enabled_tools:
                continue  # a policy narrows; it never offers a disabled tool
            schema = policy.arguments(turn, tool)
            if schema is not None:
                offered.append(tool)
                arguments[tool.name] = schema
        return RoundPlan(tuple(offered), arguments, answers, policy.answer_chars,
                         bool(offered) and policy.must_act(turn), self.snapshot.calls_per_batch)

    def round_schema(self, workspace: Path | None = None, forced: str | None = None) -> dict:
        """The union schema of the next round (`round_plan(workspace, forced).schema()`)."""
        return self.round_plan(workspace, forced).schema()

    def _walk(self, workspace: Path) -> WorkspaceWalk:
        """The turn's walk (`walk`) when it is of `workspace`, else a walk of `workspace` of its own."""
        if self.walk is not None and self.walk.workspace == Path(workspace):
            return self.walk
        return WorkspaceWalk(workspace, self.exclude)

    def answer_quotes(self) -> list[str] | None:
        """The quotes the next round's answer chooses among, as the policy decides (None: a free answer)."""
        return self.policy.answers(self.turn_state())

    def answered(self) -> bool:
        """Whether the turn holds its answer, so that its next round is the answer form alone (forced "answered"),
        as the policy decides."""
        return self.policy.answered(self.turn_state())

    def generate_round(self, *, stop: threading.Event, on_token: Callable[[str], None] | None = None,
                       workspace: Path | None = None, forced: str | None = None,
                       on_progress: Callable[[GenerationProgress], None] | None = None) -> RoundOutput:
        """One constrained model round, streamed to `on_token` (and its progress to `on_progress`, when the
        binding's `stream_chat` reports it), under `round_plan(workspace, forced)` (kept as `plan`);
        `GenerationInterrupted` when `stop` was set between tokens, `RoundOutputError` when the output is not a
        valid round (blaming the token limit only when the round used all of its tokens). A string (an answer, an
        argument) that runs into a runaway repetition (`protocol.runaway_at`, looked for in its last
        `RUNAWAY_WINDOW` characters) is ended there through the binding's stop event: the round is its text up to
        the end of the repetition's first copy, closed as JSON, `stopped` "repetition" (`RoundOutputError` when
        that is no valid round). The streamed text is read once, as it comes (`protocol.StringScanner`), so a
        round costs time in proportion to its length. Does not change `messages`."""
        limit = self.snapshot.round_tokens
        native = self.snapshot.protocol == protocol.PROTOCOL_NATIVE
        generate = self.binding.stream_tool_round if native else self.binding.stream_chat
        reports = {} if on_progress is None or not accepts_keyword(generate, "on_progress") \
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

        plan = self.plan = self.round_plan(workspace, forced)
        wire = {"tools": plan.native_tools(), "tool_choice": "required" if plan.calls_only else "auto",
                "calls_per_batch": plan.calls_per_batch} if native else {"json_schema": plan.schema()}
        try:
            raw = generate(self.round_messages(forced), max_tokens=limit, stop=ended, on_text=on_text,
                           temperature=self.snapshot.temperature, seed=self.snapshot.seed, **wire, **reports)
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

    def refusal(self, call: ProposedCall, index: int) -> str | None:
        """Why `call`, the `index`-th (from 0) of the latest round, must not run: the gate's reason, else (unless it
        is answered from an identical earlier call, `earlier_result`) why the round's plan did not offer it
        (`RoundPlan.refusal`) when the round's constraint was a server's (`checks_plan`); None when it may run."""
        reason = self.gate(call)
        if reason is not None or self.earlier_result(call) is not None or self.plan is None or not self.checks_plan:
            return reason
        return self.plan.refusal(call, index)

    @property
    def checks_plan(self) -> bool:
        """Whether a round's calls are checked against its plan: when a server, not this process, constrained the
        round (`AgentBinding.remote_constraint`, or tools called natively: protocol `openai-tools/1`)."""
        return self.snapshot.protocol == protocol.PROTOCOL_NATIVE or bool(getattr(self.binding, "remote_constraint",
                                                                                  False))


class _RoundStop(threading.Event):
    """The stop event one round is generated under: set by the round itself (a runaway repetition), and set too
    whenever the turn's own stop event (`outer`) is."""

    def __init__(self, outer: threading.Event) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        """True once this round or the turn was stopped."""
        return super().is_set() or self._outer.is_set()
