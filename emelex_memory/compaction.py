"""Compaction: the policy, planning and queueing of compaction jobs, and the "compaction" job kind.

Planning (what chat's `/compact` calls) only plans and queues; it never runs
inference. It reads the Session's replay view (the newest Summary, then the
uncovered tail), groups it into atomic turns, counts tokens with a counter the
caller supplies, and lets `CompactionPolicy` choose how many leading turns to
replace. The job records the exact source prefix (see `source_digest.py`). A
worker later summarizes that prefix and completes the job with a
`SummaryDraft`; completion re-checks everything and appends the Summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import InvalidInputError, SourceChangedError, SourceTooLargeError
from .jobs import CompletionContext, Job, register_job_kind
from .source_digest import digest_source
from .summaries import append_summary, newest_summary, read_source_page, through_seq_of
from .transcript import SUMMARY_KIND, Event, ReplayPage

if TYPE_CHECKING:
    from .queue import JobClaim
    from .store import MemoryStore

COMPACTION_KIND = "compaction"
MAX_MODEL_REF_CHARS = 512
MIN_SUMMARY_SHARE = 0.1  # a Summary may always use this share of the window, even when the tail leaves less

TokenCounter = Callable[[Event], int]


def estimate_tokens(event: Event) -> int:
    """A tokenizer-free estimate: one token per 4 bytes of the event's canonical JSON, rounded up."""
    return (event.size + 3) // 4


