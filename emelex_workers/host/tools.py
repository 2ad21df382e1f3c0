"""The types a tool plugin exchanges with the agent: the `ToolSpec` it registers through the `register_tools` hook,
the `ToolInvocation` its `run` receives and the `ToolOutput` it returns.

The agent checks and runs the specs (`emelex_workers.agent.tools`); a plugin imports these types from
`emelex_workers.plugin_api`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from emelex_memory import AssetRef, MemoryStore

__all__ = ["REQUEST_SPAN_KINDS", "WORKSPACE_PATH_KINDS", "RequestSpanKind", "ToolInvocation", "ToolOutput", "ToolSpec",
           "WorkspacePathKind", "bounded"]

WorkspacePathKind = Literal["file", "directory", "existing", "new"]
WORKSPACE_PATH_KINDS: tuple[str, ...] = ("file", "directory", "existing", "new")
RequestSpanKind = Literal["command", "text", "held"]
REQUEST_SPAN_KINDS: tuple[str, ...] = ("command", "text", "held")


@dataclass(frozen=True)
class ToolInvocation:
    """One call of a tool: its `call_id` (unique in the Session: an idempotency key), the tool's name, the
    validated `arguments`, the Session's `workspace` directory (the tool must stay inside it), the `store`
    (for `put_asset`; None for an agent without a database), the calling Session's `session_id` and `turn_seq`,
    the seq of the user input that opened the calling turn (the turn's events are that seq through the
    Session's last one; both None for an agent without a database). `process_recorder` is the agent's: a tool
    calls `track_process`, not it."""

    call_id: str
    tool: str
    arguments: dict
    workspace: Path
    store: MemoryStore | None = None
    session_id: str | None = None
    turn_seq: int | None = None
    process_recorder: Callable[[int, str], None] | None = field(default=None, repr=False, compare=False)

    def track_process(self, pid: int, label: str = "") -> None:
        """Record that this call started process `pid` (`label` says what it is, e.g. the command), which may
        outlive the process running the tool: its process group, start time and boot identity are written to
        the Session's journal before this returns. While it runs, `emelex memory sessions recover` and `emelex
        chat --resume` refuse to settle this call's effect, naming it, and `recover --stop-running` stops its
        group. Call it right after the process started and before it does anything that matters (the built-in
        `run_command` starts its shell waiting on a pipe and lets it run the command only once this returned).
        Raises `EmelexError` when it could not be recorded (then stop the process and return an error); does
        nothing for an agent without a database."""
        if self.process_recorder is not None:
            self.process_recorder(pid, label)


@dataclass(frozen=True)
class ToolOutput:
    """What a call produced: `text` (a string or a JSON object) for the model, whether it is an error, and the
    assets it refers to."""

    text: str | dict
    is_error: bool = False
    assets: tuple[AssetRef, ...] = ()


@dataclass(frozen=True)
class ToolSpec:
    """A tool a plugin offers: `name` ([a-z][a-z0-9_]{0,47}, unique across plugins), `description` (at most
    1024 characters, shown to the model), `input_schema` (a JSON-schema object in the subset of
    `emelex_workers.agent.schema`), `run` (synchronous; runs on a worker thread), `approval` ("always": the
    user approves each call; "never": read-only tools), `max_output_bytes` (larger output becomes an
    asset) and `workspace_paths`: which top-level string arguments name workspace paths, and of what kind
    ("file": an existing regular file, "directory": an existing directory, "existing": either, "new": a file
    to create or replace under an existing directory). Each round's grammar narrows those arguments to what
    exists in the workspace then; the recorded authority (`input_schema`) and the gate are unchanged by it.
    `requested_by`: the verbs (lowercase, no plural "s") a user's request begins a clause with when it asks for
    this tool's effect ("create", "run"); under the "guided" turn policy the tool is offered only in a turn whose
    request asks for it so (`emelex_workers.agent.policies.guided.request.verbs`), so a question never leads a small
    model to a write; empty (the default): offered in every turn. `request_spans`: string arguments the user's
    request spells out, and how: "command" (a command to run: the guided policy narrows it to the request's quoted
    parts and runs of its words that begin with a program's name, `request.spans`) or "text" (text to write:
    narrowed to what the request sets off in quotes or after a colon, `request.set_off`, when it sets off any) or
    "held" (a text the file the call changes holds, which it replaces: narrowed to texts of that file the Session
    read, "" for none: `guided.held`).
    Other policies (the "open" one) may ignore both. `preview`: what a call would do, as text a person reads at the
    call's approval prompt instead of its arguments (a unified diff of a file's change, a command and its working
    directory); it must change nothing; None (the default), or a preview that raises: the arguments are shown."""

    name: str
    description: str
    input_schema: dict
    run: Callable[[ToolInvocation], ToolOutput]
    approval: Literal["always", "never"] = "always"
    max_output_bytes: int = 65_536
    workspace_paths: Mapping[str, WorkspacePathKind] = field(default_factory=dict)
    requested_by: frozenset[str] = frozenset()
    request_spans: Mapping[str, RequestSpanKind] = field(default_factory=dict)
    preview: Callable[[ToolInvocation], str] | None = None


def bounded(text: str, limit: int = 2048) -> str:
    """`text` cut to at most `limit` UTF-8 bytes (on a character boundary), marked with "..." when cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."
