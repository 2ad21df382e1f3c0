"""Compaction: planning and queueing of compaction jobs, and the "compaction" job kind.

Planning (what chat's `/compact` calls) only plans and queues; it never runs
inference. It reads the Session's replay view (the newest Summary, then the
uncovered tail), groups it into atomic turns, counts tokens with a counter the
caller supplies, and lets `CompactionPolicy` (see `compaction_policy.py`)
choose how many leading turns to replace, one turn in memory at a time. The
job records the exact source prefix (see `source_digest.py`). A worker later
summarizes that prefix and completes the job with a `SummaryDraft`;
completion re-checks everything and appends the Summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .compaction_policy import CompactionPolicy, TurnSelection
from .cursors import check_position
from .errors import InvalidInputError, SourceChangedError, SourceTooLargeError
from .job_sources import check_fields
from .jobs import CompletionContext, Job, register_job_kind
from .source_digest import digest_source
from .summaries import append_summary, newest_summary, read_source_page
from .transcript import SUMMARY_KIND, Event, ReplayPage

if TYPE_CHECKING:
    from .queue import JobClaim
    from .store import MemoryStore

COMPACTION_KIND = "compaction"
MAX_MODEL_REF_CHARS = 512

TokenCounter = Callable[[Event], int]


def estimate_tokens(event: Event) -> int:
    """A tokenizer-free estimate: one token per 4 bytes of the event's canonical JSON, rounded up."""
    return (event.size + 3) // 4


@dataclass(frozen=True)
class CompactionPlan:
    """What planning found: the view's size and, when compaction is due, the exact source to replace.

    `source` is None when nothing should be compacted; `reason` says why,
    or what the source is.
    """

    session_id: str
    context_window: int
    history_tokens: int
    turns: int
    compact_turns: int
    source: dict[str, Any] | None
    reason: str


@dataclass(frozen=True)
class CompactionQueued:
    """What `queue_compaction` did: the plan, the compaction job (None when nothing is due) and whether it is new."""

    plan: CompactionPlan
    job: Job | None
    created: bool
    reason: str


@dataclass(frozen=True)
class SummaryDraft:
    """A worker's result for a compaction job: the Summary text and the model snapshot reference when known."""

    text: str
    model_ref: str | None = None


COMPACTION_SOURCE_FIELDS = {
    "base_summary_id": "id?", "count": "id", "digest": "digest", "first_event_id": "id", "last_event_id": "id",
    "through_seq": "id", "turns": "id", "preserve_turns": "count", "source_tokens": "count", "tail_tokens": "count",
    "context_window": "id", "target_tokens": "count", "summary_budget_tokens": "count",
}


def validate_compaction_source(source: Mapping[str, Any]) -> None:
    """Raise `InvalidJobSourceError` unless `source` has exactly the shape `plan_compaction` records.

    The source-shape check of the "compaction" kind: `enqueue_job` runs it
    before writing, workers and source readers before using a source.
    Whether the source still matches the Session is checked at completion.
    """
    check_fields(source, COMPACTION_KIND, COMPACTION_SOURCE_FIELDS, "queue compaction with queue_compaction")


def _complete_compaction(ctx: CompletionContext, result: Any) -> dict[str, Any]:
    validate_compaction_source(ctx.job.source)
    if not isinstance(result, SummaryDraft):
        raise InvalidInputError(f"a compaction job completes with a SummaryDraft, got {type(result).__name__}")
    if not isinstance(result.text, str) or not result.text.strip():
        raise InvalidInputError("a Summary needs non-empty text")
    ref = result.model_ref
    if ref is not None and (not isinstance(ref, str) or not 1 <= len(ref) <= MAX_MODEL_REF_CHARS):
        raise InvalidInputError(f"a model snapshot reference is a string of 1-{MAX_MODEL_REF_CHARS} characters")
    return append_summary(ctx, result.text, ref)


register_job_kind(COMPACTION_KIND, _complete_compaction, validate=validate_compaction_source)


