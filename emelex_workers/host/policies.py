"""Turn policies: how a turn of an agent Session is guided, one object behind a small interface.

The durable adapter (`emelex_workers.agent`) keeps every guarantee for every model: the journal, the snapshot, the
execution gate, recovery. What a round may propose (which tools, which arguments), how an answer is formed (free, or
chosen among quotes) and when one is forced belongs to a `TurnPolicy`. A Session's snapshot records the policy it
runs (`name` and `version`), so a resumed Session is guided exactly as it was; a policy is a pure function of the
recorded history (the `TurnState`) and of what the workspace holds, and it can only narrow: the gate checks every
call against the snapshot's authority whatever a round offered.

`TurnPolicy` itself is the *open* policy: every enabled tool offered in every round with its arguments as its
schema allows, a free answer, an answer forced only at the chain limit. A policy overrides what it constrains.
Plugins add policies through the `register_policies(register)` hook (docs/plugins.md); the built-in ones ("guided"
for small models, "open" for capable ones) live in `emelex_workers.agent.policies`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority

from .notes import ContextNote
from .tools import ToolSpec, bounded
from .types import ProposedCall

__all__ = ["GRAMMAR_PROTOCOL", "NATIVE_PROTOCOL", "POLICY_NAME", "QUOTED_BYTES", "TurnPolicy", "TurnState",
           "WorkspaceEntries", "WorkspaceView", "call_key"]

POLICY_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
NATIVE_PROTOCOL = "openai-tools/1"  # the protocol of a Session whose tools are called natively (the OpenAI `tools`)
GRAMMAR_PROTOCOL = "emelex-tools/2"  # the protocol of a free-answer Session whose rounds are a constrained JSON union
QUOTED_BYTES = 200  # of the user's request, quoted in the note of a forced round


def call_key(tool: str, arguments: dict) -> str:
    """The identity of a call: its tool and its canonical arguments (identical calls have equal keys)."""
    return json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class WorkspaceEntries:
    """What a round may name in the workspace, as workspace-relative paths ("/" separators), nearest first: regular
    `files` and `directories` ("." is the workspace itself, always first)."""

    files: tuple[str, ...] = ()
    directories: tuple[str, ...] = (".",)


class WorkspaceView(Protocol):
    """The turn's walk of its workspace (`emelex_workers.agent.workspace.WorkspaceWalk`): read through it, so a turn
    reads each directory once."""

    workspace: Path

    def entries(self) -> WorkspaceEntries:
        """What a round may name (hidden, skipped and symlinked entries left out), read once per turn."""


_UNREGISTERED = ToolSpec("unregistered", "A snapshot tool no plugin registers here.", {}, lambda invocation: None)


@dataclass(frozen=True)
class TurnState:
    """What a policy reads of the turn so far, rebuilt from the recorded history on resume: the user's `request`,
    the calls completed in this turn (`results`: each call with its `tool_result` payload, in order) and in earlier
    turns (`earlier`, the latest ones), the context `notes` recorded with the turn's input, the keys (`call_key`) of
    the calls `done` in this turn since the last call that may have changed the workspace, the Session's `snapshot`,
    the tools `enabled` now, the registered `specs` of the snapshot's tools, the turn's `walk` of the workspace
    (None when the round has no workspace) and the `previous` turn's answer ("" when there is none)."""

    request: str
    results: tuple[tuple[ProposedCall, dict], ...]
    earlier: tuple[tuple[ProposedCall, dict], ...]
    notes: tuple[ContextNote, ...]
    done: frozenset[str]
    snapshot: SessionSnapshot
    enabled: frozenset[str]
    specs: Mapping[str, ToolSpec] = field(default_factory=dict)
    walk: WorkspaceView | None = None
    previous: str = ""

    def spec(self, name: str) -> ToolSpec:
        """The registered spec of tool `name` (one declaring nothing for a tool no plugin registers here)."""
        return self.specs.get(name, _UNREGISTERED)

    def enabled_tools(self) -> list[ToolAuthority]:
        """The snapshot's tools that are enabled now, in the snapshot's order."""
        return [t for t in self.snapshot.tools if t.name in self.enabled]


