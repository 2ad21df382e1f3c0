"""Explicit recovery of an agent Session's interrupted turn (`emelex memory sessions recover`); never runs a tool."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import LeaseHeldError, ToolStillRunningError, WorkspaceMissingError
from ..sessions.holders import holder_is_dead, live_holder
from ..sessions.identity import Session, WorkspaceIdentity, not_the_workspace
from ..sessions.rows import session_rowid
from .journal import OpenTurn, Reconciled, Store, read_journal, reconcile, unknown_effects_error
from .processes import ProcessRecord, ProcessStatus, stop


@dataclass(frozen=True)
class Recovery:
    """What `recover_session` found open (`open_turn`, None when nothing was), what it appended (`reconciled`, None
    when it appended nothing) and the processes it stopped (`stopped`: each record with its status after)."""

    session_id: str
    open_turn: OpenTurn | None
    reconciled: Reconciled | None
    stopped: tuple[tuple[ProcessRecord, ProcessStatus], ...] = ()


def recover_session(store: Store, session_id: str, *, accept_unknown_effects: bool = False,
                    workspace: str | os.PathLike[str] | None = None, stop_running: bool = False) -> Recovery:
    """Reconcile the Session's open agent turn as resume would, without any model or tool.

    While a live process holds the Session's lease (its tool may be
    running right now) it raises `LeaseHeldError` saying the Session is live
    and in use, before anything else. While a process a started call's tool
    recorded still runs (it outlived the chat; see `processes`) it raises
    `ToolStillRunningError` naming it, unless `stop_running`: then the
    process's group is stopped first (SIGTERM, then SIGKILL; `ToolStillRunningError`
    when it cannot be) and `stopped` says so; stopping writes nothing, and
    the call's effect is still unknown. A started call without a result then
    raises `UnknownEffectsError` listing it (and whether the processes it
    recorded ended), before taking a lease or writing anything, unless
    `accept_unknown_effects`: then it is recorded as `unknown_effect`. Takes and releases the Session's lease (from
    `workspace`, default the recorded path; a renamed workspace is named by
    its new path); queues no distillation. Nothing open: returns at once,
    changing nothing. A `workspace` that is not the Session's workspace
    directory is refused first, even with nothing open; a missing recorded
    one once there is a turn to recover (`WorkspaceMissingError` or
    `WorkspaceReplacedError`, advising `--workspace DIR`).
    """
    session = store.get_session(session_id)
    if workspace is not None:
        path = _lease_directory(session, workspace)
    turn = read_journal(store, session_id)
    if turn is None:
        return Recovery(session_id, None, None)
    _refuse_live(store, session_id)
    stopped = _stop_running(session_id, turn) if stop_running else ()
    if turn.unknown and (not accept_unknown_effects or any(call.running() for call in turn.unknown)):
        error = unknown_effects_error(session_id, turn)  # ToolStillRunningError while a recorded process runs
        error.stopped = stopped
        raise error
    if workspace is None:
        path = _lease_directory(session, None)
    with store.acquire_lease(session_id, path) as lease:
        for _ in lease.replay_all():
            pass
        done = reconcile(store, lease, accept_unknown_effects=accept_unknown_effects)
        lease.release()
    return Recovery(session_id, turn, done, stopped)


def _stop_running(session_id: str, turn: OpenTurn) -> tuple[tuple[ProcessRecord, ProcessStatus], ...]:
    """Stop every recorded process of the turn's started calls that still runs; `ToolStillRunningError` naming
    those that could not be stopped (or whose identity this system cannot verify)."""
    stopped = tuple((record, stop(record)) for call in turn.unknown for record, _ in call.running())
    left = [(record, seen) for record, seen in stopped if seen.running]
    if left:
        named = "; ".join(f"{record.describe()}: {seen.why}" for record, seen in left)
        error = ToolStillRunningError(
            f"Session {session_id}: could not stop {named}; stop it yourself (`kill -KILL -{left[0][0].pgid}` once "
            f"you checked it is the tool's), then run `emelex memory sessions recover {session_id}` again"
        )
        error.calls = turn.unknown
        error.running = tuple(left)
        raise error
    return stopped


def _lease_directory(session: Session, workspace: str | os.PathLike[str] | None) -> str:
    """The Session's workspace directory, `workspace` or else the recorded path, checked without writing; the
    errors name `--workspace DIR`, as recover uses no current directory."""
    recorded = session.workspace
    if workspace is None and recorded.path is None:  # a migrated workspace never seen since
        raise WorkspaceMissingError(f"Session {session.id}'s workspace {session.workspace_id} has no recorded "
                                    "directory: pass it with --workspace DIR")
    try:
        found = WorkspaceIdentity.inspect(recorded.path if workspace is None else workspace)
    except WorkspaceMissingError as exc:
        if workspace is not None:
            raise WorkspaceMissingError(f"--workspace {os.fsdecode(workspace)}: {exc}") from None
        raise WorkspaceMissingError(
            f"Session {session.id}'s workspace {session.workspace_id}, last seen at {recorded.path}, is missing "
            "(deleted or moved away): pass the directory it was moved to with --workspace DIR, or restore it there"
        ) from None
    if not found.same_directory(recorded):
        raise not_the_workspace(found.path, session.id, session.workspace_id, recorded, cwd=False)
    return found.path


def _refuse_live(store: Store, session_id: str) -> None:
    """`LeaseHeldError` while a process that is not known to be gone holds the Session's lease."""
    with store.db.read() as conn:
        now = store.db.clock()
        held = live_holder(conn, session_rowid(conn, session_id), now)
    if held is not None and not holder_is_dead(held[0]):
        raise LeaseHeldError(
            f"Session {session_id} is live and in use: {held[0]} holds its lease (for another {held[1] - now:.0f}s) "
            "and its open turn may be running a tool right now; let that chat finish or end it, then recover"
        )
