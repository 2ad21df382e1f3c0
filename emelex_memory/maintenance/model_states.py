"""Saved model states: a Session's evaluated model context, kept as an asset so a resume need not evaluate it again.

A model binding (the llama.cpp plugin's) saves the state it evaluated for a
Session with `save_model_state(lease, ...)`: the bytes become an asset (media
kind `MODEL_STATE_KIND`) and one `model_states` row names it under the
Session and a `state_key`, the binding's digest of everything that must match
for the bytes to be usable (model snapshot, chat template, context settings).
A new save for the same key replaces the row. `model_state(session_id, key)`
finds it again; what the bytes hold, and whether they are trusted, is the
binding's business: the store only says which asset was saved under that key,
with the token count and digest recorded with it.

The rows are bounded by `maintain` (`collect_model_states`): beyond the newest
`model_states_keep` rows, or once the newest rows hold more than
`model_states_max_bytes`, older rows are deleted, except those of a Session
with a live lease (it may be loading its state right now: a binding loads
under the lease that resumed the Session). A deleted row's asset is then
unreferenced, and the `assets` step collects it once the asset grace period
since it was put has passed. A Session's rows go with the Session. While a
row names an asset, asset collection keeps it (`assets/collection.py:
NOT_A_MODEL_STATE`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import apsw

from ..assets.refs import AssetRef
from ..core.database import Database
from ..errors import InvalidInputError
from ..sessions.holders import live_lease
from ..sessions.rows import session_rowid

if TYPE_CHECKING:
    from ..assets.service import AssetStore
    from ..sessions.leases import SessionLease

MODEL_STATE_KIND = "application/x-emelex-model-state"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class ModelState:
    """One saved state: the Session, the binding's `state_key`, the tokens it evaluated (`prefix_tokens`, and
    `prefix_digest`, the binding's digest of them), the `asset` holding the bytes, and when it was saved."""

    session_id: str
    state_key: str
    prefix_tokens: int
    prefix_digest: str
    asset: AssetRef
    saved_at: float


class ModelStates:
    """The `model_states` rows of one store (`MemoryStore.save_model_state`, `MemoryStore.model_state`)."""

    def __init__(self, db: Database, assets: AssetStore) -> None:
        """Serve `db`, storing the bytes through `assets`."""
        self._db = db
        self._assets = assets

    def save_model_state(self, lease: SessionLease, *, state_key: str, prefix_tokens: int, prefix_digest: str,
                         data: bytes) -> ModelState:
        """Store `data` as an asset and record it as the state of the lease's Session under `state_key`, replacing
        the one saved before under that key, in one write transaction that re-checks the lease (as `append_turn`
        does: `LeaseLostError`, `LeaseExpiredError`, `StaleCursorError`, ...). `state_key` and `prefix_digest` are
        64 lowercase hex digits and `prefix_tokens` a positive int (`InvalidInputError` otherwise, nothing stored);
        `data` is bounded like every asset (`AssetTooLargeError` beyond 128 MiB)."""
        for name, value in (("state_key", state_key), ("prefix_digest", prefix_digest)):
            if not isinstance(value, str) or not _HEX64.match(value):
                raise InvalidInputError(f"{name} must be 64 lowercase hex digits, got {value!r:.80}")
        if type(prefix_tokens) is not int or prefix_tokens < 1:
            raise InvalidInputError(f"prefix_tokens must be a positive int, got {prefix_tokens!r}")
        if lease.db is not self._db:
            raise InvalidInputError(f"the lease on Session {lease.session_id} belongs to another MemoryStore; save "
                                    "the state on the store that acquired it")
        ref = self._assets.put_asset(data, MODEL_STATE_KIND)
        with self._db.write() as conn:
            now = lease.check_authority(conn)
            conn.execute(
                "INSERT INTO model_states (session_id, state_key, prefix_tokens, prefix_digest, digest, media_kind, "
                "size, saved_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, state_key) DO UPDATE SET "
                "prefix_tokens = excluded.prefix_tokens, prefix_digest = excluded.prefix_digest, "
                "digest = excluded.digest, media_kind = excluded.media_kind, size = excluded.size, "
                "saved_at = excluded.saved_at",
                (session_rowid(conn, lease.session_id), state_key, prefix_tokens, prefix_digest, ref.digest,
                 ref.media_kind, ref.size, now),
            )
        return ModelState(lease.session_id, state_key, prefix_tokens, prefix_digest, ref, now)

    def model_state(self, session_id: str, state_key: str) -> ModelState | None:
        """The state saved for Session `session_id` under `state_key`, or None (`SessionNotFoundError` for an
        unknown Session). Read its bytes with `read_asset(state.asset)`, which verifies them."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT prefix_tokens, prefix_digest, digest, media_kind, size, saved_at FROM model_states "
                "WHERE session_id = ? AND state_key = ?", (session_rowid(conn, session_id), state_key),
            ).fetchone()
        if row is None:
            return None
        tokens, prefix, digest, kind, size, saved_at = row
        return ModelState(session_id, state_key, tokens, prefix, AssetRef(digest, size, kind), saved_at)


def collect_model_states(conn: apsw.Connection, now: float, *, keep: int, max_bytes: int, limit: int) -> int:
    """Inside a write transaction: delete up to `limit` `model_states` rows beyond the newest `keep`, or beyond
    `max_bytes` counted from the newest, skipping every row of a Session with a live lease at `now`; return how
    many were deleted. Their assets are left to asset collection. Reads the rows newest first and stops at the
    `limit`-th deletion: at most `keep` + `limit` rows, plus those of live Sessions."""
    held = f"SELECT 1 FROM session_leases WHERE session_id = ? AND {live_lease()}"
    count = total = 0
    doomed = []
    newest = conn.execute("SELECT session_id, state_key, size FROM model_states ORDER BY saved_at DESC")
    for session, key, size in newest:
        count, total = count + 1, total + size
        if len(doomed) == limit:
            break
        if (count > keep or total > max_bytes) and conn.execute(held, (session, now)).fetchone() is None:
            doomed.append((session, key))
    newest.close()
    conn.executemany("DELETE FROM model_states WHERE session_id = ? AND state_key = ?", doomed)
    return len(doomed)