class TurnPolicy:
    """How a turn is guided; this base class is the open policy (see the module docstring). Subclass it, set `name`
    ([a-z][a-z0-9_]{0,47}), `version` (bump it whenever what a round offers changes, so a Session made with the old
    rules is refused rather than guided differently) and `summary`, and override what the policy constrains. Every
    method is a pure function of its arguments; none may widen what the snapshot allows."""

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    summary: ClassVar[str] = ("every enabled tool offered in every round, its arguments as its schema allows; the "
                              "model answers in its own words")
    # The semantics a new Session under this policy gets (its snapshot records them): the token limit of a round,
    # the most tool rounds in a turn and the most calls in one round.
    round_tokens: ClassVar[int] = 1024
    chain_limit: ClassVar[int] = 8
    calls_per_batch: ClassVar[int] = 4
    answer_chars: ClassVar[int | None] = None  # a free answer's bound in characters (None: the round's tokens)
    forces_repeat: ClassVar[bool] = False  # a round whose results were all repeats forces an answer
    note_source: ClassVar[str | None] = None  # the `source` of the note `turn_note` records

    def protocol(self, native: bool) -> str:
        """The protocol a new Session under this policy runs with: how its messages read and how a round is asked
        for. `native`: the binding calls tools natively (it sends them in the OpenAI `tools` field and reads
        `tool_calls`); else every round is one constrained JSON union."""
        return NATIVE_PROTOCOL if native else GRAMMAR_PROTOCOL

    def turn_note(self, workspace: Path, request: str, walk: WorkspaceView) -> ContextNote | None:
        """A note recorded with the turn's input, before it (`note_source` names it), or None for none. Runs on the
        tool thread, once per turn; the resumed Session replays it instead. None here."""
        return None

    def offered(self, turn: TurnState) -> list[ToolAuthority]:
        """The tools the next round offers: a subset of the enabled ones. All of them here."""
        return turn.enabled_tools()

    def arguments(self, turn: TurnState, tool: ToolAuthority) -> dict | None:
        """`tool`'s arguments schema for the next round: its recorded `input_schema` or a restriction of it, or None
        to leave the tool out of the round (nothing admissible left). The schema as recorded here."""
        return tool.input_schema

    def answers(self, turn: TurnState) -> list[str] | None:
        """The quotes the next round's answer chooses among, or None for an answer in the model's own words. None
        here."""
        return None

    def must_act(self, turn: TurnState) -> bool:
        """Whether the next round must call a tool (no answer admitted). False here."""
        return False

    def answered(self, turn: TurnState) -> bool:
        """After a round of tool calls: whether the turn holds its answer, so that the next round is the answer form
        alone (forced "answered"). False here: only the chain limit forces an answer."""
        return False

    def forced_note(self, reason: str, turn: TurnState) -> str:
        """The system note (never history) in front of a round forced to answer: `reason` is "chain_limit",
        "repeat" or "answered"."""
        why = {"chain_limit": f"this turn has used its {turn.snapshot.chain_limit} tool rounds",
               "repeat": "the last tool calls told you nothing new",
               "answered": "the tool results above answer it"}[reason]
        return (f"No more tool calls ({why}). Answer the user's request {bounded(turn.request, QUOTED_BYTES)!r} "
                "with what the tool results above show.")

    def disabled_note(self, names: Sequence[str]) -> str:
        """The system note in front of a round while the snapshot tools `names` are disabled in this chat."""
        return f"These tools are disabled now; do not call them: {', '.join(names)}."

    def describe(self) -> dict[str, Any]:
        """What a snapshot records of this policy: its name and version."""
        return {"name": self.name, "version": self.version}

    def at_version(self, version: int) -> TurnPolicy | None:
        """This policy as it was at `version`, for a Session that recorded it: itself at its own version; a policy
        that still provides an older version's rules returns them; None when it does not (the Session is refused)."""
        return self if version == self.version else None