def compaction_handler(
    summarize: Callable[[list[Event], Job], str],
    *,
    model_ref: str | None = None,
    safe_context_tokens: int | None = None,
    count_tokens: TokenCounter | None = None,
) -> Callable[[JobClaim], SummaryDraft]:
    """A worker handler for compaction jobs: read the source, check it fits the model, call `summarize`.

    `summarize(events, job)` gets the source prefix in replay order and
    returns the Summary text. A source over `safe_context_tokens` (counted
    with `count_tokens`, default the count recorded at planning) raises
    `SourceTooLargeError`, a permanent failure.
    """

    def handle(claim: JobClaim) -> SummaryDraft:
        events = claim.store.read_compaction_source(claim.job)
        if safe_context_tokens is not None:
            tokens = claim.job.source["source_tokens"] if count_tokens is None else sum(map(count_tokens, events))
            if tokens > safe_context_tokens:
                raise SourceTooLargeError(
                    f"compaction source of job {claim.id} has {tokens} tokens, over the model's safe context budget "
                    f"of {safe_context_tokens}; use a model with a larger context, then retry the job"
                )
        return SummaryDraft(summarize(events, claim.job), model_ref)

    return handle


class _Turn:
    __slots__ = ("turn", "count", "tokens", "first_id", "last_id", "last_seq", "summary")

    def __init__(self, event: Event) -> None:
        self.turn, self.count, self.tokens = event.turn, 0, 0
        self.first_id, self.summary = event.id, event.kind == SUMMARY_KIND