@dataclass(frozen=True)
class CompactionPolicy:
    """When and how much to compact, in shares of the model's context window.

    Compaction triggers once the replay view uses `trigger_ratio` of the
    window and replaces the fewest leading turns that bring the uncompacted
    tail to at most `target_ratio` of it, always keeping the newest
    `preserve_turns` atomic turns. When the target cannot be reached it
    replaces everything but those turns.
    """

    trigger_ratio: float = 0.8
    target_ratio: float = 0.5
    preserve_turns: int = 4

    def __post_init__(self) -> None:
        for name in ("trigger_ratio", "target_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise InvalidInputError(f"{name} must be a number in (0, 1], got {value!r}")
        if self.target_ratio > self.trigger_ratio:
            raise InvalidInputError(
                f"target_ratio ({self.target_ratio}) must not exceed trigger_ratio ({self.trigger_ratio})"
            )
        if isinstance(self.preserve_turns, bool) or not isinstance(self.preserve_turns, int) or self.preserve_turns < 0:
            raise InvalidInputError(f"preserve_turns must be a non-negative integer, got {self.preserve_turns!r}")

    def triggered(self, total_tokens: int, context_window: int) -> bool:
        """True when `total_tokens` reach the trigger share of `context_window`."""
        return total_tokens >= self.trigger_ratio * context_window

    def select(
        self, turn_tokens: Sequence[int], context_window: int, *, min_turns: int = 1, force: bool = False
    ) -> int:
        """How many leading turns to compact (0: none), given each turn's tokens oldest first.

        Never more than all but the newest `preserve_turns`; never fewer than
        `min_turns` unless 0. Without `force`, 0 below the trigger. With
        `force`, everything but the preserved turns.
        """
        if context_window < 1:
            raise InvalidInputError(f"context_window must be at least 1 token, got {context_window}")
        most = len(turn_tokens) - self.preserve_turns
        total = sum(turn_tokens)
        if most < max(min_turns, 1) or not (force or self.triggered(total, context_window)):
            return 0
        if force:
            return most
        target = self.target_ratio * context_window
        tail = total
        for k in range(1, most + 1):
            tail -= turn_tokens[k - 1]
            if k >= min_turns and tail <= target:
                return k
        return most


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


def _complete_compaction(ctx: CompletionContext, result: Any) -> dict[str, Any]:
    if not isinstance(result, SummaryDraft):
        raise InvalidInputError(f"a compaction job completes with a SummaryDraft, got {type(result).__name__}")
    if not isinstance(result.text, str) or not result.text.strip():
        raise InvalidInputError("a Summary needs non-empty text")
    ref = result.model_ref
    if ref is not None and (not isinstance(ref, str) or not 1 <= len(ref) <= MAX_MODEL_REF_CHARS):
        raise InvalidInputError(f"a model snapshot reference is a string of 1-{MAX_MODEL_REF_CHARS} characters")
    return append_summary(ctx, result.text, ref)


register_job_kind(COMPACTION_KIND, _complete_compaction)


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
        if isinstance(context_window, bool) or not isinstance(context_window, int) or context_window < 1:
            raise InvalidInputError(f"context_window must be a positive number of tokens, got {context_window!r}")
        with self._read() as conn:
            rowid = self._session_rowid(conn, session_id)
        turns = self._view_turns(rowid, count_tokens)
        total = sum(t.tokens for t in turns)
        min_turns = 2 if turns and turns[0].summary else 1
        k = policy.select([t.tokens for t in turns], context_window, min_turns=min_turns, force=force)

        def plan(source: dict[str, Any] | None, reason: str) -> CompactionPlan:
            return CompactionPlan(session_id, context_window, total, len(turns), k, source, reason)

        if k == 0:
            if len(turns) - policy.preserve_turns < min_turns:
                return plan(None, f"{len(turns)} turns in view; the newest {policy.preserve_turns} are always kept")
            share = math.floor(100 * total / context_window)
            return plan(None, f"history uses {total} of {context_window} tokens ({share}%), under the "
                              f"{policy.trigger_ratio:.0%} trigger")
        base = turns[0].first_id if turns[0].summary else None
        last = turns[k - 1]
        tail = total - sum(t.tokens for t in turns[:k])
        target = math.floor(policy.target_ratio * context_window)
        with self._read() as conn:
            newest = newest_summary(conn, rowid)
            if (newest[0] if newest else None) != base:
                raise SourceChangedError(f"Session {session_id} was compacted while planning; plan again")
            facts = digest_source(conn, rowid, base, through_seq_of(conn, rowid, base) or 0, last.last_seq)
        source = {
            "base_summary_id": base, "count": facts.count, "digest": facts.digest,
            "first_event_id": facts.first_event_id, "last_event_id": facts.last_event_id,
            "through_seq": last.last_seq, "turns": k, "source_tokens": total - tail, "tail_tokens": tail,
            "context_window": context_window, "target_tokens": target,
            "summary_budget_tokens": max(target - tail, math.floor(MIN_SUMMARY_SHARE * context_window)),
        }
        expected = (sum(t.count for t in turns[:k]), turns[0].first_id, last.last_id)
        if (facts.count, facts.first_event_id, facts.last_event_id) != expected:
            raise SourceChangedError(f"the history of Session {session_id} changed while planning; plan again")
        return plan(source, f"compact {k} of {len(turns)} turns ({facts.count} events, {total - tail} tokens); "
                            f"{tail} tokens stay uncompacted")

    def _view_turns(self: MemoryStore, rowid: int, count_tokens: TokenCounter) -> list[_Turn]:
        turns: list[_Turn] = []
        after = 0
        while True:
            page = self._replay_rowid(rowid, after, None, None)
            for event in page.events:
                if not turns or turns[-1].turn != event.turn or event.kind == SUMMARY_KIND:
                    turns.append(_Turn(event))
                tokens = count_tokens(event)
                if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                    raise InvalidInputError(f"the token counter returned {tokens!r}; it must return an int >= 0")
                t = turns[-1]
                t.count, t.tokens, t.last_id, t.last_seq = t.count + 1, t.tokens + tokens, event.id, event.seq
            after = page.next_cursor
            if page.done:
                return turns

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
        """One page of a compaction job's source prefix in replay order (base Summary first), bounded like replay."""
        limit, max_bytes = self._page_limits(limit, max_bytes, min_bytes=self.settings.max_event_bytes)
        if not isinstance(after_seq, int) or after_seq < 0:
            raise InvalidInputError(f"after_seq must be a non-negative integer, got {after_seq!r}")
        job = self.get_job(job_id)
        if job.kind != COMPACTION_KIND:
            raise InvalidInputError(f"job {job_id} is a {job.kind} job, not a compaction job")
        with self._read() as conn:
            rowid = self._session_rowid(conn, job.session_id)
            return read_source_page(conn, rowid, job.source, after_seq, limit, max_bytes)

    def read_compaction_source(self: MemoryStore, job: Job, *, max_total_bytes: int | None = None) -> list[Event]:
        """Every event of a compaction job's source prefix, at most `max_total_bytes` (default `page_bytes`) in all.

        Raises `SourceTooLargeError` (a permanent job failure) past the cap and
        `SourceChangedError` when the source no longer matches the job.
        """
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
