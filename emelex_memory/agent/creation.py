"""A new agent Session in one transaction: the Session, its model's binding, its lease and its execution snapshot.

`create_agent_session` is what `DurableAgentSession.create` needs of the core. One `BEGIN IMMEDIATE` transaction
records the workspace (or finds it), inserts the Session, binds the model (revalidated under the Home-wide
snapshot-mutation lock, held through the commit as `bind_session_model` holds it), takes the lease and stores the
snapshot; so a refused creation (a tampered model, a replaced workspace, a held lock) leaves nothing behind, and no
other holder can lease or append to the Session before its snapshot exists. The lease it returns has nothing to
replay: the Session is empty.
"""

from __future__ import annotations

import os
import uuid
from contextlib import nullcontext
from typing import Any

from ..core.io_errors import restated
from ..core.utf8 import check_utf8
from ..errors import CommitOutcomeUnknownError, InvalidInputError
from ..sessions.holders import holder_label
from ..sessions.identity import WorkspaceIdentity
from ..sessions.leases import SessionLease, lease_ttl, new_token, token_digest
from ..sessions.workspaces import register_workspace
from ..snapshots.installed import InstalledModel, revalidate, snapshot_mutation_lock
from ..snapshots.refs import check_bindable, lock_timeout, record_binding
from .snapshot import SessionSnapshot

Store = Any  # the `MemoryStore` facade; typed loosely because feature packages never import store.py
MAX_TITLE_CHARS = 512


def create_agent_session(
    store: Store,
    workspace: str | os.PathLike[str],
    snapshot: SessionSnapshot,
    *,
    title: str | None = None,
    new_workspace: bool = False,
    model: InstalledModel | None = None,
    ttl_s: float | None = None,
) -> SessionLease:
    """Create an agent Session in the canonical `workspace` directory with its execution `snapshot`, `model` bound
    to it (when given) and its lease, in one transaction; return the lease (nothing to replay, ready to append).

    Refuses as `create_session` (`new_workspace`, a replaced workspace),
    `bind_session_model` (`ModelNotInstalledError`, `ModelTamperedError`, a
    model of another Home) and `acquire_lease` (the TTL) do, writing nothing.
    The lease holds the workspace directory open until it ends.
    """
    if title is not None and (not isinstance(title, str) or len(title) > MAX_TITLE_CHARS):
        raise InvalidInputError(f"a Session title must be a string of at most {MAX_TITLE_CHARS} characters")
    check_utf8(title, "the Session title")
    if not isinstance(snapshot, SessionSnapshot):
        raise InvalidInputError(f"an agent Session needs a SessionSnapshot, not a {type(snapshot).__name__}")
    db = store.db
    ttl = lease_ttl(db.settings, ttl_s)
    if model is not None:
        check_bindable(db, model)
    text = snapshot.canonical_json().decode()
    found, fd = WorkspaceIdentity.open(workspace)
    session_id, token = str(uuid.uuid4()), new_token()
    try:
        locked = nullcontext() if model is None else snapshot_mutation_lock(
            db.settings.home_dir, timeout_s=lock_timeout(db, None))
        with locked:
            current = None if model is None else revalidate(model)
            with db.write() as conn:
                now = db.clock()
                workspace_id, ident = register_workspace(conn, found, now, new_workspace=new_workspace)
                rowid, epoch = conn.execute(
                    "INSERT INTO sessions (uuid, title, workspace_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
                    "RETURNING id, workspace_epoch",
                    (session_id, title, workspace_id, now, now),
                ).fetchone()
                if current is not None:
                    record_binding(conn, rowid, session_id, current, now)
                conn.execute(
                    "INSERT INTO session_leases (session_id, token_hash, holder, state, acquired_at, expires_at) "
                    "VALUES (?, ?, ?, 'active', ?, ?)",
                    (rowid, token_digest(token), holder_label(), now, now + ttl),
                )
                conn.execute(
                    "INSERT INTO session_snapshots (session_id, digest, snapshot, created_at) VALUES (?, ?, ?, ?)",
                    (rowid, snapshot.digest, text, now),
                )
    except CommitOutcomeUnknownError as exc:
        os.close(fd)
        raise restated(
            exc, db.path, f"a new agent Session {session_id}",
            "if it is durable, its lease token never reached you: the Session stays leased until the lease expires "
            f"(at most {ttl:g}s); look for it with `emelex memory sessions list`, or create another",
        ) from exc.__cause__
    except BaseException:
        os.close(fd)
        raise
    return SessionLease(db, rowid, session_id, token, now + ttl, ident, workspace_id, epoch, fd, replayed=True)
