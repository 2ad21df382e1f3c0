"""The active-turn and tool-call journal of a durable agent Session, and its reconciliation.

Every step is one small `BEGIN IMMEDIATE` transaction that re-checks the
lease token and expiry, the workspace identity and the raw cursor
(`SessionLease.check_authority`), and each is restart-idempotent: repeating a
step that committed changes nothing. The order of one turn:

1. `open_turn`: the user input (after the Session's context notes, on its first
   turn) and the open-turn row, together.
2. `plan_batch`: the whole proposed batch, every call `planned`.
3. per call `start_call` (-> `started`), then `complete_call` (-> `completed`
   with its exact `tool_result` payload); a call that never runs (gated,
   denied, aborted) goes straight from `planned` to `completed`.
4. `publish_batch`: the assistant-call/result batch appended to the
   transcript and the batch's journal rows removed, together.
5. `close_answer` (answer + audit) or `close_failed` (failure record) ends
   the turn.

`close_failed` and `reconcile` never invoke a tool: completed calls keep
their exact results, planned calls become `not_executed`, started calls
without a result become `unknown_effect`, which is refused
(`UnknownEffectsError`, nothing written) unless explicitly accepted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import apsw

from ..assets.refs import AssetRef
from ..errors import (
    InvalidInputError,
    JournalStateError,
    SessionNotEmptyError,
    SnapshotMismatchError,
    SnapshotMissingError,
    StoreBusyError,
    ToolStillRunningError,
    UnknownEffectsError,
)
from ..core.utf8 import check_utf8
from ..sessions.rows import session_rowid
from ..sessions.transcript import AppendedTurn, NewEvent
from .processes import ProcessRecord, ProcessStatus, status
from .snapshot import SessionSnapshot, canonical_json, identity_changes

if TYPE_CHECKING:
    from ..sessions.leases import SessionLease

Store = Any  # the `MemoryStore` facade: the journal uses its `db` (the core `Database`); typed loosely because
# feature packages never import store.py

MAX_DIAGNOSTIC_BYTES = 2048
CONTEXT_KIND = "context"  # a note recorded before a Session's first model round (`open_turn`'s `context`)
FAILURE_REASONS = ("interrupted", "error", "aborted")
NOT_EXECUTED = "this call never ran"
REPEATED = "repeated"  # the outcome of a call answered from an identical call's earlier result, never run
NOT_RUN_OUTCOMES = ("not_executed", "denied", "error", REPEATED)  # what a call may complete with that never started
UNKNOWN_EFFECT = "this call may have run; its effect is unknown; do not repeat it unless the user asks"
BUSY_PAUSE_S = (0.05, 1.0)  # the first pause between attempts of a busy step, doubling to the second
_CALL_COLUMNS = ("ordinal, call_id, tool, arguments, state, result, assets, planned_at, started_at, completed_at, "
                 "processes")
MAX_PROCESSES = 64  # processes one call may record


def bounded(text: str, max_bytes: int = MAX_DIAGNOSTIC_BYTES) -> str:
    """`text` cut to at most `max_bytes` UTF-8 bytes (never inside a character)."""
    data = text.encode("utf-8", "replace")
    return text if len(data) <= max_bytes else data[:max_bytes].decode("utf-8", "ignore")


@dataclass(frozen=True)
class JournalCall:
    """One journaled tool call: its state (`planned`, `started`, `completed`), its arguments and, once completed,
    the exact `tool_result` payload and the assets it links; times are the store's clock. `processes` are the
    processes its tool recorded while it ran (`record_process`), which may outlive the process that ran it."""

    ordinal: int
    call_id: str
    tool: str
    arguments: dict
    state: str
    result: dict | None
    assets: tuple[AssetRef, ...]
    planned_at: float
    started_at: float | None
    completed_at: float | None
    processes: tuple[ProcessRecord, ...] = ()

    def running(self) -> tuple[tuple[ProcessRecord, ProcessStatus], ...]:
        """The recorded processes of this call that still run, with their status (`processes.status`)."""
        found = ((record, status(record)) for record in self.processes)
        return tuple((record, seen) for record, seen in found if seen.running)


@dataclass(frozen=True)
class OpenTurn:
    """The open agent turn of a Session: the seq of its input, how many batches it published, and the journaled
    batch (its round and raw model output, and its calls in order; empty when no batch is journaled)."""

    input_seq: int
    published: int
    round: int | None
    raw: str | None
    opened_at: float
    calls: tuple[JournalCall, ...]

    @property
    def unknown(self) -> tuple[JournalCall, ...]:
        """The calls that started and have no result: their effects are unknown."""
        return tuple(c for c in self.calls if c.state == "started")

    def to_json(self) -> dict[str, Any]:
        """The open turn as JSON (for `sessions show` and `sessions recover --json`)."""
        return {
            "input_seq": self.input_seq, "published_batches": self.published, "round": self.round,
            "opened_at": self.opened_at,
            "calls": [
                {"call_id": c.call_id, "tool": c.tool, "arguments": c.arguments, "state": c.state,
                 "outcome": None if c.result is None else c.result.get("outcome"), "planned_at": c.planned_at,
                 "started_at": c.started_at, "completed_at": c.completed_at,
                 "processes": [p.to_json() for p in c.processes]}
                for c in self.calls
            ],
        }


@dataclass(frozen=True)
class Reconciled:
    """What `close_failed` / `reconcile` appended: the turn, the batch's `tool_result` payloads in order (empty
    when no batch was journaled) and the failure record."""

    turn: AppendedTurn
    results: tuple[dict, ...]
    failure: dict


T = TypeVar("T")


def retry_busy(lease: SessionLease, step: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`step(*args, **kwargs)` (a journal step, or another write under `lease`), attempted again while the database is
    busy: another connection held its write lock past `busy_timeout_ms` (`apsw.BusyError`, raised before anything
    was written). It pauses between attempts (50 ms doubling to 1 s) for as long as the lease is valid by the store's
    clock, and then raises `StoreBusyError`; every other error is raised at once. Safe because each step is one
    transaction and restart-idempotent."""
    clock = lease.db.clock
    pause = BUSY_PAUSE_S[0]
    while True:
        try:
            return step(*args, **kwargs)
        except apsw.BusyError as exc:
            left = lease.expires_at - clock()
            if left <= 0:
                raise StoreBusyError(
                    f"the database of Session {lease.session_id} stayed locked by another process until this "
                    "lease expired (a long `emelex memory maintain --vacuum`?); nothing more was written; wait for "
                    "it to finish, then resume the Session"
                ) from exc
            time.sleep(min(pause, left))
            pause = min(2 * pause, BUSY_PAUSE_S[1])


