"""Context notes: what a Session records before its first model round, so the model starts knowing it.

A Session's snapshot names its context sources (`SessionSnapshot.context`,
in order). On the Session's first turn, before the first model round, the
adapter calls each named source once with a `ContextRequest`; a source
returns a JSON payload (a `ContextNote`, `emelex_workers.host.notes`: the
one contract of every note and its quotes' labels) whose string "text" is what the model sees (one
system message, at that place in the history; the source writes its own
label) and whose other fields are recorded with it (what was selected and
from where), or None to record nothing. The adapter adds "source" (the
source's name) and records every payload as a transcript event of kind
`context` in the transaction that records the turn's user input, before it
(`journal.open_turn`). A resumed Session replays those events and never
calls a source again, so it sees exactly what it saw, whatever changed since.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_memory.agent.journal import CONTEXT_KIND
from emelex_memory.agent.snapshot import SessionSnapshot, canonical_json
from emelex_memory.errors import InvalidInputError, SnapshotMismatchError

from emelex_workers.host.notes import ContextNote

from .workspace import WorkspaceWalk

__all__ = ["CONTEXT_KIND", "ContextRequest", "ContextSource", "check_sources", "gather"]


@dataclass(frozen=True)
class ContextRequest:
    """What a context source is asked with: the `store` (read it; never write), the new Session's ID, its
    `workspace` directory, the `first_message` the user typed, the Session's `snapshot` and the turn's `walk` of
    the workspace (`emelex_workers.agent.workspace.WorkspaceWalk`: read the workspace through it, so the turn reads
    each directory once; None: walk it yourself)."""

    store: MemoryStore
    session_id: str
    workspace: Path
    first_message: str
    snapshot: SessionSnapshot
    walk: WorkspaceWalk | None = None


ContextSource = Callable[[ContextRequest], "ContextNote | None"]


def check_sources(snapshot: SessionSnapshot, sources: Mapping[str, ContextSource]) -> None:
    """Every source the snapshot names must be given; `SnapshotMismatchError` (field "context") names the first
    missing one."""
    missing = [name for name in snapshot.context if name not in sources]
    if missing:
        error = SnapshotMismatchError(
            f"the Session's snapshot records context source {missing[0]!r}, which this host does not provide; use "
            "the host (and plugin versions) the Session was created with, or start a new Session"
        )
        error.field = "context"
        raise error


def gather(sources: Mapping[str, ContextSource], request: ContextRequest) -> tuple[ContextNote, ...]:
    """The payloads of the sources `request.snapshot` names, in its order, each with "source" set to its name; a
    source that returns None adds nothing. `InvalidInputError` names a source whose payload is not a JSON object
    with a string "text"."""
    payloads = []
    for name in request.snapshot.context:
        payload = sources[name](request)
        if payload is None:
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise InvalidInputError(f'context source {name!r} returned {type(payload).__name__}, not a JSON object '
                                    'with a string "text"')
        payload = {**payload, "source": name}
        canonical_json(payload)  # plain JSON only
        payloads.append(payload)
    return tuple(payloads)
