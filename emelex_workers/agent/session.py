"""`AgentSession`: the in-memory half of an agent: model messages, the bound model, the snapshot's tools and the
enabled subset. It touches no database; `DurableAgentSession` (in `durable.py`) drives it and persists."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from emelex_memory import Event
from emelex_memory.agent.journal import UnknownEffect
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_workers.host.types import AgentBinding, GenerationInterrupted

from . import protocol
from .errors import UnknownToolError
from .protocol import ProposedCall, RoundOutput
from .tools import RegisteredTool


class AgentSession:
    """Messages, model, tools and the protocol for one agent Session, in memory.

    `enabled_tools` starts as every snapshot tool; `disable_tool` and
    `enable_tool` only remove or restore snapshot tools (never grant a new
    one). `generate_round` is blocking: run it on the model thread, one call
    at a time.
    """

    def __init__(self, binding: AgentBinding, snapshot: SessionSnapshot, tools: Mapping[str, RegisteredTool]) -> None:
        """An agent over `binding` and `snapshot`; `tools` are the registered tools that run the snapshot's calls."""
        self.binding = binding
        self.snapshot = snapshot
        self.tools = dict(tools)
        self.enabled_tools: frozenset[str] = frozenset(t.name for t in snapshot.tools)
        self.messages: list[dict[str, str]] = protocol.history_messages(snapshot, ())

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
        (see `protocol.history_messages`)."""
        self.messages = protocol.history_messages(self.snapshot, events, unknown)

    def add_context(self, payload: dict) -> None:
        """Append a context note (see `protocol.context_message`)."""
        self.messages.append(protocol.context_message(payload))

    def add_user(self, text: str) -> None:
        """Append the user's input."""
        self.messages.append({"role": "user", "content": text})

    def add_batch(self, round: int, calls: Sequence[tuple[str, ProposedCall]], results: Sequence[dict]) -> None:
        """Append one complete round: the assistant's calls `(call_id, call)` and their `tool_result` payloads."""
        payload = {"round": round, "calls": [{"call_id": cid, "tool": c.tool, "arguments": c.arguments}
                                             for cid, c in calls]}
        self.messages.append({"role": "assistant", "content": protocol.calls_text(payload)})
        self.messages.append({"role": "user", "content": "\n".join(protocol.result_text(r) for r in results)})

    def add_answer(self, text: str) -> None:
        """Append the assistant's final answer."""
        self.messages.append({"role": "assistant", "content": protocol.answer_text(text)})

    def round_messages(self) -> list[dict[str, str]]:
        """The messages a round is generated from: the history plus, while tools are disabled, a note naming them."""
        disabled = sorted(t.name for t in self.snapshot.tools if t.name not in self.enabled_tools)
        if not disabled:
            return list(self.messages)
        note = f"These tools are disabled now; do not call them: {', '.join(disabled)}."
        return [*self.messages, {"role": "system", "content": note}]

    def round_schema(self) -> dict:
        """The union schema of the next round, over the enabled tools only."""
        enabled = [t for t in self.snapshot.tools if t.name in self.enabled_tools]
        return protocol.union_schema(enabled, self.snapshot.calls_per_batch)

    def generate_round(self, *, stop: threading.Event, on_token: Callable[[str], None] | None = None) -> RoundOutput:
        """One constrained model round, streamed to `on_token`; `GenerationInterrupted` when `stop` was set
        between tokens, `RoundOutputError` when the output is not a valid round (blaming the token limit only when
        the round used all of its tokens). An answer that runs into a runaway repetition (`protocol.runaway_at`)
        is ended there through the binding's stop event: the round is that answer up to the repetition, `stopped`
        "repetition". Does not change `messages`."""
        limit = self.snapshot.round_tokens
        ended = _RoundStop(stop)
        pieces: list[str] = []

        def on_text(piece: str) -> None:
            pieces.append(piece)
            if on_token is not None:
                on_token(piece)
            answer = protocol.partial_answer("".join(pieces))
            if answer and protocol.runaway_at(answer) is not None:
                ended.set()

        try:
            raw = self.binding.stream_chat(
                self.round_messages(), max_tokens=limit, json_schema=self.round_schema(), stop=ended,
                on_text=on_text, temperature=self.snapshot.temperature, seed=self.snapshot.seed)
        except GenerationInterrupted:
            if stop.is_set() or not ended.is_set():
                raise
            raw = "".join(pieces)
            answer = protocol.partial_answer(raw)
            return RoundOutput(raw, answer[:protocol.runaway_at(answer)].rstrip(), (), stopped="repetition")
        used = max(len(pieces), self.binding.count_tokens(raw)) if raw else 0
        return protocol.parse_round(raw, token_limit=limit if used >= limit else None)

    def gate(self, call: ProposedCall) -> str | None:
        """Why `call` must not run now (not a snapshot tool, disabled, invalid arguments), or None."""
        return protocol.gate(call, self.snapshot, self.enabled_tools)


class _RoundStop(threading.Event):
    """The stop event one round is generated under: set by the round itself (a runaway repetition), and set too
    whenever the turn's own stop event (`outer`) is."""

    def __init__(self, outer: threading.Event) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        """True once this round or the turn was stopped."""
        return super().is_set() or self._outer.is_set()
