"""Explicit recovery of an agent Session's interrupted turn (`emelex memory sessions recover`); never runs a tool."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import LeaseHeldError
from ..sessions.holders import holder_is_dead, live_holder
from ..sessions.rows import session_rowid
from .journal import OpenTurn, Reconciled, Store, read_journal, reconcile, unknown_effects_error


@dataclass(frozen=True)
class Recovery:
    """What `recover_session` found open (`open_turn`, None when nothing was) and what it appended (`reconciled`)."""

    session_id: str
    open_turn: OpenTurn | None
    reconciled: Reconciled | None


def recover_session(store: Store, session_id: str, *, accept_unknown_effects: bool = False,
                    workspace: str | os.PathLike[str] | None = None) -> Recovery:
    """Reconcile the Session's open agent turn as resume would, without any model or tool.

    While a live process holds the Session's lease (its tool may be
    running right now) it raises `LeaseHeldError` saying the Session is live
    and in use, before anything else. A started call without a result raises
    `UnknownEffectsError` listing it, before taking a lease or writing
    anything, unless `accept_unknown_effects`: then it is recorded as
    `unknown_effect`. Takes and releases the Session's lease (from
    `workspace`, default the recorded path; a renamed workspace is named by
    its new path); queues no distillation. Nothing open: returns at once,
    changing nothing.
    """
    turn = read_journal(store, session_id)
    if turn is None:
        return Recovery(session_id, None, None)
    _refuse_live(store, session_id)
    if turn.unknown and not accept_unknown_effects:
        raise unknown_effects_error(session_id, turn)
    path = store.get_session(session_id).workspace.path if workspace is None else workspace
    with store.acquire_lease(session_id, path) as lease:
        for _ in lease.replay_all():
            pass
        done = reconcile(store, lease, accept_unknown_effects=accept_unknown_effects)
        lease.release()
    return Recovery(session_id, turn, done)


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
