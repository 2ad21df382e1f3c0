"""`CompactionPolicy`: when to compact a Session's replay view, and how many leading turns to replace.

The view is a run of atomic turns, oldest first, each with a token count. With
T = floor(target_ratio * window) the target and R the Summary reserve,
max(1, min(floor(0.1 * window), T // 2)), compaction replaces the fewest
leading turns (at least `min_turns`, never one of the newest `preserve_turns`)
whose uncompacted tail is at most T - R tokens, and gives the Summary a budget
of T - tail tokens (at least R). So whenever some choice allows it, the view
after compaction, Summary budget included, is at most the target. When none
does, it replaces everything but the preserved turns and the Summary budget is
max(T - tail, R).

What one summarizer call can read is bounded too: with a Summary budget of B
tokens, a model's W-token window leaves `source_token_budget(W, B)` =
W - B - `PROMPT_RESERVE_TOKENS` tokens for the source. Planning and the worker
both use that one function, so a planned source always fits the model it was
planned for; a source over it is compacted in steps (see `compaction/steps.py`).

`TurnSelection` applies that rule while streaming over the turns, keeping only
the newest turns that may stay uncompacted: at most `preserve_turns` plus
`MAX_TAIL_TURNS` of them, never the whole history. (A tail of more than
`MAX_TAIL_TURNS` turns that fits the target anyway, e.g. of zero-token turns,
is compacted down to that many.)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError

MIN_SUMMARY_SHARE = 0.1  # a Summary's reserve: this share of the window, unless that is over half the target
MAX_TAIL_TURNS = 100_000  # turns a selection keeps in memory besides the preserved ones
PROMPT_RESERVE_TOKENS = 256  # of a model's window: a summarizer's instructions and chat template around the source


def source_token_budget(context_window: int, summary_budget_tokens: int) -> int:
    """The most source tokens a summarizer can read in a `context_window`-token model while writing a Summary of
    `summary_budget_tokens`: the window less that budget and `PROMPT_RESERVE_TOKENS` (0 or less: nothing fits).

    The one definition planning (`plan_compaction`) and the worker's size check (`compaction_handler`) share.
    """
    return context_window - summary_budget_tokens - PROMPT_RESERVE_TOKENS


def reserve_tokens(target_tokens: int, context_window: int) -> int:
    """The fewest tokens a Summary is budgeted for a target of `target_tokens`: 10% of the window, at most half the
    target, at least 1."""
    return max(1, min(math.floor(MIN_SUMMARY_SHARE * context_window), target_tokens // 2))


@dataclass(frozen=True)
class CompactionPolicy:
    """When and how much to compact, in shares of the model's context window.

    Compaction triggers once the replay view uses `trigger_ratio` of the
    window and replaces the fewest leading turns that bring the uncompacted
    tail plus the Summary's reserve to at most `target_ratio` of it, always
    keeping the newest `preserve_turns` atomic turns. When the target cannot
    be reached it replaces everything but those turns. See the module
    docstring for the exact rule.
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

    def target_tokens(self, context_window: int) -> int:
        """The target size of the view after compaction, Summary included: floor(target_ratio * window)."""
        return math.floor(self.target_ratio * context_window)

    def summary_reserve(self, context_window: int) -> int:
        """The fewest tokens a Summary is budgeted: 10% of the window, at most half the target, at least 1."""
        return reserve_tokens(self.target_tokens(context_window), context_window)

    def summary_budget(self, tail_tokens: int, context_window: int) -> int:
        """The Summary's token budget when `tail_tokens` stay uncompacted: what the target leaves, at least the
        reserve."""
        return max(self.target_tokens(context_window) - tail_tokens, self.summary_reserve(context_window))

    def select(
        self, turn_tokens: Sequence[int], context_window: int, *, min_turns: int = 1, force: bool = False
    ) -> int:
        """How many leading turns to compact (0: none), given each turn's tokens oldest first.

        Never more than all but the newest `preserve_turns`; never fewer than
        `min_turns` unless 0. Without `force`, 0 below the trigger. With
        `force`, everything but the preserved turns.
        """
        selection = TurnSelection(self, context_window, force=force)
        for tokens in turn_tokens:
            selection.add(tokens)
        return selection.finish(min_turns)


class TurnSelection:
    """`CompactionPolicy`'s selection over a stream of turns, oldest first, in bounded memory.

    Feed every turn with `add`, then call `finish`. Afterwards `turns` and
    `total_tokens` describe the whole view, `first` is the oldest turn's
    item, and for a non-zero result `boundary` is the newest compacted turn's
    item, `compacted_events` the events of the compacted turns and
    `tail_tokens` the tokens left uncompacted.
    """

    def __init__(self, policy: CompactionPolicy, context_window: int, *, force: bool = False) -> None:
        """Start an empty selection for `policy` and `context_window` (tokens, at least 1)."""
        if isinstance(context_window, bool) or not isinstance(context_window, int) or context_window < 1:
            raise InvalidInputError(f"context_window must be a positive number of tokens, got {context_window!r}")
        self.policy, self.context_window, self.force = policy, context_window, force
        self._limit = -1 if force else policy.target_tokens(context_window) - policy.summary_reserve(context_window)
        self._tail: deque[tuple[int, int, Any]] = deque()
        self.turns = self.total_tokens = self.tail_tokens = self.compacted = self.compacted_events = 0
        self.first: Any = None
        self.boundary: Any = None

    def add(self, tokens: int, item: Any = None, events: int = 0) -> None:
        """Append the next turn: its tokens, an item to report it by, and its number of events."""
        if self.turns == 0:
            self.first = item
        self.turns += 1
        self.total_tokens += tokens
        self.tail_tokens += tokens
        self._tail.append((tokens, events, item))
        keep = self.policy.preserve_turns
        while len(self._tail) > keep and (self.tail_tokens > self._limit or len(self._tail) > keep + MAX_TAIL_TURNS):
            self._compact_oldest()

    def _compact_oldest(self) -> None:
        tokens, events, self.boundary = self._tail.popleft()
        self.tail_tokens -= tokens
        self.compacted += 1
        self.compacted_events += events

    def finish(self, min_turns: int = 1) -> int:
        """How many leading turns to compact (0: none); see `CompactionPolicy.select`."""
        most = self.turns - self.policy.preserve_turns
        due = self.force or self.policy.triggered(self.total_tokens, self.context_window)
        if most < max(min_turns, 1) or not due:
            return 0
        while self.compacted < min_turns:
            self._compact_oldest()
        return self.compacted
