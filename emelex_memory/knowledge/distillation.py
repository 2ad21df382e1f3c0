"""Distillation: the "distill" job kind that turns a Session's transcript into workspace Knowledge.

A clean session exit queues distillation keyed by (Session, source digest),
idempotently: the source is the Session's events after those earlier
distillation jobs already cover, described by their seq range and
`knowledge/source_digest.py`. A worker (which never claims a job while its
Session is live) reads the bounded source events, calls the distiller, and
validates what it proposes; completion then re-checks the worker lease, the
Session's liveness, the source digest and the workspace identity, and applies
at most 128 unique candidates in that one transaction: all or none.

Automatic distillation never changes a pinned entry: candidates naming one
are skipped (and counted), whether they would update or tombstone it.

A source too large for one model call is not a failure: the handler splits
the job into smaller distill jobs covering the same events (see
`knowledge/splitting.py`), so every part of a long Session is distilled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..errors import (
    InvalidCandidateError,
    InvalidJobSourceError,
    InvalidKnowledgeError,
    PermanentJobError,
    SourceChangedError,
    SourceTooLargeError,
    WorkspaceError,
    WorkspaceReplacedError,
)
from .splitting import DistillationSplit, byte_budget, byte_ranges, complete_split, token_ranges
from ..queue.sources import check_fields
from ..queue.jobs import CompletionContext, Enqueued, Job, Store
from ..queue.kinds import JobKind
from .source_digest import source_digest
from .values import (
    KnowledgeEntry,
    KnowledgeSource,
    validate_confidence,
    validate_content,
    validate_key,
)
from ..sessions.identity import rebind_advice
from ..sessions.transcript import Event, read_page
from ..sessions.workspaces import WORKSPACE_COLUMNS, current_workspace, identity_of, settle_workspace

from ..core.database import Database
from ..queue.jobs import job_by_rowid
from ..queue.service import JobQueue
from .versions import tombstone_version, upsert_version
from ..sessions.rows import range_bytes, session_rowid
if TYPE_CHECKING:
    from ..queue.claim import JobClaim

DISTILL_KIND = "distill"
MAX_CANDIDATES = 128  # unique candidates one job may apply
MAX_RAW_CANDIDATES = 4 * MAX_CANDIDATES  # proposals read from a distiller, duplicates included
KNOWLEDGE_CONTEXT_ITEMS = 200  # live entries shown to the distiller
KNOWLEDGE_CONTEXT_BYTES = 1024 * 1024
DISTILL_RESERVE_TOKENS = 1024  # of a model's window: instructions, known Knowledge and the constrained answer


@dataclass(frozen=True)
class KnowledgeCandidate:
    """One change a distiller proposes: upsert `key` with `content`, or retire it with `tombstone=True` (no content)."""

    key: str
    content: str | None = None
    confidence: float = 1.0
    tombstone: bool = False


@dataclass(frozen=True)
class DistillationInput:
    """What a distiller sees: the Session and its workspace path, the source provenance and events (oldest
    first), and the workspace's live Knowledge (at most 200 entries by key)."""

    session_id: str
    workspace: str
    source: KnowledgeSource
    events: tuple[Event, ...]
    knowledge: tuple[KnowledgeEntry, ...]


@dataclass(frozen=True)
class DistillationResult:
    """Candidates a guard kept, with counts of the proposals it dropped before them, by reason: `rejected` maps
    names starting with "rejected_" (e.g. "rejected_unsupported") to counts, added to the job's result."""

    candidates: tuple[KnowledgeCandidate, ...]
    rejected: Mapping[str, int] = field(default_factory=dict)


DistillFunction = Callable[[DistillationInput], "Iterable[KnowledgeCandidate] | DistillationResult"]
TokenCounter = Callable[[Event], int]


