"""The demo's own text about what it shows: it must describe every Summary the worker can write."""

from __future__ import annotations

from emelex_workers.demo.memory import summary_heading


def test_a_summary_that_names_no_model_is_described_as_rule_based() -> None:
    payload = {"text": "assistant: x", "provenance": {"job": "j", "model": None, "source": {}}}
    assert summary_heading(payload) == "The Summary replaces turns 1-4 (rule-based: no model call):"


def test_a_summary_that_names_its_model_is_described_with_it() -> None:
    model = "smollm2-135m-instruct@sha256:" + "0" * 64
    payload = {"text": "x", "provenance": {"job": "j", "model": model, "source": {}}}
    assert summary_heading(payload) == f"The Summary replaces turns 1-4 (model {model[:40]}...):"


def _session_with(settings, workspace, *turns) -> str:
    from emelex_memory import MemoryStore, NewEvent

    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            list(lease.replay_all())
            for events in turns:
                lease.append_turn([NewEvent(kind, payload) for kind, payload in events])
            lease.release()
    return session.id


def test_the_demo_reads_how_the_last_turn_ended_from_the_transcript(settings, workspace) -> None:
    """The demo's verdict on its chat task comes from the Session's record: the last turn's answer, or why it has
    none (a failure record, or no ending at all)."""
    from emelex_workers.demo.chat import turn_ending

    asked = ("user", {"text": "What is the port in config.toml?"})
    answered = _session_with(settings, workspace, [asked, ("assistant", {"text": "The port is 8080."})])
    assert turn_ending(settings, answered) == ("The port is 8080.", "")
    failed = _session_with(settings, workspace, [("user", {"text": "before"}), ("assistant", {"text": "ok"})],
                           [asked, ("turn_failed", {"reason": "error", "diagnostic": "more than 4 tool rounds"})])
    assert turn_ending(settings, failed) == (None, "the turn ended without an answer: more than 4 tool rounds")
    assert turn_ending(settings, _session_with(settings, workspace, [asked])) == (None, "the turn never ended")