# -- snapshots -------------------------------------------------------------------------------------------


def record_snapshot(store: Store, lease: SessionLease, snapshot: SessionSnapshot) -> None:
    """Store `snapshot` for the lease's empty Session, in the transaction that proves it empty (no events, no
    snapshot); raises `SessionNotEmptyError` (writing nothing) otherwise."""
    text = snapshot.canonical_json().decode()
    with store.db.write() as conn:
        now = lease.check_authority(conn)
        rowid = _rowid(conn, lease)
        has_event = conn.execute("SELECT 1 FROM events WHERE session_id = ? LIMIT 1", (rowid,)).fetchone()
        has_snapshot = conn.execute("SELECT 1 FROM session_snapshots WHERE session_id = ?", (rowid,)).fetchone()
        if has_event or has_snapshot:
            raise SessionNotEmptyError(
                f"Session {lease.session_id} already has {'history' if has_event else 'a snapshot'}; an execution "
                "snapshot is only created for an empty Session: start a new Session"
            )
        conn.execute(
            "INSERT INTO session_snapshots (session_id, digest, snapshot, created_at) VALUES (?, ?, ?, ?)",
            (rowid, snapshot.digest, text, now),
        )


def stored_snapshot(store: Store, session_id: str) -> SessionSnapshot | None:
    """The Session's execution snapshot, or None when it has none. Read-only."""
    with store.db.read() as conn:
        rowid = session_rowid(conn, session_id)
        row = conn.execute("SELECT snapshot FROM session_snapshots WHERE session_id = ?", (rowid,)).fetchone()
    return None if row is None else SessionSnapshot.from_json(json.loads(row[0]))


def require_snapshot(store: Store, lease: SessionLease, snapshot: SessionSnapshot) -> None:
    """Resume's check: the Session's stored snapshot must be identical to `snapshot` (`verify_snapshot`); an empty
    Session without one gets `snapshot` recorded (creation is allowed only there)."""
    if verify_snapshot(store, lease, snapshot):
        record_snapshot(store, lease, snapshot)