def validate_candidates(candidates: object) -> tuple[KnowledgeCandidate, ...]:
    """Check a distiller's proposals before anything is written; return the unique ones in order.

    Exact duplicates collapse to one. Two different proposals for one key,
    more than 128 unique candidates, more than 512 proposals, anything that
    is not a `KnowledgeCandidate`, or an invalid key, content or confidence
    raise `InvalidCandidateError`.
    """
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise InvalidCandidateError("a distiller must return an iterable of KnowledgeCandidate")
    raw = list(islice(candidates, MAX_RAW_CANDIDATES + 1))
    if len(raw) > MAX_RAW_CANDIDATES:
        raise InvalidCandidateError(f"a distiller proposed more than {MAX_RAW_CANDIDATES} candidates; nothing applied")
    unique: dict[str, KnowledgeCandidate] = {}
    for index, c in enumerate(raw):
        if not isinstance(c, KnowledgeCandidate):
            raise InvalidCandidateError(f"candidate {index} is a {type(c).__name__}, not a KnowledgeCandidate")
        try:
            validate_key(c.key)
            validate_confidence(c.confidence)
            if not isinstance(c.tombstone, bool):
                raise InvalidKnowledgeError("tombstone must be True or False")
            if c.tombstone and c.content is not None:
                raise InvalidKnowledgeError("a tombstone candidate carries no content")
            if not c.tombstone:
                validate_content(c.content)
        except InvalidKnowledgeError as exc:
            raise InvalidCandidateError(f"candidate {index} ({c.key!r}): {exc}; nothing applied") from None
        seen = unique.setdefault(c.key, c)
        if seen != c:
            raise InvalidCandidateError(f"candidates disagree about key {c.key!r}; nothing applied")
    if len(unique) > MAX_CANDIDATES:
        raise InvalidCandidateError(
            f"a distiller proposed {len(unique)} unique candidates, over the limit of {MAX_CANDIDATES}; nothing applied"
        )
    return tuple(unique.values())


def validate_result(result: object) -> DistillationResult:
    """A distiller's output as a validated `DistillationResult`: its candidates through `validate_candidates`, and
    its rejection counts checked (at most 16 names "rejected_<reason>", non-negative integers), else
    `InvalidCandidateError`."""
    if not isinstance(result, DistillationResult):
        return DistillationResult(validate_candidates(result))
    counts = result.rejected
    if not (isinstance(counts, Mapping) and len(counts) <= 16 and all(_count_entry(k, v) for k, v in counts.items())):
        raise InvalidCandidateError("a DistillationResult's rejected counts must map up to 16 'rejected_<reason>' "
                                    "names to non-negative integers; nothing applied")
    return DistillationResult(validate_candidates(result.candidates), dict(counts))


def _count_entry(name: object, count: object) -> bool:
    return (isinstance(name, str) and name.startswith("rejected_") and len("rejected_") < len(name) <= 64
            and isinstance(count, int) and not isinstance(count, bool) and count >= 0)


def nothing_saved(counts: Mapping[str, int]) -> str:
    """Why a distillation that applied nothing saved nothing, from its result's counts."""
    rejected = {k[len("rejected_"):].replace("_", " "): v for k, v in counts.items() if k.startswith("rejected_") and v}
    kept = {k.replace("skipped_", "").replace("_", " "): counts.get(k, 0)
            for k in ("unchanged", "skipped_pinned", "skipped_missing") if counts.get(k, 0)}
    if not counts.get("candidates") and not rejected:
        return "the distiller proposed no Knowledge"
    parts = [f"{n} rejected ({reason})" for reason, n in rejected.items()]
    parts += [f"{n} {what}" for what, n in kept.items()]
    return "nothing saved: " + ", ".join(parts)


DISTILL_SOURCE_FIELDS = {"first_seq": "id", "last_seq": "id", "digest": "digest"}


def validate_distill_source(source: Mapping[str, Any]) -> None:
    """Raise `InvalidJobSourceError` unless `source` has the shape `queue_distillation` records: seqs
    `first_seq <= last_seq` (both >= 1) and a 64-hex `digest`. The "distill" kind's source validator."""
    remedy = "queue distillation with queue_distillation"
    check_fields(source, DISTILL_KIND, DISTILL_SOURCE_FIELDS, remedy)
    if source["first_seq"] > source["last_seq"]:
        raise InvalidJobSourceError(f"a distill job source needs first_seq <= last_seq, got {source['first_seq']} > "
                                    f"{source['last_seq']}; {remedy}")


def _source_of(job: Job) -> KnowledgeSource:
    validate_distill_source(job.source)
    s = job.source
    return KnowledgeSource(job.session_id, s["first_seq"], s["last_seq"], s["digest"])


