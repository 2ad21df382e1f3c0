"""Explicit recovery of an agent Session's interrupted turn (`emelex memory sessions recover`); never runs a tool."""

from __future__ import annotations

import os
from dataclasses import dataclass
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

    A started call without a result raises `UnknownEffectsError` listing
    it, before taking a lease or writing anything, unless
    `accept_unknown_effects`: then it is recorded as `unknown_effect`. Takes
    and releases the Session's lease (from `workspace`, default the recorded
    path), so it raises `LeaseHeldError` while the Session is live; queues no
    distillation. Nothing open: returns at once, changing nothing.
    """
    turn = read_journal(store, session_id)
    if turn is None:
        return Recovery(session_id, None, None)
    if turn.unknown and not accept_unknown_effects:
        raise unknown_effects_error(session_id, turn)
    path = store.get_session(session_id).workspace.path if workspace is None else workspace
    with store.acquire_lease(session_id, path) as lease:
        for _ in lease.replay_all():
            pass
        done = reconcile(store, lease, accept_unknown_effects=accept_unknown_effects)
        lease.release()
    return Recovery(session_id, turn, done)