def verify_snapshot(store: Store, lease: SessionLease, snapshot: SessionSnapshot) -> bool:
    """Read-only: True when the lease's Session is empty and has no snapshot (so `snapshot` is to be recorded),
    False when its stored snapshot is identical to `snapshot`.

    Raises `SnapshotMismatchError` naming the first differing field, and
    `SnapshotMissingError` when the Session has history but no snapshot (it
    fails closed rather than adopting today's semantics).
    """
    stored = stored_snapshot(store, lease.session_id)
    if stored is None:
        with store.db.read() as conn:
            has_event = conn.execute(
                "SELECT 1 FROM events WHERE session_id = ? LIMIT 1", (_rowid(conn, lease),)
            ).fetchone()
        if has_event:
            raise snapshot_missing(store, lease.session_id)
        return True
    if stored.digest != snapshot.digest:
        raise snapshot_mismatch(lease.session_id, stored, snapshot)
    return False


def snapshot_missing(store: Store, session_id: str) -> SnapshotMissingError:
    """The error for Session `session_id`, which has history but no execution snapshot: it cannot be resumed as an
    agent Session. For a Session imported from another agent's history, it says where it came from and how its
    Knowledge reaches a new Session. A resume raises it before it needs a model (read-only)."""
    runs = store.session_imports(session_id)
    if not runs:
        return SnapshotMissingError(
            f"Session {session_id} has history but no execution snapshot, so it cannot be resumed as an agent "
            "Session; read it with `emelex memory sessions show`, or start a new Session"
        )
    return SnapshotMissingError(
        f"Session {session_id} was imported from {runs[0].path} ({runs[0].format}) and has no execution snapshot, so "
        f"it cannot be resumed as an agent Session; read it with `emelex memory sessions show {session_id[:8]}`, or "
        "start a new chat: a new chat here recalls its Knowledge once `emelex memory work` has distilled it"
    )


def snapshot_mismatch(session_id: str, stored: SessionSnapshot, snapshot: SessionSnapshot) -> SnapshotMismatchError:
    """The typed error of a resume whose `snapshot` differs from the Session's `stored` one: it names the first
    differing field with its recorded and its current value."""
    field = stored.differing_field(snapshot) or "format"
    changed = identity_changes(stored, snapshot) if isinstance(stored.model_identity, dict) else []
    if changed and (field.startswith("model_identity") or field == "template_digest"):  # a served model changed
        changes = "; ".join(f"{path} was {bounded(repr(old), 200)} and is now {bounded(repr(new), 200)}"
                            for path, old, new in changed)
        model = stored.model_identity.get("model_id")
        error = SnapshotMismatchError(
            f"Session {session_id} was created with a served model whose server now reports it otherwise: {changes}; "
            f"the server serves another model under {model!r} than when the Session was created (pulled again, or "
            "replaced): serve the Session's model under that name again, or start a new Session"
        )
        error.field = field
        return error
    old, new = stored.field_value(field), snapshot.field_value(field)
    fix = next((advice for prefix, advice in _MISMATCH_FIXES if field.startswith(prefix)),
               "resume it with the value it recorded (`journal.stored_snapshot`)")
    error = SnapshotMismatchError(
        f"Session {session_id} was created with {field} {bounded(repr(old), 200)}, but the current configuration "
        f"has {bounded(repr(new), 200)}; {fix}, or start a new Session"
    )
    error.field = field
    return error


_MISMATCH_FIXES = (  # what makes a resume honour a recorded field again, by the field's path
    ("model_", "install the Session's model file again under its name (`emelex models install FILE --name NAME`)"),
    ("template_digest", "install the Session's model file again: its chat template is part of the file"),
    ("context_size", "use a model (and `model_max_context_tokens`) that allocates the recorded window"),
    ("protocol", "run the Emelex version the Session was created with (for `openai-tools/1`, a model server that calls "
                 "tools natively: llama-server with --jinja, vLLM with a tool parser)"),
    ("policy", "resume it under the turn policy it recorded (`emelex chat --resume` does)"),
    ("tools", "install the tool plugins at the versions the Session was created with"),
)