def _complete_distillation(ctx: CompletionContext, result: Any) -> dict[str, Any]:
    """Inside the completion transaction: queue the parts of a `DistillationSplit`, or re-check source and workspace,
    then apply every candidate or none."""
    if isinstance(result, DistillationSplit):
        return complete_split(ctx, result, DISTILL_KIND)
    checked = validate_result(result)
    candidates = checked.candidates
    conn, store, source = ctx.conn, ctx.store, _source_of(ctx.job)
    if source_digest(conn, ctx.session_rowid, source.session_id, source.first_seq, source.last_seq) != source.digest:
        raise SourceChangedError(f"the source events of distillation job {ctx.job.id} changed; nothing applied")
    row = conn.execute(
        f"SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE id = (SELECT workspace_id FROM sessions WHERE id = ?)",
        (ctx.session_rowid,),
    ).fetchone()
    try:
        settle_workspace(conn, row, current_workspace(identity_of(row)))
    except WorkspaceError as exc:
        raise _workspace_failure(exc, row[0], row[1]) from None
    scope = row[0]
    src = (ctx.session_rowid, source.session_id, source.first_seq, source.last_seq, source.digest)
    counts = {"candidates": len(candidates), "applied": 0, "unchanged": 0, "skipped_pinned": 0, "skipped_missing": 0}
    for c in candidates:
        row = conn.execute(
            "SELECT id, head_version, tombstoned_at, pinned FROM knowledge WHERE workspace_id = ? AND key = ?",
            (scope, c.key),
        ).fetchone()
        if row is not None and row[3]:
            counts["skipped_pinned"] += 1
        elif c.tombstone and row is None:
            counts["skipped_missing"] += 1
        elif c.tombstone:
            changed = row[2] is None
            tombstone_version(conn, row, c.key, "distillation", store.db.clock())
            counts["applied" if changed else "unchanged"] += 1
        else:
            version = upsert_version(
                conn, scope, c.key, c.content, float(c.confidence), "distillation", src, store.db.clock()
            )
            counts["applied" if row is None or version.version > row[1] else "unchanged"] += 1
    counts.update(checked.rejected)
    if not counts["applied"]:
        counts["nothing_saved"] = nothing_saved(counts)
    return counts


def _workspace_failure(exc: WorkspaceError, workspace_id: int, path: str) -> PermanentJobError:
    """The permanent failure of a job whose Session's workspace is gone or replaced, with the way out."""
    if isinstance(exc, WorkspaceReplacedError):
        return PermanentJobError(f"{exc}; {rebind_advice(workspace_id, path)}, then retry the job")
    return PermanentJobError(f"{exc}; resume the Session from its workspace, then retry the job")


DISTILL_JOB_KIND = JobKind(DISTILL_KIND, _complete_distillation, validate=validate_distill_source)