class CompactionMixin:
    """Compaction methods of `MemoryStore`."""

    def plan_compaction(
        self: MemoryStore,
        session_id: str,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
        policy: CompactionPolicy | None = None,
        force: bool = False,
    ) -> CompactionPlan:
        """Plan (read-only) which leading turns of a Session's replay view to compact; see `CompactionPolicy`.

        `count_tokens(event)` returns an event's tokens (the model's tokenizer;
        default `estimate_tokens`). `force` compacts below the trigger (all but
        the preserved turns). Raises `SummaryProvenanceError` when the newest
        Summary does not verify.
        """
        policy = policy or CompactionPolicy()
        selection = TurnSelection(policy, context_window, force=force)
        with self._read() as conn:
            rowid = self._session_rowid(conn, session_id)
        for turn in self._view_turns(rowid, count_tokens):
            selection.add(turn.tokens, turn, turn.count)
        first: _Turn | None = selection.first
        min_turns = 2 if first is not None and first.summary else 1
        k = selection.finish(min_turns)
        total, turns = selection.total_tokens, selection.turns

        def plan(source: dict[str, Any] | None, reason: str) -> CompactionPlan:
            return CompactionPlan(session_id, context_window, total, turns, k, source, reason)

        if k == 0:
            if turns - policy.preserve_turns < min_turns:
                return plan(None, f"{turns} turns in view; the newest {policy.preserve_turns} are always kept")
            share = math.floor(100 * total / context_window)
            return plan(None, f"history uses {total} of {context_window} tokens ({share}%), under the "
                              f"{policy.trigger_ratio:.0%} trigger")
        base = first.first_id if first.summary else None
        last: _Turn = selection.boundary
        tail = selection.tail_tokens
        with self._read() as conn:
            newest = newest_summary(conn, rowid)
            if (newest[0] if newest else None) != base:
                raise SourceChangedError(f"Session {session_id} was compacted while planning; plan again")
            facts = digest_source(conn, rowid, base, newest[1] if newest else 0, last.last_seq)
        source = {
            "base_summary_id": base, "count": facts.count, "digest": facts.digest,
            "first_event_id": facts.first_event_id, "last_event_id": facts.last_event_id,
            "through_seq": last.last_seq, "turns": k, "preserve_turns": policy.preserve_turns,
            "source_tokens": total - tail, "tail_tokens": tail, "context_window": context_window,
            "target_tokens": policy.target_tokens(context_window),
            "summary_budget_tokens": policy.summary_budget(tail, context_window),
        }
        if (facts.count, facts.first_event_id, facts.last_event_id) != (
            selection.compacted_events, first.first_id, last.last_id
        ):
            raise SourceChangedError(f"the history of Session {session_id} changed while planning; plan again")
        return plan(source, f"compact {k} of {turns} turns ({facts.count} events, {total - tail} tokens); "
                            f"{tail} tokens stay uncompacted")

    def _view_turns(self: MemoryStore, rowid: int, count_tokens: TokenCounter) -> Iterator[_Turn]:
        """The Session's replay view as atomic turns with their tokens, oldest first, one turn in memory at a time."""
        turn: _Turn | None = None
        after = 0
        while True:
            page = self._replay_page(rowid, after, None, None)
            for event in page.events:
                if turn is None or turn.turn != event.turn or event.kind == SUMMARY_KIND:
                    if turn is not None:
                        yield turn
                    turn = _Turn(event)
                tokens = count_tokens(event)
                if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                    raise InvalidInputError(f"the token counter returned {tokens!r}; it must return an int >= 0")
                turn.count, turn.tokens, turn.last_id, turn.last_seq = (
                    turn.count + 1, turn.tokens + tokens, event.id, event.seq
                )
            after = page.next_cursor
            if page.done:
                if turn is not None:
                    yield turn
                return

    def queue_compaction(
        self: MemoryStore,
        session_id: str,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
        policy: CompactionPolicy | None = None,
        force: bool = False,
    ) -> CompactionQueued:
        """Plan compaction and queue the job (idempotent per source digest); never runs inference.

        At most one compaction job per Session is pending or claimed: while
        one is, it is returned with `created=False`. Queueing is allowed while
        the Session is live; workers skip it until the lease ends.
        """
        plan = self.plan_compaction(
            session_id, context_window=context_window, count_tokens=count_tokens, policy=policy, force=force
        )
        if plan.source is None:
            return CompactionQueued(plan, None, False, f"nothing queued: {plan.reason}")
        with self._write() as conn:
            rowid = self._session_rowid(conn, session_id)
            active = conn.execute(
                "SELECT uuid FROM jobs WHERE session_id = ? AND kind = ? AND state IN ('pending', 'claimed') "
                "ORDER BY id LIMIT 1",
                (rowid, COMPACTION_KIND),
            ).fetchone()
            if active:
                return CompactionQueued(plan, self.get_job(active[0]), False,
                                        f"compaction job {active[0]} is already queued for this Session")
            newest = newest_summary(conn, rowid)
            if (newest[0] if newest else None) != plan.source["base_summary_id"]:
                raise SourceChangedError(f"Session {session_id} was compacted while planning; plan again")
            enqueued = self.enqueue_job(COMPACTION_KIND, session_id, plan.source, source_key=plan.source["digest"])
        verb = "queued" if enqueued.created else "already had"
        return CompactionQueued(plan, enqueued.job, enqueued.created,
                                f"{verb} compaction job {enqueued.job.id} ({enqueued.job.state}): {plan.reason}")

    def compaction_source(
        self: MemoryStore, job_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> ReplayPage:
        """One page of a compaction job's source prefix in replay order (base Summary first), bounded like replay.

        Raises `InvalidJobSourceError` when the job's source is malformed and
        `SourceChangedError` when its base Summary is gone.
        """
        limit, max_bytes = self._page_limits(limit, max_bytes, min_bytes=self.settings.max_event_bytes)
        check_position(after_seq, "after_seq")
        job = self.get_job(job_id)
        if job.kind != COMPACTION_KIND:
            raise InvalidInputError(f"job {job_id} is a {job.kind} job, not a compaction job")
        validate_compaction_source(job.source)
        with self._read() as conn:
            rowid = self._session_rowid(conn, job.session_id)
            return read_source_page(conn, rowid, job.source, after_seq, limit, max_bytes)

    def read_compaction_source(self: MemoryStore, job: Job, *, max_total_bytes: int | None = None) -> list[Event]:
        """Every event of a compaction job's source prefix, at most `max_total_bytes` (default `page_bytes`) in all.

        Raises `SourceTooLargeError` (a permanent job failure) past the cap,
        `SourceChangedError` when the source no longer matches the job and
        `InvalidJobSourceError` when the source is malformed.
        """
        validate_compaction_source(job.source)
        cap = self.settings.page_bytes if max_total_bytes is None else max_total_bytes
        events: list[Event] = []
        total, after = 0, 0
        while True:
            page = self.compaction_source(job.id, after)
            events.extend(page.events)
            total += sum(e.size for e in page.events)
            if total > cap:
                raise SourceTooLargeError(
                    f"compaction source of job {job.id} is over {cap} bytes; use a model with a larger context"
                )
            after = page.next_cursor
            if page.done:
                break
        if len(events) != job.source["count"]:
            raise SourceChangedError(f"the source of compaction job {job.id} no longer matches it; plan again")
        return events