# -- reading the journal -----------------------------------------------------------------------------


def read_journal(store: Store, session_id: str) -> OpenTurn | None:
    """The Session's open agent turn with its journaled batch, or None when no turn is open. Read-only."""
    with store.db.read() as conn:
        return _open_turn(conn, session_rowid(conn, session_id))


def _open_turn(conn: Any, rowid: int) -> OpenTurn | None:
    row = conn.execute(
        "SELECT input_seq, published, round, raw, opened_at FROM agent_turns WHERE session_id = ?", (rowid,)
    ).fetchone()
    if row is None:
        return None
    calls = tuple(
        JournalCall(
            ordinal, call_id, tool, json.loads(arguments), state, None if result is None else json.loads(result),
            tuple(AssetRef(*a) for a in json.loads(assets)) if assets else (), planned, started, completed,
            tuple(ProcessRecord.from_json(p) for p in json.loads(processes)) if processes else (),
        )
        for ordinal, call_id, tool, arguments, state, result, assets, planned, started, completed, processes
        in conn.execute(f"SELECT {_CALL_COLUMNS} FROM agent_calls WHERE session_id = ? ORDER BY ordinal", (rowid,))
    )
    return OpenTurn(*row, calls)


def _rowid(conn: Any, lease: SessionLease) -> int:
    return session_rowid(conn, lease.session_id)


def _require_turn(conn: Any, rowid: int, lease: SessionLease) -> OpenTurn:
    turn = _open_turn(conn, rowid)
    if turn is None:
        raise JournalStateError(f"Session {lease.session_id} has no open agent turn; resume it to reconcile")
    return turn


# -- the steps of a turn -----------------------------------------------------------------------------


