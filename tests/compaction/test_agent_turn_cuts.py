"""Compaction cuts on agent-turn boundaries: an agent turn (its request, the tool batches it caused, its answer)
is one atomic turn, so "the newest N turns" are N agent turns and a cut never falls between a request and its
tool batch."""

from __future__ import annotations

from emelex_memory import MemoryStore
from emelex_memory.agent import journal as j
from emelex_memory.compaction.policy import CompactionPolicy
from ..support.agent_engine import leased_session

AGENT_TURNS = 8


def agent_session(store: MemoryStore, workspace) -> str:
    """A Session of `AGENT_TURNS` agent turns, each a request, one tool batch and an answer (three store turns)."""
    session, lease = leased_session(store, workspace)
    for n in range(AGENT_TURNS):
        j.open_turn(store, lease, f"request {n} " + "x" * 400)
        j.plan_batch(store, lease, 1, "{}", [(f"c{n}", "effect", {"path": f"p{n}"})])
        j.start_call(store, lease, f"c{n}")
        j.complete_call(store, lease, f"c{n}", {"call_id": f"c{n}", "tool": "effect", "outcome": "ok",
                                                "output": "y" * 400})
        j.publish_batch(store, lease)
        j.close_answer(store, lease, f"answer {n}", {"event": "answer", "rounds": 2, "calls": 1, "model": "m"})
    lease.release()
    return session.id


def test_the_newest_turns_kept_are_agent_turns_and_the_cut_ends_one(store: MemoryStore, workspace) -> None:
    session = agent_session(store, workspace)
    plan = store.plan_compaction(session, context_window=2048, policy=CompactionPolicy(preserve_turns=4),
                                 force=True)
    assert plan.turns == AGENT_TURNS and plan.compact_turns == AGENT_TURNS - 4
    events = store.replay(session).events
    through = plan.source["through_seq"]
    (last,) = [e for e in events if e.seq == through]
    (after,) = [e for e in events if e.seq == through + 1]
    assert (last.kind, after.kind) == ("audit", "user")  # the cut ends an agent turn, the next one is kept whole
    assert sum(e.kind == "user" for e in events if e.seq > through) == 4


def test_no_cut_falls_between_a_request_and_its_tool_batch(store: MemoryStore, workspace) -> None:
    session = agent_session(store, workspace)
    for preserve in range(0, AGENT_TURNS):
        plan = store.plan_compaction(session, context_window=2048,
                                     policy=CompactionPolicy(preserve_turns=preserve), force=True)
        if plan.source is None:
            continue
        following = [e.kind for e in store.replay(session).events if e.seq == plan.source["through_seq"] + 1]
        assert following in ([], ["user"]), (preserve, following)