def distillation_input(
    store: Store, job: Job, *, safe_context_tokens: int | None = None, count_tokens: TokenCounter | None = None
) -> DistillationInput | DistillationSplit:
    """What distill job `job` (as claimed) gives its distiller: its bounded source events and the workspace's
    Knowledge, or, for a source too large to read or to fit the model, the `DistillationSplit` its completion
    queues instead.

    A source of several events over `knowledge_source_max_bytes`, or (with
    `safe_context_tokens`) over 8 bytes per budget token or whose tokens
    (`count_tokens`, default one per 4 bytes) exceed the budget, is split. A
    single event over the budget raises `SourceTooLargeError`, a permanent
    failure; a Session whose workspace is gone or replaced, a
    `PermanentJobError` saying how to bring it back.
    """
    source = _source_of(job)
    if source.last_seq > source.first_seq:
        split = store.distillation.split_by_bytes(job, byte_budget(store.settings.knowledge_source_max_bytes,
                                                                   safe_context_tokens))
        if split is not None:
            return split
    events = store.read_distillation_source(job)
    if safe_context_tokens is not None:
        counter = count_tokens or (lambda e: (e.size + 3) // 4)
        counts = [counter(e) for e in events]
        tokens = sum(counts)
        if tokens > safe_context_tokens and len(events) > 1:
            return DistillationSplit(tuple(token_ranges(events, counts, safe_context_tokens)))
        if tokens > safe_context_tokens:
            raise SourceTooLargeError(
                f"distillation source of job {job.id} (event {source.first_seq} alone) has {tokens} tokens, "
                f"over the model's safe context budget of {safe_context_tokens}; use a model with a larger "
                "context, then retry the job"
            )
    session = store.get_session(job.session_id)
    workspace = session.workspace
    try:
        page = store.recall(workspace, limit=KNOWLEDGE_CONTEXT_ITEMS, max_bytes=KNOWLEDGE_CONTEXT_BYTES)
    except WorkspaceError as exc:
        raise _workspace_failure(exc, session.workspace_id, workspace.path) from None
    return DistillationInput(source.session_id, workspace.path, source, tuple(events), tuple(page.entries))


def distillation_handler(
    distill: DistillFunction, *, safe_context_tokens: int | None = None, count_tokens: TokenCounter | None = None
) -> Callable[[JobClaim], DistillationResult | DistillationSplit]:
    """A `run_one_job` handler for "distill" jobs with a plain `distill(data)` (the worker of `emelex memory work`
    runs the same steps itself, `Worker._distill`): read what the job gives its distiller (`distillation_input`,
    or the split of a source too large for `safe_context_tokens`), call `distill`, and validate its candidates
    before completion. `distill` may return a `DistillationResult` (candidates plus counts of what a guard
    rejected): completion adds those counts to the job's result, and a job that applies nothing says why under
    "nothing_saved"."""

    def handle(claim: JobClaim) -> DistillationResult | DistillationSplit:
        data = distillation_input(claim.store, claim.job, safe_context_tokens=safe_context_tokens,
                                  count_tokens=count_tokens)
        return data if isinstance(data, DistillationSplit) else validate_result(distill(data))

    return handle


class Distillation:
    """Queueing and reading distillation (`store.distillation`)."""

    def __init__(self, db: Database, jobs: JobQueue) -> None:
        """Serve `db`, queueing through `jobs`."""
        self._db = db
        self._jobs = jobs

    def queue_distillation(self, session_id: str) -> Enqueued | None:
        """Queue distillation of the Session's events not yet covered by a pending, running or done distill job.

        Keyed by (Session, source digest): queueing the same source again
        returns the existing job with `created=False`. Returns None for a
        Session without events. Only queues; a worker runs it later.
        """
        with self._db.read() as conn:
            rowid = session_rowid(conn, session_id)
            last = conn.execute("SELECT last_seq FROM session_heads WHERE id = ?", (rowid,)).fetchone()[0]
            covered = conn.execute(
                "SELECT id, json_extract(source, '$.last_seq') AS through FROM jobs WHERE kind = ? AND session_id = ? "
                "AND state IN ('pending', 'claimed', 'done') ORDER BY through DESC, id DESC LIMIT 1",
                (DISTILL_KIND, rowid),
            ).fetchone()
            if covered is not None and covered[1] >= last:
                return Enqueued(job_by_rowid(conn, covered[0]), False)
            first = 1 if covered is None else covered[1] + 1
            if last < first:
                return None
            digest = source_digest(conn, rowid, session_id, first, last)
        if digest is None:
            raise SourceChangedError(f"Session {session_id} lacks events {first}..{last}; nothing was queued")
        source = {"first_seq": first, "last_seq": last, "digest": digest}
        return self._jobs.enqueue_job(DISTILL_KIND, session_id, source, source_key=digest)

    def split_by_bytes(self, job: Job, budget: int) -> DistillationSplit | None:
        """A split of a distill job whose source holds more than `budget` bytes (None when it fits), cut from the
        event sizes alone."""
        source = _source_of(job)
        with self._db.read() as conn:
            rowid = session_rowid(conn, job.session_id)
            size = range_bytes(conn, rowid, source.first_seq, source.last_seq)
            if size <= budget:
                return None
            ranges = byte_ranges(conn, rowid, source.first_seq, source.last_seq, budget)
        return DistillationSplit(tuple(ranges)) if len(ranges) > 1 else None

    def read_distillation_source(self, job: Job) -> list[Event]:
        """The source events of a distill job, oldest first, verified against its digest.

        Raises `SourceTooLargeError` when the range holds more than
        `knowledge_source_max_bytes` and `SourceChangedError` when the events
        no longer match the digest.
        """
        source = _source_of(job)
        cap = self._db.settings.knowledge_source_max_bytes
        with self._db.read() as conn:
            rowid = session_rowid(conn, job.session_id)
            size = range_bytes(conn, rowid, source.first_seq, source.last_seq)
            if size > cap:
                raise SourceTooLargeError(
                    f"distillation source of job {job.id} holds {size} bytes, over knowledge_source_max_bytes "
                    f"({cap}); raise it, then retry the job"
                )
            events: list[Event] = []
            after = source.first_seq - 1
            while after < source.last_seq:
                page = read_page(conn, rowid, after, min(source.last_seq - after, self._db.settings.max_page_items),
                                 self._db.settings.page_bytes)
                events.extend(e for e in page.events if e.seq <= source.last_seq)
                if not page.events:
                    break
                after = page.events[-1].seq
            digest = source_digest(conn, rowid, source.session_id, source.first_seq, source.last_seq)
        if digest != source.digest or len(events) != source.last_seq - source.first_seq + 1:
            raise SourceChangedError(f"the source events of distillation job {job.id} changed; the job is obsolete")
        return events
