"""Property-based tests of `CompactionPolicy` (hypothesis): pure selection, and planning over real Sessions (whose
sources always fit the summarizer: the whole prefix due, or a first step of it)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emelex_memory import CompactionPolicy, Event, InvalidInputError, MemoryStore, NewEvent, Settings, TurnTooLargeError
from emelex_memory.compaction.policy import source_token_budget


@st.composite
def policies(draw) -> CompactionPolicy:
    trigger = draw(st.floats(min_value=0.05, max_value=1.0))
    target = trigger * draw(st.floats(min_value=0.01, max_value=1.0))
    return CompactionPolicy(trigger_ratio=trigger, target_ratio=target, preserve_turns=draw(st.integers(0, 6)))


def _tail(tokens: list[int], k: int) -> int:
    return sum(tokens[k:])


@settings(max_examples=400, deadline=None)
@given(
    policy=policies(),
    tokens=st.lists(st.integers(0, 500), max_size=30),
    window=st.integers(1, 8000),
    min_turns=st.integers(1, 2),
    force=st.booleans(),
)
def test_selection_keeps_the_newest_turns_and_reaches_the_target_whenever_possible(
    policy: CompactionPolicy, tokens: list[int], window: int, min_turns: int, force: bool
) -> None:
    k = policy.select(tokens, window, min_turns=min_turns, force=force)
    most = len(tokens) - policy.preserve_turns
    assert isinstance(k, int)
    assert k == 0 or min_turns <= k <= most  # whole turns only, and the newest preserve_turns are always kept
    triggered = sum(tokens) >= policy.trigger_ratio * window
    if most < min_turns or not (force or triggered):
        assert k == 0
        return
    if force:
        assert k == most
        return
    target = policy.target_tokens(window)
    assert target <= policy.target_ratio * window < target + 1
    reserve = policy.summary_reserve(window)
    assert reserve >= 1
    # possible: some allowed choice leaves a tail that, with the Summary's reserve, fits the target
    reachable = [j for j in range(min_turns, most + 1) if _tail(tokens, j) + reserve <= target]
    budget = policy.summary_budget(_tail(tokens, k), window)
    assert budget >= reserve
    if reachable:
        assert k == reachable[0]  # compacting no more than needed
        assert _tail(tokens, k) + budget <= target  # the view after compaction, Summary included, fits the target
    else:
        assert k == most  # the best it can do


def test_policy_defaults_and_validation() -> None:
    p = CompactionPolicy()
    assert (p.trigger_ratio, p.target_ratio, p.preserve_turns) == (0.8, 0.5, 4)
    for bad in ({"trigger_ratio": 0}, {"trigger_ratio": 1.5}, {"target_ratio": 0.9}, {"preserve_turns": -1},
                {"preserve_turns": 1.5}, {"target_ratio": True}):
        with pytest.raises(InvalidInputError):
            CompactionPolicy(**bad)
    with pytest.raises(InvalidInputError):
        p.select([1, 2, 3], 0)
    # the Summary budget counts against the target: window 1000, ten 100-token turns compact 6, not 5
    assert p.select([100] * 10, 1000) == 6
    assert (p.target_tokens(1000), p.summary_reserve(1000), p.summary_budget(400, 1000)) == (500, 100, 100)
    assert p.summary_reserve(100) == 10 and CompactionPolicy(0.1, 0.1).summary_reserve(100) == 5


def _event_tokens(event: Event) -> int:
    return event.payload["t"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=4), min_size=1, max_size=10),
    window=st.integers(300, 4000),
    preserve=st.integers(0, 4),
)
def test_planning_a_real_session_never_splits_a_turn_and_keeps_the_newest_turns(
    turns: list[list[int]], window: int, preserve: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "db").mkdir(mode=0o700)
        (root / "ws").mkdir()
        with MemoryStore.open_path(root / "db" / "p.sqlite3", Settings(home=root / "home")) as store:
            session = store.create_session(root / "ws")
            with store.acquire_lease(session.id, root / "ws") as lease:
                lease.replay()
                for turn in turns:
                    lease.append_turn([NewEvent("user", {"t": t}) for t in turn])
                lease.release()
            policy = CompactionPolicy(preserve_turns=preserve)
            reserve = policy.summary_reserve(window)
            try:
                plan = store.plan_compaction(session.id, context_window=window, count_tokens=_event_tokens,
                                             policy=policy)
            except TurnTooLargeError:  # the oldest turn alone does not fit beside the smallest Summary
                assert sum(turns[0]) > source_token_budget(window, reserve)
                return
            events = store.replay(session.id).events
    if plan.source is None:
        assert plan.compact_turns == 0
        return
    boundary = plan.source["through_seq"]
    inside = [e for e in events if e.seq <= boundary]
    outside = [e for e in events if e.seq > boundary]
    assert inside and inside[-1].turn != (outside[0].turn if outside else None)  # never splits a turn
    assert len({e.turn for e in outside}) >= preserve  # the newest turns stay
    compacted = plan.source["turns"]
    assert plan.source["count"] == len(inside) == sum(len(t) for t in turns[:compacted])
    tail = plan.source["tail_tokens"]
    assert tail == sum(e.payload["t"] for e in outside)
    source, budget = plan.source["source_tokens"], plan.source["summary_budget_tokens"]
    assert source == sum(e.payload["t"] for e in inside)
    assert source <= plan.source["max_source_tokens"] == source_token_budget(window, budget)  # fits the summarizer
    assert plan.source["preserve_turns"] == preserve
    target = policy.target_tokens(window)
    assert plan.source["target_tokens"] == target
    if compacted < plan.compact_turns:  # a first step: the longest leading run that fits beside the reserve
        assert plan.source["goal_through_seq"] > boundary and budget == reserve
        assert sum(map(sum, turns[: compacted + 1])) > source_token_budget(window, reserve)
        return
    assert plan.source["goal_through_seq"] == boundary
    possible = any(sum(sum(t) for t in turns[j:]) + reserve <= target for j in range(1, len(turns) - preserve + 1))
    if possible:  # the view after compaction, Summary budget included, fits the target
        assert tail + plan.source["summary_budget_tokens"] <= target
