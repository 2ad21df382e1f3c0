"""Compaction: planning and queueing of compaction jobs, and the "compaction" job kind.

Planning (what chat's `/compact` calls) only plans and queues; it never runs
inference. It reads the Session's replay view (the newest Summary, then the
uncovered tail), groups it into atomic turns, counts tokens with a counter the
caller supplies, and lets `CompactionPolicy` (see `compaction/policy.py`)
choose how many leading turns to replace, one turn in memory at a time. A
source never exceeds what the summarizer of the planned-for window can read
(`source_token_budget`): a longer prefix is compacted in steps (see
`compaction/steps.py`). The job records the exact source prefix (see
`sessions/prefix_digest.py`). A worker later summarizes that prefix and completes the
job with a `SummaryDraft`; completion re-checks everything, appends the
Summary and, for a step, queues the next step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

from .policy import CompactionPolicy, TurnSelection, source_token_budget
from .steps import (
    LeadingRun,
    NextStep,
    ViewTurn,
    checked_tokens,
    choose_slice,
    goal_of,
    next_step,
    queue_next_step,
)
from ..core.cursors import check_position
from ..core.database import Database, read_in_snapshot
from ..queue.service import JobQueue
from ..sessions.replay import replay_page
from ..sessions.rows import session_rowid
from ..errors import InvalidInputError, InvalidJobSourceError, SourceChangedError, SourceTooLargeError, TurnTooLargeError
from ..queue.sources import check_fields
from ..queue.jobs import CompletionContext, Job
from ..queue.kinds import JobKind
from .summaries import append_summary, read_source_page, source_page, summary_payload
from ..sessions.prefix_digest import digest_prefix
from ..sessions.replay import newest_summary
from ..sessions.tokens import TokenCounter, estimate_tokens
from ..sessions.transcript import SUMMARY_KIND, Event, ReplayPage

if TYPE_CHECKING:
    from ..queue.service import JobClaim

COMPACTION_KIND = "compaction"
MAX_MODEL_REF_CHARS = 512
MAX_STOP_CHARS = 2048


def tokens_text(tokens: int, estimated: bool) -> str:
    """`N tokens`, or `N tokens (estimated)` for a count made with `estimate_tokens`: the one way token figures
    that are estimates are marked wherever they are shown."""
    return f"{tokens} tokens (estimated)" if estimated else f"{tokens} tokens"


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
    """A worker's result for a compaction job: the Summary text, the model snapshot reference when known, and, for
    a step of a compaction in steps, the next step to queue with it (`plan_next_compaction_step`), or why the chain
    of steps stops here short of its goal (`chain_stopped`, recorded in the done job's result)."""

    text: str
    model_ref: str | None = None
    next_step: NextStep | None = None
    chain_stopped: str | None = None


COMPACTION_SOURCE_FIELDS = {
    "base_summary_id": "id?", "count": "id", "digest": "digest", "first_event_id": "id", "last_event_id": "id",
    "through_seq": "id", "turns": "id", "preserve_turns": "count", "source_tokens": "count", "tail_tokens": "count",
    "context_window": "id", "target_tokens": "count", "summary_budget_tokens": "count",
    "max_source_tokens": "count", "goal_through_seq": "id", "tokens_estimated": "flag",
}
# absent from sources planned before steps existed; "tokens_estimated" (true) only where the tokens are estimates
OPTIONAL_SOURCE_FIELDS = ("max_source_tokens", "goal_through_seq", "tokens_estimated")


def validate_compaction_source(source: Mapping[str, Any]) -> None:
    """Raise `InvalidJobSourceError` unless `source` has exactly the shape `plan_compaction` records.

    The source-shape check of the "compaction" kind: `enqueue_job` runs it
    before writing, workers and source readers before using a source.
    Whether the source still matches the Session is checked at completion.
    """
    check_fields(source, COMPACTION_KIND, COMPACTION_SOURCE_FIELDS, "queue compaction with queue_compaction",
                 OPTIONAL_SOURCE_FIELDS)
    if goal_of(source) < source["through_seq"]:
        raise InvalidJobSourceError("a compaction job source's goal_through_seq must not be before its through_seq; "
                                    "queue compaction with queue_compaction")


def _complete_compaction(ctx: CompletionContext, result: Any) -> dict[str, Any]:
    validate_compaction_source(ctx.job.source)
    if not isinstance(result, SummaryDraft):
        raise InvalidInputError(f"a compaction job completes with a SummaryDraft, got {type(result).__name__}")
    if not isinstance(result.text, str) or not result.text.strip():
        raise InvalidInputError("a Summary needs non-empty text")
    ref = result.model_ref
    if ref is not None and (not isinstance(ref, str) or not 1 <= len(ref) <= MAX_MODEL_REF_CHARS):
        raise InvalidInputError(f"a model snapshot reference is a string of 1-{MAX_MODEL_REF_CHARS} characters")
    if result.next_step is not None and not isinstance(result.next_step, NextStep):
        raise InvalidInputError(f"a SummaryDraft's next step is a NextStep, got {type(result.next_step).__name__}")
    stopped = result.chain_stopped
    if stopped is not None and (not isinstance(stopped, str) or not 1 <= len(stopped) <= MAX_STOP_CHARS):
        raise InvalidInputError(f"why a compaction chain stopped is a string of 1-{MAX_STOP_CHARS} characters")
    done = append_summary(ctx, result.text, ref)
    if result.next_step is not None:
        done["next_job"] = queue_next_step(ctx, result.next_step, done["summary_event_id"], COMPACTION_KIND)
    elif stopped is not None:
        done["chain_stopped"] = stopped
    return done


COMPACTION_JOB_KIND = JobKind(COMPACTION_KIND, _complete_compaction, validate=validate_compaction_source)


def check_source_fits(
    job: Job,
    events: Sequence[Event],
    *,
    context_window: int | None = None,
    safe_context_tokens: int | None = None,
    count_tokens: TokenCounter | None = None,
) -> None:
    """Raise `SourceTooLargeError` (a permanent failure) unless compaction job `job`'s source `events` fit the model
    that is to summarize them: at most `safe_context_tokens` tokens or, given the model's `context_window` instead,
    `source_token_budget(context_window, the job's Summary budget)` (the limit planning uses), counted with
    `count_tokens` (default: the count recorded at planning). With neither limit, anything fits."""
    limit = safe_context_tokens
    if limit is None and context_window is not None:
        limit = source_token_budget(context_window, job.source["summary_budget_tokens"])
    if limit is None:
        return
    tokens = job.source["source_tokens"] if count_tokens is None else sum(map(count_tokens, events))
    if tokens > limit:
        raise SourceTooLargeError(_too_large(job, tokens, limit, context_window))


def compaction_handler(
    summarize: Callable[[list[Event], Job], str],
    *,
    model_ref: str | None = None,
    safe_context_tokens: int | None = None,
    count_tokens: TokenCounter | None = None,
    context_window: int | None = None,
) -> Callable[[JobClaim], SummaryDraft]:
    """A `run_one_job` handler for compaction jobs with a plain `summarize(events, job) -> text` (the worker of
    `emelex memory work` runs the same steps itself, `Worker._compact`): read the source
    (`read_compaction_source`), check it fits the model (`check_source_fits` with `safe_context_tokens`, or
    `context_window`, and `count_tokens`), call `summarize` with the source prefix in replay order, and return the
    draft (`compaction_draft`, given `context_window`: a step of a compaction in steps also plans the next step;
    else the text with `model_ref`)."""

    def handle(claim: JobClaim) -> SummaryDraft:
        job, store = claim.job, claim.store
        events = store.read_compaction_source(job)
        check_source_fits(job, events, context_window=context_window, safe_context_tokens=safe_context_tokens,
                          count_tokens=count_tokens)
        text = summarize(events, job)
        if context_window is None:
            return SummaryDraft(text, model_ref)
        return store.compaction_draft(job, text, model_ref, context_window=context_window,
                                      count_tokens=count_tokens or estimate_tokens)

    return handle


def _too_large(job: Job, tokens: int, limit: int, window: int | None) -> str:
    where = f" in this model's {window}-token window" if window is not None else ""
    return (
        f"compaction source of job {job.id} has {tokens} tokens, over the {limit} a summarizer can read{where} beside "
        f"its {job.source['summary_budget_tokens']}-token Summary; plan it again for this model with "
        f"`emelex memory compact {job.session_id}` (or queue_compaction with its window and tokenizer), which splits "
        "it into steps that fit"
    )


class Compaction:
    """Compaction methods of `MemoryStore`."""

    def __init__(self, db: Database, jobs: JobQueue) -> None:
        """Serve `db`, queueing through `jobs`."""
        self._db = db
        self._jobs = jobs

    def plan_compaction(
        self,
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
        the preserved turns). The source never holds more than
        `source_token_budget(context_window, its Summary budget)` tokens: when
        the turns due do not fit, the plan is the first step of a compaction in
        steps (see `compaction/steps.py`). Planned with `estimate_tokens`, the
        source records `tokens_estimated: true` and the reason marks its token
        figures "(estimated)". Raises `TurnTooLargeError` when a
        turn alone cannot fit, and `SummaryProvenanceError` when the newest
        Summary does not verify.
        """
        policy = policy or CompactionPolicy()
        estimated = count_tokens is estimate_tokens
        selection = TurnSelection(policy, context_window, force=force)
        reserve = policy.summary_reserve(context_window)
        steps = LeadingRun(source_token_budget(context_window, reserve))
        with self._db.read() as conn:
            rowid = session_rowid(conn, session_id)
        for turn in self._view_turns(rowid, count_tokens):
            selection.add(turn.tokens, turn, turn.count)
            steps.add(turn)
        first: ViewTurn | None = selection.first
        min_turns = 2 if first is not None and first.summary else 1
        k = selection.finish(min_turns)
        total, turns = selection.total_tokens, selection.turns

        def plan(source: dict[str, Any] | None, reason: str) -> CompactionPlan:
            return CompactionPlan(session_id, context_window, total, turns, k, source, reason)

        if k == 0:
            if turns - policy.preserve_turns < min_turns:
                return plan(None, f"{turns} turns in view; the newest {policy.preserve_turns} are always kept")
            share = math.floor(100 * total / context_window)
            return plan(None, f"history uses {tokens_text(total, estimated)} of {context_window} ({share}%), under "
                              f"the {policy.trigger_ratio:.0%} trigger")
        goal = LeadingRun()
        goal.turns, goal.tokens, goal.events, goal.last = (
            k, total - selection.tail_tokens, selection.compacted_events, selection.boundary
        )
        budget = policy.summary_budget(selection.tail_tokens, context_window)
        chosen = choose_slice(goal, steps, budget, reserve, context_window, min_turns, session_id)
        base = first.first_id if first.summary else None
        last: ViewTurn = chosen.last
        tail = total - chosen.tokens
        with self._db.read() as conn:
            newest = newest_summary(conn, rowid)
            if (newest[0] if newest else None) != base:
                raise SourceChangedError(f"Session {session_id} was compacted while planning; plan again")
            facts = digest_prefix(conn, rowid, base, newest[1] if newest else 0, last.last_seq)
        source = {
            "base_summary_id": base, "count": facts.count, "digest": facts.digest,
            "first_event_id": facts.first_event_id, "last_event_id": facts.last_event_id,
            "through_seq": last.last_seq, "turns": chosen.turns, "preserve_turns": policy.preserve_turns,
            "source_tokens": chosen.tokens, "tail_tokens": tail, "context_window": context_window,
            "target_tokens": policy.target_tokens(context_window), "summary_budget_tokens": chosen.budget,
            "max_source_tokens": source_token_budget(context_window, chosen.budget),
            "goal_through_seq": selection.boundary.last_seq, **({"tokens_estimated": True} if estimated else {}),
        }
        if (facts.count, facts.first_event_id, facts.last_event_id) != (chosen.events, first.first_id, last.last_id):
            raise SourceChangedError(f"the history of Session {session_id} changed while planning; plan again")
        if chosen.step:
            return plan(source, f"compact the oldest {chosen.turns} of the {k} turns due ({facts.count} events, "
                                f"{tokens_text(chosen.tokens, estimated)}: all {tokens_text(goal.tokens, estimated)} would "
                                "not fit the model beside a Summary); "
                                "further steps follow as each Summary lands, until the view is under "
                                f"{source['target_tokens']} tokens")
        return plan(source, f"compact {k} of {turns} turns ({facts.count} events, "
                            f"{tokens_text(chosen.tokens, estimated)}); {tokens_text(tail, estimated)} stay uncompacted")

    def plan_next_compaction_step(
        self,
        job: Job,
        text: str,
        model_ref: str | None = None,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
    ) -> NextStep | None:
        """Read-only: the next step after compaction job `job` completes with the Summary `text` (see
        `compaction/steps.py`), for a `context_window`-token model counting with `count_tokens`; pass it to the
        completion as `SummaryDraft.next_step`.

        None when `job` is not a step short of its goal, or when the view
        will be at most the target once its Summary lands. Counted with
        `estimate_tokens`, the step's source records `tokens_estimated`. Raises
        `TurnTooLargeError` when the next turn does not fit the model. `job`'s
        source is as a claim checked it (`run_one_job` checks a claimed job's).
        """
        source = job.source
        if goal_of(source) <= source["through_seq"]:
            return None
        payload = summary_payload(job.id, source, model_ref, text, self._db.settings.max_event_bytes)
        preview = Event((0, 0, 0, 0, SUMMARY_KIND, payload.decode("utf-8"), len(payload), 0, 0.0, None))
        tokens = checked_tokens(count_tokens(preview))
        with self._db.read() as conn:
            rowid = session_rowid(conn, job.session_id)
        later = self._view_turns(rowid, count_tokens, after=source["through_seq"])
        return next_step(source, tokens, later, context_window, job.session_id,
                         estimated=count_tokens is estimate_tokens)

    def compaction_draft(
        self,
        job: Job,
        text: str,
        model_ref: str | None = None,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
    ) -> SummaryDraft:
        """What compaction job `job` completes with once its Summary `text` is written (and checked): the text, the
        model snapshot reference (None for a Summary no model wrote), and, for a step of a compaction in steps, the
        next step (`plan_next_compaction_step` for a `context_window`-token model counting with `count_tokens`).
        When the next turn cannot fit the model, this step's Summary still lands and the chain stops, the draft (and
        the done job's result) saying why (`chain_stopped`). Read-only."""
        try:
            step = self.plan_next_compaction_step(job, text, model_ref, context_window=context_window,
                                                  count_tokens=count_tokens)
        except TurnTooLargeError as exc:  # this step's Summary still lands; the chain stops here, saying why
            return SummaryDraft(text, model_ref, None, f"the compaction chain stopped short of its goal: {exc}"[
                :MAX_STOP_CHARS])
        return SummaryDraft(text, model_ref, step)

    def _view_turns(self, rowid: int, count_tokens: TokenCounter, after: int = 0) -> Iterator[ViewTurn]:
        """The Session's replay view after raw seq `after` as atomic turns with their tokens, oldest first, one turn
        in memory at a time: an agent turn (its request, the tool batches it caused, its answer or failure) is one."""
        turn: ViewTurn | None = None
        while True:
            page = replay_page(self._db, rowid, after, None, None)
            for event in page.events:
                if turn is None or not turn.continued_by(event):
                    if turn is not None:
                        yield turn
                    turn = ViewTurn(event)
                turn.add(event, checked_tokens(count_tokens(event)))
            after = page.next_cursor
            if page.done:
                if turn is not None:
                    yield turn
                return

    def queue_compaction(
        self,
        session_id: str,
        *,
        context_window: int,
        count_tokens: TokenCounter = estimate_tokens,
        policy: CompactionPolicy | None = None,
        force: bool = False,
    ) -> CompactionQueued:
        """Plan compaction and queue the job (idempotent per plan: the same source is queued once); never runs
        inference.

        At most one compaction job per Session is pending or claimed: while
        one is, it is returned with `created=False`, as is an earlier job of
        exactly this plan (the reason says what became of it). Queueing is
        allowed while the Session is live; workers skip it until the lease
        ends. Raises `TurnTooLargeError` when a turn cannot fit the model.
        """
        plan = self.plan_compaction(
            session_id, context_window=context_window, count_tokens=count_tokens, policy=policy, force=force
        )
        if plan.source is None:
            return CompactionQueued(plan, None, False, f"nothing queued: {plan.reason}")
        with self._db.write() as conn:
            rowid = session_rowid(conn, session_id)
            active = conn.execute(
                "SELECT uuid FROM jobs WHERE session_id = ? AND kind = ? AND state IN ('pending', 'claimed') "
                "ORDER BY id LIMIT 1",
                (rowid, COMPACTION_KIND),
            ).fetchone()
            if active:
                return CompactionQueued(plan, self._jobs.get_job(active[0]), False,
                                        f"compaction job {active[0]} is already queued for this Session")
            newest = newest_summary(conn, rowid)
            if (newest[0] if newest else None) != plan.source["base_summary_id"]:
                raise SourceChangedError(f"Session {session_id} was compacted while planning; plan again")
            enqueued = self._jobs.enqueue_job(COMPACTION_KIND, session_id, plan.source)
        if enqueued.created:
            reason = f"queued compaction job {enqueued.job.id} (pending): {plan.reason}"
        else:
            reason = _planned_before(enqueued.job)
        return CompactionQueued(plan, enqueued.job, enqueued.created, reason)

    def compaction_source(
        self, job_id: str, after_seq: int = 0, *, limit: int | None = None, max_bytes: int | None = None
    ) -> ReplayPage:
        """One page of a compaction job's source prefix in replay order (base Summary first), bounded like replay.

        Raises `InvalidJobSourceError` when the job's source is malformed and
        `SourceChangedError` when its base Summary is gone.
        """
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=self._db.settings.max_event_bytes)
        check_position(after_seq, "after_seq")
        job = self._jobs.get_job(job_id)
        if job.kind != COMPACTION_KIND:
            raise InvalidInputError(f"job {job_id} is a {job.kind} job, not a compaction job")
        validate_compaction_source(job.source)
        with self._db.read() as conn:
            rowid = session_rowid(conn, job.session_id)
            return read_source_page(conn, rowid, job.source, after_seq, limit, max_bytes)

    def read_compaction_source(self, job: Job, *, max_total_bytes: int | None = None) -> list[Event]:
        """Every event of compaction job `job`'s source prefix in replay order (base Summary first), at most
        `max_total_bytes` (default `page_bytes`) in all, read page by page in one read transaction.

        Raises `InvalidJobSourceError` when the source is malformed (a job
        read from a database an older version or a hand wrote),
        `SourceTooLargeError` (a permanent job failure) past the cap and
        `SourceChangedError` when the source no longer matches the job.
        """
        validate_compaction_source(job.source)
        cap = self._db.settings.page_bytes if max_total_bytes is None else max_total_bytes
        limit, max_bytes = self._db.page_limits(None, None, min_bytes=self._db.settings.max_event_bytes)
        with self._db.read() as conn:
            return read_in_snapshot(conn, _source_events, job, cap, limit, max_bytes)


def _source_events(conn: apsw.Connection, job: Job, cap: int, limit: int, max_bytes: int) -> list[Event]:
    """`read_compaction_source` inside its read transaction: every page of the source, at most `cap` bytes."""
    rowid = session_rowid(conn, job.session_id)
    events: list[Event] = []
    total, after = 0, 0
    while True:
        page = source_page(conn, rowid, job.source, after, limit, max_bytes)
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


def _planned_before(job: Job) -> str:
    """Why nothing new was queued: this exact plan already has `job`, which is done, failed or cancelled."""
    if job.state == "done":
        seq = (job.result or {}).get("summary_seq")
        return (f"this exact plan already ran as compaction job {job.id}, whose Summary (seq {seq}) was reverted: "
                f"`emelex memory compaction redo {job.session_id}` brings it back, or plan differently "
                "(e.g. --target-ratio)")
    why = f" ({job.diagnostics[-1].message})" if job.diagnostics else ""
    return (f"this exact plan already {job.state} as compaction job {job.id}{why}: `emelex memory jobs retry "
            f"{job.id}` runs it again, or plan differently")