def open_turn(store: Store, lease: SessionLease, text: str, context: Sequence[dict] = ()) -> AppendedTurn:
    """Record a turn's user input and open the turn, in one transaction; raises `JournalStateError` while a turn is
    open (resume reconciles it first). Each payload of `context` (a JSON object with a string "source" and a string
    "text") is recorded before the user input, as an event of kind `context`, in the same transaction."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("a turn needs non-empty input text")
    for payload in context:
        if not (isinstance(payload, dict) and isinstance(payload.get("source"), str)
                and isinstance(payload.get("text"), str)):
            raise InvalidInputError('a context note must be a JSON object with a string "source" and a string "text"')
    with store.db.write() as conn:
        lease.check_authority(conn)
        rowid = _rowid(conn, lease)
        if _open_turn(conn, rowid) is not None:
            raise JournalStateError(f"Session {lease.session_id} has an open agent turn; resume it to reconcile")
        appended = lease.append_turn([*(NewEvent(CONTEXT_KIND, p) for p in context), NewEvent("user", {"text": text})])
        conn.execute(
            "INSERT INTO agent_turns (session_id, input_seq, opened_at) VALUES (?, ?, ?)",
            (rowid, appended.last_seq, store.db.clock()),
        )
    return appended


def plan_batch(
    store: Store, lease: SessionLease, round_: int, raw: str, calls: Sequence[tuple[str, str, dict]]
) -> None:
    """Journal the whole proposed batch of round `round_`, every call `(call_id, tool, arguments)` as `planned`,
    before any runs. Repeating the same batch is a no-op; another batch while one is journaled raises
    `JournalStateError`."""
    if not calls:
        raise InvalidInputError("a tool batch needs at least one call")
    encoded = [(call_id, tool, canonical_json(arguments).decode()) for call_id, tool, arguments in calls]
    with store.db.write() as conn:
        now = lease.check_authority(conn)
        rowid = _rowid(conn, lease)
        turn = _require_turn(conn, rowid, lease)
        if turn.round is not None:
            same = turn.round == round_ and [(c.call_id, c.tool, canonical_json(c.arguments).decode())
                                             for c in turn.calls] == encoded
            if same:
                return
            raise JournalStateError(
                f"Session {lease.session_id} already journals round {turn.round}; resume it to reconcile"
            )
        conn.execute("UPDATE agent_turns SET round = ?, raw = ? WHERE session_id = ?", (round_, raw, rowid))
        conn.executemany(
            "INSERT INTO agent_calls (session_id, ordinal, call_id, tool, arguments, state, planned_at) "
            "VALUES (?, ?, ?, ?, ?, 'planned', ?)",
            [(rowid, i, call_id, tool, arguments, now) for i, (call_id, tool, arguments) in enumerate(encoded)],
        )


def start_call(store: Store, lease: SessionLease, call_id: str) -> float:
    """Mark a planned call `started` (right before it runs) and return its start time; repeating it is a no-op.
    Raises `JournalStateError` for an unknown or completed call."""
    with store.db.write() as conn:
        now = lease.check_authority(conn)
        conn.execute(
            "UPDATE agent_calls SET state = 'started', started_at = ? WHERE call_id = ? AND state = 'planned' "
            "AND session_id = ?",
            (now, call_id, _rowid(conn, lease)),
        )
        if conn.changes() == 1:
            return now
        row = _call_row(conn, lease, call_id)
        if row[0] != "started":
            raise JournalStateError(f"tool call {call_id} is already {row[0]}; it cannot start again")
        return row[1]


def record_process(store: Store, lease: SessionLease, call_id: str, record: ProcessRecord) -> None:
    """Record that the started call `call_id` started the process `record`, which may outlive the process running
    the tool (see `processes`); recording the same process again is a no-op. Raises `JournalStateError` for a call
    that is not `started`, or one that already recorded `MAX_PROCESSES` processes."""
    with store.db.write() as conn:
        lease.check_authority(conn)
        row = conn.execute(
            "SELECT state, processes FROM agent_calls WHERE call_id = ? AND session_id = ?",
            (call_id, _rowid(conn, lease)),
        ).fetchone()
        if row is None or row[0] != "started":
            raise JournalStateError(
                f"tool call {call_id} is {'not journaled' if row is None else row[0]}: only a started call records "
                "the processes its tool starts"
            )
        recorded = json.loads(row[1]) if row[1] else []
        if record.to_json() in recorded:
            return
        if len(recorded) >= MAX_PROCESSES:
            raise JournalStateError(f"tool call {call_id} already recorded {MAX_PROCESSES} processes")
        conn.execute(
            "UPDATE agent_calls SET processes = ? WHERE call_id = ? AND session_id = ?",
            (json.dumps([*recorded, record.to_json()], separators=(",", ":")), call_id, _rowid(conn, lease)),
        )


def complete_call(
    store: Store, lease: SessionLease, call_id: str, result: dict, assets: Sequence[AssetRef] = ()
) -> None:
    """Record a call's exact `tool_result` payload (and the assets it links) as `completed`. A call that never
    started may only complete with an outcome saying it did not run (`NOT_RUN_OUTCOMES`, no assets): anything else
    from `planned` raises `JournalStateError` (start it first), so "started before its effect" holds for every host.
    Completing it again with the identical result is a no-op; with another raises `JournalStateError`."""
    text = canonical_json(result).decode()
    refs = json.dumps([[a.digest, a.size, a.media_kind] for a in assets]) if assets else None
    ran = not (isinstance(result, dict) and result.get("outcome") in NOT_RUN_OUTCOMES and not assets)
    states = "'started'" if ran else "'planned', 'started'"
    with store.db.write() as conn:
        now = lease.check_authority(conn)
        conn.execute(
            "UPDATE agent_calls SET state = 'completed', result = ?, assets = ?, completed_at = ? "
            f"WHERE call_id = ? AND state IN ({states}) AND session_id = ?",
            (text, refs, now, call_id, _rowid(conn, lease)),
        )
        if conn.changes() == 1:
            return
        state, _, stored = _call_row(conn, lease, call_id)
        if state == "planned":
            raise JournalStateError(
                f"tool call {call_id} never started, so it cannot complete with outcome {result.get('outcome')!r}: "
                "record start_call right before the tool runs"
            )
        if stored != text:
            raise JournalStateError(f"tool call {call_id} was already completed with another result")


def _call_row(conn: Any, lease: SessionLease, call_id: str) -> tuple:
    row = conn.execute(
        "SELECT state, started_at, result FROM agent_calls WHERE call_id = ? AND session_id = ?",
        (call_id, _rowid(conn, lease)),
    ).fetchone()
    if row is None:
        raise JournalStateError(f"no journaled tool call {call_id} in Session {lease.session_id}")
    return row


def batch_events(turn: OpenTurn, results: Sequence[dict]) -> list[NewEvent]:
    """The replay-visible batch: the `tool_calls` event, then each call's `tool_result` with its assets."""
    calls = [{"call_id": c.call_id, "tool": c.tool, "arguments": c.arguments} for c in turn.calls]
    events = [NewEvent("tool_calls", {"round": turn.round, "calls": calls})]
    for call, result in zip(turn.calls, results):
        events.append(NewEvent("tool_result", result, call.assets if call.state == "completed" else ()))
    return events


