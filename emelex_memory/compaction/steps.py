"""Compaction in steps: what one job replaces, so that every source fits the model that summarizes it.

Planning first chooses the goal: the leading turns of the replay view that
`CompactionPolicy` would replace, ending at raw seq `goal_through_seq`. One job
replaces the whole goal when its tokens fit `source_token_budget(window, B)`
beside the policy's Summary budget B, or failing that beside the smaller
Summary reserve R. Otherwise the job is a step: it replaces the longest run of
leading turns (the base Summary and at least one turn) that fits beside an
R-token Summary, and records the goal.

When a step's Summary lands, the next step summarizes that Summary plus the
next turns toward the goal, chosen by the same rule. The worker's handler plans
it with the model's own tokenizer, after summarizing and outside any write
transaction (`next_step`), and the step's completion queues it in the same
transaction that appends the Summary (`queue_next_step`), as a distill split
queues its parts: a crash never leaves a half-compacted Session with nothing
queued. Steps end once the goal is reached or the view (the new Summary and
everything after it) is at most the target. Each step covers at least one
more turn, so the chain ends. A turn that, after the Summary before it, does
not fit alone raises `TurnTooLargeError`: turns are never split.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

from .policy import MIN_SUMMARY_SHARE, PROMPT_RESERVE_TOKENS, reserve_tokens, source_token_budget
from ..errors import InvalidInputError, SourceChangedError, TurnTooLargeError
from ..sessions.prefix_digest import MAX_COVERED_BYTES, digest_prefix
from .summaries import CONTINUATION_KINDS, check_replaceable
from ..sessions.transcript import SUMMARY_KIND, Event

if TYPE_CHECKING:
    from ..queue.jobs import CompletionContext


def checked_tokens(tokens: object) -> int:
    """`tokens` as returned by a token counter; `InvalidInputError` unless it is an int >= 0."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidInputError(f"the token counter returned {tokens!r}; it must return an int >= 0")
    return tokens


class ViewTurn:
    """One atomic turn of a replay view: its (first) turn number, events and tokens, first and last event IDs and
    last seq, and whether it is a Summary (a Summary is a turn of its own). An agent turn is one atomic turn: the
    store turn of its request and those that continue it (`CONTINUATION_KINDS`); `store_turn` is the last."""

    __slots__ = ("turn", "store_turn", "count", "tokens", "first_id", "last_id", "last_seq", "summary")

    def __init__(self, event: Event) -> None:
        """A turn starting with `event` (not yet counted: `add` it)."""
        self.turn, self.store_turn, self.count, self.tokens = event.turn, event.turn, 0, 0
        self.first_id, self.last_id, self.last_seq = event.id, event.id, event.seq
        self.summary = event.kind == SUMMARY_KIND

    def add(self, event: Event, tokens: int) -> None:
        """Count one more event of the turn with its tokens."""
        self.count, self.tokens, self.last_id, self.last_seq = self.count + 1, self.tokens + tokens, event.id, event.seq
        self.store_turn = event.turn

    def continued_by(self, event: Event) -> bool:
        """Whether `event` (the next of the view) belongs to this atomic turn: it is of the same store turn, or it
        opens a store turn continuing this agent turn (never after a Summary)."""
        if event.kind == SUMMARY_KIND:
            return False
        return event.turn == self.store_turn or (not self.summary and event.kind in CONTINUATION_KINDS)


class LeadingRun:
    """The leading turns of a view fed oldest first, while their tokens add up to at most `limit` (None: all).

    `overflow` is the first turn that did not fit; once there is one, later turns are ignored.
    """

    __slots__ = ("limit", "turns", "tokens", "events", "last", "overflow")

    def __init__(self, limit: int | None = None) -> None:
        """An empty run."""
        self.limit = limit
        self.turns = self.tokens = self.events = 0
        self.last: ViewTurn | None = None
        self.overflow: ViewTurn | None = None

    def add(self, turn: ViewTurn) -> None:
        """Take the next turn if the run has room for it."""
        if self.overflow is not None:
            return
        if self.limit is not None and self.tokens + turn.tokens > self.limit:
            self.overflow = turn
            return
        self.turns, self.tokens, self.events, self.last = (
            self.turns + 1, self.tokens + turn.tokens, self.events + turn.count, turn
        )


@dataclass(frozen=True)
class Slice:
    """What one job replaces: its leading turns, their events and tokens, the newest of them, the Summary budget,
    and whether it is a step short of the goal."""

    turns: int
    events: int
    tokens: int
    last: Any
    budget: int
    step: bool


def choose_slice(
    goal: LeadingRun, steps: LeadingRun, budget: int, reserve: int, window: int, min_turns: int, session_id: str
) -> Slice:
    """The whole `goal` when it fits beside a Summary of `budget` tokens, or of `reserve`; else the step run `steps`
    (leading turns fitting beside a `reserve`-token Summary), which must hold at least `min_turns` turns.

    Raises `TurnTooLargeError` naming the turn that does not fit.
    """
    for allowed in dict.fromkeys((budget, reserve)):
        if goal.tokens <= source_token_budget(window, allowed):
            return Slice(goal.turns, goal.events, goal.tokens, goal.last, allowed, False)
    if steps.turns < min_turns:
        big = steps.overflow
        before = f" after the {steps.tokens}-token Summary before it" if steps.turns else ""
        fits = min_window(steps.tokens + big.tokens)
        problem = (
            f"turn {big.turn} of Session {session_id} holds {big.tokens} tokens{before}, more than the "
            f"{max(steps.limit, 0)} a summarizer can read in a {window}-token window beside a {reserve}-token Summary, "
            f"and turns are never split; a window of {fits} tokens or more fits it"
        )
        raise TurnTooLargeError(
            f"{problem}: use a model with a context window that large (`emelex models install PATH`, then set "
            "default_model; model_max_context_tokens caps any model's window)",
            problem=problem, min_context_window=fits,
        )
    return Slice(steps.turns, steps.events, steps.tokens, steps.last, reserve, True)