def publish_batch(store: Store, lease: SessionLease) -> tuple[dict, ...]:
    """Append the journaled batch (every call completed) to the transcript and remove its journal rows, atomically;
    return the `tool_result` payloads in order. Raises `JournalStateError` when no batch is journaled or a call is not
    completed."""
    with store.db.write() as conn:
        lease.check_authority(conn)
        rowid = _rowid(conn, lease)
        turn = _require_turn(conn, rowid, lease)
        if turn.round is None:
            raise JournalStateError(f"Session {lease.session_id} journals no tool batch to publish")
        pending = [c.call_id for c in turn.calls if c.state != "completed"]
        if pending:
            raise JournalStateError(f"tool calls {', '.join(pending)} are not completed; the batch cannot publish")
        results = tuple(c.result for c in turn.calls)
        _clear_batch(conn, rowid)
        conn.execute(
            "UPDATE agent_turns SET published = published + 1, round = NULL, raw = NULL WHERE session_id = ?", (rowid,)
        )
        lease.append_journaled(batch_events(turn, results))  # the turn stays open
    return results


def _clear_batch(conn: Any, rowid: int) -> None:
    conn.execute("DELETE FROM agent_calls WHERE session_id = ?", (rowid,))


def close_answer(store: Store, lease: SessionLease, text: str, audit: dict) -> AppendedTurn:
    """Close the open turn with its answer: the `assistant` event, then the non-delta `audit` event, and the turn's
    row removed, in one transaction. Raises `JournalStateError` while a batch is journaled or no turn is open."""
    with store.db.write() as conn:
        lease.check_authority(conn)
        rowid = _rowid(conn, lease)
        turn = _require_turn(conn, rowid, lease)
        if turn.round is not None:
            raise JournalStateError(f"Session {lease.session_id} journals an unpublished batch; resume to reconcile")
        conn.execute("DELETE FROM agent_turns WHERE session_id = ?", (rowid,))
        return lease.append_turn([NewEvent("assistant", {"text": text}), NewEvent("audit", dict(audit))])


def close_failed(
    store: Store, lease: SessionLease, reason: str, diagnostic: str, *, accept_unknown_effects: bool = False
) -> Reconciled | None:
    """Close the open turn with a visible failure record, reconciling its journaled batch without running a tool.

    Completed calls keep their exact results, planned calls become
    `not_executed` and started ones `unknown_effect`; the batch (if any), then
    the `turn_failed` record with the bounded `diagnostic`, are appended and
    the journal removed, atomically. A started call is refused with
    `UnknownEffectsError`, writing nothing, unless `accept_unknown_effects`.
    Returns None when no turn is open (so repeating it is a no-op).
    """
    if reason not in FAILURE_REASONS:
        raise InvalidInputError(f"a turn failure reason must be one of {FAILURE_REASONS}, got {reason!r}")
    failure = {"reason": reason, "diagnostic": bounded(diagnostic)}
    with store.db.write() as conn:
        lease.check_authority(conn)
        rowid = _rowid(conn, lease)
        turn = _open_turn(conn, rowid)
        if turn is None:
            return None
        if turn.unknown and not accept_unknown_effects:
            raise unknown_effects_error(lease.session_id, turn)
        results = tuple(_reconciled_result(c) for c in turn.calls)
        events = batch_events(turn, results) if turn.round is not None else []
        events.append(NewEvent("turn_failed", failure))
        _clear_batch(conn, rowid)
        conn.execute("DELETE FROM agent_turns WHERE session_id = ?", (rowid,))
        appended = lease.append_turn(events)
    return Reconciled(appended, results, failure)


def reconcile(store: Store, lease: SessionLease, *, accept_unknown_effects: bool = False) -> Reconciled | None:
    """Resume's and recovery's reconciliation: `close_failed` with reason "interrupted" (see there); None when the
    Session has no open turn."""
    return close_failed(
        store, lease, "interrupted", "the process ended during this turn; reconciled on resume",
        accept_unknown_effects=accept_unknown_effects,
    )