def min_window(source_tokens: int) -> int:
    """A context window that fits `source_tokens` beside the largest Summary reserve and the prompt's allowance:
    the reserve is at most `MIN_SUMMARY_SHARE` of the window, so this much always suffices."""
    return math.ceil((source_tokens + PROMPT_RESERVE_TOKENS) / (1 - MIN_SUMMARY_SHARE))


@dataclass(frozen=True)
class NextStep:
    """The next step of a compaction in steps, planned before the current step completes (see `next_step`).

    It replaces the current step's new Summary plus the raw turns after the
    current step's range up to `through_seq`: `turns` turns and `count`
    events in all (the Summary included), the newest `last_event_id`, of
    `source_tokens` tokens with `tail_tokens` left uncompacted, summarized in
    `summary_budget_tokens`, planned for a `context_window`-token model toward
    `goal_through_seq`, its tokens estimates when `tokens_estimated`.
    Completion binds it to the new Summary and queues it.
    """

    through_seq: int
    turns: int
    count: int
    last_event_id: int
    source_tokens: int
    tail_tokens: int
    summary_budget_tokens: int
    context_window: int
    goal_through_seq: int
    tokens_estimated: bool = False


def goal_of(source: dict[str, Any]) -> int:
    """The raw seq a compaction source's chain of steps ends at (its own `through_seq` unless it is a step)."""
    return source.get("goal_through_seq", source["through_seq"])


def next_step(
    source: dict[str, Any], summary_tokens: int, later: Iterable[ViewTurn], context_window: int, session_id: str,
    *, estimated: bool = False,
) -> NextStep | None:
    """The step after the one `source` describes, once its Summary of `summary_tokens` lands; `later` are the view's
    turns after `source["through_seq"]`, oldest first. None when `source` is no step short of its goal, or when the
    view will be at most the target anyway. `estimated`: the tokens were counted with an estimate. Raises
    `TurnTooLargeError` when the next turn cannot fit."""
    goal_seq, target = goal_of(source), source["target_tokens"]
    if goal_seq <= source["through_seq"]:
        return None
    reserve = reserve_tokens(target, context_window)
    summary = ViewTurn(Event((0, 0, 0, 0, SUMMARY_KIND, "", 0, 0, 0.0, None)))
    summary.tokens, summary.count = summary_tokens, 1
    goal, steps = LeadingRun(), LeadingRun(source_token_budget(context_window, reserve))
    total = tail = 0
    for turn in chain((summary,), later):
        total += turn.tokens
        if turn is summary or turn.last_seq <= goal_seq:
            goal.add(turn)
            steps.add(turn)
        else:
            tail += turn.tokens
    if total <= target or goal.turns < 2:
        return None
    chosen = choose_slice(goal, steps, max(target - tail, reserve), reserve, context_window, 2, session_id)
    return NextStep(chosen.last.last_seq, chosen.turns, chosen.events, chosen.last.last_id, chosen.tokens,
                    total - chosen.tokens, chosen.budget, context_window, goal_seq, estimated)


def queue_next_step(ctx: CompletionContext, step: NextStep, summary_event_id: int, kind: str) -> str:
    """Inside the completion transaction that appended the Summary `summary_event_id`: bind `step` to it (the exact
    source, its digest) and queue it as a `kind` job; return the new job's ID.

    Raises `InvalidInputError` for a step outside the current one's goal,
    `SourceChangedError` when the Session no longer holds the events the step
    was planned on, and `InvalidJobSourceError` when it would split a turn or
    replace preserved turns; the whole completion then rolls back.
    """
    current = ctx.job.source
    base_through = current["through_seq"]
    if not isinstance(step, NextStep) or not base_through < step.through_seq <= step.goal_through_seq <= goal_of(
        current
    ):
        raise InvalidInputError(f"the next step of compaction job {ctx.job.id} must end after seq {base_through} and "
                                "no later than its goal")
    facts = digest_prefix(ctx.conn, ctx.session_rowid, summary_event_id, base_through, step.through_seq,
                          max_bytes=MAX_COVERED_BYTES)
    if (facts.count, facts.first_event_id, facts.last_event_id) != (step.count, summary_event_id, step.last_event_id):
        raise SourceChangedError(
            f"the next step of compaction job {ctx.job.id} no longer matches the Session's events; "
            "plan compaction again"
        )
    source = {
        "base_summary_id": summary_event_id, "count": facts.count, "digest": facts.digest,
        "first_event_id": facts.first_event_id, "last_event_id": facts.last_event_id,
        "through_seq": step.through_seq, "turns": step.turns, "preserve_turns": current["preserve_turns"],
        "source_tokens": step.source_tokens, "tail_tokens": step.tail_tokens, "context_window": step.context_window,
        "target_tokens": current["target_tokens"], "summary_budget_tokens": step.summary_budget_tokens,
        "max_source_tokens": source_token_budget(step.context_window, step.summary_budget_tokens),
        "goal_through_seq": step.goal_through_seq, **({"tokens_estimated": True} if step.tokens_estimated else {}),
    }
    check_replaceable(ctx.conn, ctx.session_rowid, ctx.job.id, source, base_through)
    return ctx.store.enqueue_job(kind, ctx.job.session_id, source).job.id