def _reconciled_result(call: JournalCall) -> dict:
    if call.state == "completed":
        return call.result  # type: ignore[return-value]
    outcome, output = ("not_executed", NOT_EXECUTED) if call.state == "planned" else ("unknown_effect", UNKNOWN_EFFECT)
    return {"call_id": call.call_id, "tool": call.tool, "outcome": outcome, "output": output}


def unknown_effects_error(session_id: str, turn: OpenTurn) -> UnknownEffectsError:
    """The typed error listing the calls of `turn` whose effects are unknown (tool, arguments, call ID, start, and
    what became of the processes each recorded): `ToolStillRunningError` while one of those processes runs (it
    names them, and `--stop-running`), else `UnknownEffectsError`."""
    running = tuple((call, record, seen) for call in turn.unknown for record, seen in call.running())
    listed = "; ".join(
        f"{c.tool} {bounded(canonical_json(c.arguments).decode(), 200)} (call {c.call_id}, started "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(c.started_at or 0))}"
        f"{'' if running else _processes_text(c)})"
        for c in turn.unknown
    )
    if running:
        named = "; ".join(f"{record.describe()}: {seen.why}" for _, record, seen in running)
        error = ToolStillRunningError(
            f"Session {session_id} has a tool call still running: {named}; its effect cannot be settled while it "
            f"runs: wait for it to end, or stop it with `emelex memory sessions recover {session_id} --stop-running`"
            f" (the calls without a result: {listed})"
        )
        error.running = tuple((call, record) for call, record, _ in running)
    else:
        error = UnknownEffectsError(
            f"Session {session_id} has {len(turn.unknown)} tool call(s) that started but recorded no result: "
            f"{listed}; check what they did, then run "
            f"`emelex memory sessions recover {session_id} --accept-unknown-effects`"
        )
    error.calls = turn.unknown
    return error


def _processes_text(call: JournalCall) -> str:
    """`; its process group 4321 (`sleep 75`) has ended` for each process the call recorded ("" for none)."""
    return "".join(f"; its {record.describe()}: {status(record).why}" for record in call.processes)


@dataclass(frozen=True)
class UnknownEffect:
    """A call recorded with outcome `unknown_effect`: it may have run. Its tool, arguments, call ID and the seq of
    its `tool_result` event."""

    call_id: str
    tool: str
    arguments: dict
    seq: int


def unknown_effects(store: Store, session_id: str) -> tuple[UnknownEffect, ...]:
    """Every call recorded as `unknown_effect` in the Session's whole raw history, oldest first: compaction only
    adds Summaries in front of events, never removes them, so this holds for the Session's life. Read-only."""
    with store.db.read() as conn:
        rowid = session_rowid(conn, session_id)
        rows = conn.execute(
            "SELECT r.seq, json_extract(r.payload, '$.call_id'), json_extract(r.payload, '$.tool'), c.payload "
            "FROM events r LEFT JOIN events c ON c.session_id = r.session_id AND c.turn = r.turn "
            "AND c.kind = 'tool_calls' WHERE r.session_id = ? AND r.kind = 'tool_result' "
            "AND json_extract(r.payload, '$.outcome') = 'unknown_effect' ORDER BY r.seq",
            (rowid,),
        ).fetchall()
    found = []
    for seq, call_id, tool, calls in rows:
        arguments = next((c.get("arguments", {}) for c in json.loads(calls or '{"calls": []}').get("calls", [])
                          if c.get("call_id") == call_id), {})
        found.append(UnknownEffect(call_id, tool, arguments, seq))
    return tuple(found)


def set_title(store: Store, lease: SessionLease, title: str | None) -> None:
    """Change the Session's title through the caller's live lease (re-checked in the same transaction)."""
    if title is not None and (not isinstance(title, str) or len(title) > 512):
        raise InvalidInputError("a Session title must be a string of at most 512 characters")
    check_utf8(title, "the Session title")
    with store.db.write() as conn:
        now = lease.check_authority(conn)
        conn.execute(
            "UPDATE sessions SET title = ?, updated_at = ? WHERE id = ?", (title, now, _rowid(conn, lease))
        )
