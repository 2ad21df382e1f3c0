"""What the extractive distiller keeps, on Sessions of a real store: superseded values replaced, fragment answers with
their question, no episodic state or content-free replies, no rejected proposal alone, no agent machinery, and a
confidence made of evidence a reader can check. The model labels nothing here (a scripted binding answers "{}"):
each rule is the plugin's, not the model's."""

from __future__ import annotations

from pathlib import Path

from emelex_llamacpp import extractive, prompts
from emelex_llamacpp.candidates import supersedes
from emelex_memory import KnowledgeCandidate, MemoryStore, NewEvent
from emelex_workers import faithfulness as fx
from emelex_workers.faithfulness.guards import guard_candidates, machinery
from emelex_workers.plugin_api import DistillRequest, event_body

from .test_llamacpp_extractive import ScriptedBinding, store_input


def _session(store: MemoryStore, workspace: Path, events: list[tuple[str, object]]):
    """A finished Session of `events` (kind, payload; a str payload is {"text": ...}) in `workspace`: its distill job
    and its replayed events."""
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        for kind, payload in events:
            lease.append_turn([NewEvent(kind, {"text": payload} if isinstance(payload, str) else payload)])
        enqueued = store.finish_session(lease)
    return enqueued.job, tuple(store.replay(session.id).events)


def _distill(store: MemoryStore, workspace: Path, events, knowledge=()) -> list[KnowledgeCandidate]:
    job, replayed = _session(store, workspace, events)
    data = store_input(store, job, replayed, knowledge=tuple(knowledge))
    return extractive.distill(DistillRequest(job, data, 128, ScriptedBinding()))


def _chat(*turns: str) -> list[tuple[str, str]]:
    return [("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(turns)]


def test_a_later_value_of_the_same_setting_replaces_the_earlier_before_anything_is_stored(
    store: MemoryStore, workspace: Path
) -> None:
    found = _distill(store, workspace, _chat(
        "The Go server sets IdleTimeout to 5 seconds.", "Envoy keeps idle connections open for 60 seconds.",
        "The base image is `python:3.11-bullseye`.", "Noted.",
        "Let's set IdleTimeout to 120 seconds in server/http.go.",
        "Then switch the base image from `python:3.11-bullseye` to `python:3.12-slim`.",
        "The deploy role is `ci-deployer`.", "We renamed `ci-deployer` to `release-bot` last week.",
    ))
    contents = [c.content for c in found]
    assert "The Go server sets IdleTimeout to 5 seconds." not in contents
    assert "The base image is `python:3.11-bullseye`." not in contents
    assert "The deploy role is `ci-deployer`." not in contents
    assert "Envoy keeps idle connections open for 60 seconds." in contents  # another subject: kept
    assert "Let's set IdleTimeout to 120 seconds in server/http.go." in contents
    assert "We renamed `ci-deployer` to `release-bot` last week." in contents


def test_a_shared_name_with_values_of_other_things_is_no_supersession(store: MemoryStore, workspace: Path) -> None:
    found = _distill(store, workspace, _chat(
        "We're moving the orders service from MySQL to PostgreSQL 16.", "Noted.",
        "The CI job runs `alembic upgrade head` against a throwaway PostgreSQL container.", "Good.",
    ))
    assert [c.content for c in found] == [
        "We're moving the orders service from MySQL to PostgreSQL 16.",
        "The CI job runs `alembic upgrade head` against a throwaway PostgreSQL container."]


def test_a_later_session_supersedes_the_key_of_the_value_it_changes_and_history_keeps_the_old(
    store: MemoryStore, workspace: Path
) -> None:
    first = _distill(store, workspace, _chat("We keep 10% head sampling in production.", "Understood.",
                                             "Spans are exported to otel-collector:4317 over gRPC.", "Noted."))
    for c in first:
        store.remember(workspace, c.key, c.content, confidence=c.confidence)
    known = store.recall(workspace).entries
    later = _distill(store, workspace, _chat("We raise production head sampling to 20%.", "Done."), knowledge=known)
    sampling = next(c for c in first if "10%" in c.content)
    assert [c.key for c in later if "20%" in c.content] == [sampling.key]  # the same key: a new version
    for c in later:
        store.remember(workspace, c.key, c.content, confidence=c.confidence)
    assert store.get_knowledge(workspace, sampling.key).content == "We raise production head sampling to 20%."
    history = store.knowledge_history(workspace, sampling.key).versions
    assert [v.content for v in history] == ["We keep 10% head sampling in production.",
                                            "We raise production head sampling to 20%."]
    exporter = next(c for c in first if "otel-collector" in c.content)
    assert store.get_knowledge(workspace, exporter.key).content == exporter.content  # another subject untouched


def test_a_fragment_answer_is_stored_with_its_question_and_content_free_or_episodic_statements_not_at_all(
    store: MemoryStore, workspace: Path
) -> None:
    found = _distill(store, workspace, _chat(
        "Where do the timeout settings live?", "In config/server.yaml.",
        "The upload pod is stuck in CrashLoopBackOff right now.", "Run `kubectl logs upload-7f9c --previous` on it.",
        "I think the old build/ directory confuses it.", "Possibly; delete build/ once and try again.",
        "Can you help?", "Sure.",
        "Anything else?", "Not yet.",
        "OK.", "OK, I'll close the ticket.",
        "Which meson-python version do we pin?", "We pin meson-python 0.15.0 in pyproject.toml.",
        "Where should the workflow file live?", "It lives in .github/workflows/ci.yml.",
        "Maybe the cache is why the build is slow?", "It was not: the cache hit rate is 90%.",
        "Images must stay small.", "I'll add a check for that to the CI job.",
        "It was an OOM kill from the old image, already fixed.", "Fixed, deploys pass again.",
        "And the printer?", "The printer has the fixed address 192.168.178.30.",
    ))
    contents = [c.content for c in found]
    assert contents == ["Q: Where do the timeout settings live? A: In config/server.yaml.",
                        "We pin meson-python 0.15.0 in pyproject.toml.",
                        "Q: Where should the workflow file live? A: It lives in .github/workflows/ci.yml.",
                        "Images must stay small.", "The printer has the fixed address 192.168.178.30."]
    assert fx.qa_parts(contents[0]) == ("Where do the timeout settings live?", "In config/server.yaml.")


def test_a_rejected_proposal_is_never_stored_and_its_rejection_is(store: MemoryStore, workspace: Path) -> None:
    found = _distill(store, workspace, _chat(
        "Should the web client retry failed uploads?", "We could add three automatic retries in the web client.",
        "No, retries would duplicate multipart uploads.", "Understood, no client retries.",
        "Someone proposed 1% trace sampling in production.", "At 1% the rare payment errors would vanish from traces.",
    ))
    contents = [c.content for c in found]
    assert not any("could add three" in c or "proposed" in c for c in contents)
    assert "No, retries would duplicate multipart uploads." in contents


AGENT_SESSION = [
    ("user", "Which Python version does the CI image use?"),
    ("tool_calls", {"round": 1, "calls": [{"call_id": "c1", "tool": "read_file",
                                           "arguments": {"path": "docker/ci.Dockerfile"}}]}),
    ("tool_result", {"call_id": "c1", "state": "completed", "output": "FROM python:3.12.4-slim AS base\nRUN make"}),
    ("assistant", "The CI image uses Python 3.12.4, from `python:3.12.4-slim` in docker/ci.Dockerfile. "
                  "It must match the Python 3.12.4 that production runs."),
    ("audit", {"tool_calls": 1, "model": "smollm2", "tokens": 812}),
    ("user", "And the lint job runs ruff 0.6.9 on every push."),
    ("turn_failed", {"reason": "model_error", "diagnostic": "the model returned no answer for this turn"}),
]


def test_agent_sessions_distil_what_was_said_never_tool_calls_results_failures_or_audit_events(
    store: MemoryStore, workspace: Path
) -> None:
    found = _distill(store, workspace, AGENT_SESSION)
    # What the assistant relayed from the tool result and the question is the tool's (its first sentence); what
    # adds to it is said (its second, which leans on "It": kept only as a question's answer, so not alone here).
    assert [c.content for c in found] == ["And the lint job runs ruff 0.6.9 on every push."]


def test_the_abstractive_distiller_is_shown_what_was_said_not_the_machinery(
    store: MemoryStore, workspace: Path
) -> None:
    job, replayed = _session(store, workspace, AGENT_SESSION)
    binding = ScriptedBinding(['{"facts": []}'])
    prompts.distill(DistillRequest(job, store_input(store, job, replayed), 128, binding))
    shown = binding.calls[0][0][-1]["content"]
    assert "The CI image uses Python 3.12.4" in shown and "ruff 0.6.9" in shown
    assert not any(word in shown for word in ("call_id", "read_file", "FROM python", "model_error", "tokens"))


def test_the_guard_rejects_machinery_from_any_distiller_and_keeps_facts_said_in_words(
    store: MemoryStore, workspace: Path
) -> None:
    _, events = _session(store, workspace, AGENT_SESSION)
    proposals = [
        KnowledgeCandidate("tool-output", event_body(events[2])),  # a tool result, verbatim
        KnowledgeCandidate("call", '{"call_id": "c1", "tool": "read_file"}'),  # JSON
        KnowledgeCandidate("failure", "the model returned no answer for this turn"),  # a failure record
        KnowledgeCandidate("ci-image", "The CI image uses Python 3.12.4."),  # relayed: the tool's and the question's
        KnowledgeCandidate("production-python", "Production runs Python 3.12.4."),  # said, in words that add to it
    ]
    result = guard_candidates(proposals, events=events)
    assert [c.key for c in result.candidates] == ["production-python"]
    assert result.rejected["rejected_machinery"] == 4


def test_a_qa_entry_is_supported_only_when_both_its_question_and_answer_are_quoted(
    store: MemoryStore, workspace: Path
) -> None:
    _, events = _session(store, workspace, _chat("Where do the timeout settings live?", "In config/server.yaml."))
    good = KnowledgeCandidate("timeout-settings", "Q: Where do the timeout settings live? A: In config/server.yaml.")
    bad = KnowledgeCandidate("timeout-settings-2", "Q: Where do the timeout settings live? A: In config/app.yaml.")
    result = guard_candidates([good, bad], events=events)
    assert [c.key for c in result.candidates] == ["timeout-settings"]
    assert result.rejected["rejected_unsupported"] == 1


def test_confidence_counts_checkable_evidence_stated_confirmed_repeated_and_uncontested(
    store: MemoryStore, workspace: Path
) -> None:
    found = _distill(store, workspace, _chat(
        "Production runs six gunicorn workers behind nginx.", "Interesting, the load is low then.",
        "The orders table holds about two million rows.", "Later the orders table will get a partition.",
        "We pin numpy 1.26.4 in requirements.txt.", "Agreed, numpy 1.26.4 stays pinned in requirements.txt.",
    ))
    conf = {c.content: c.confidence for c in found}
    said_once = conf["Production runs six gunicorn workers behind nginx."]
    confirmed = conf["We pin numpy 1.26.4 in requirements.txt."]
    assert confirmed > said_once
    assert confirmed == 0.95  # stated with a value, confirmed by the other side, repeated, uncontested
    assert said_once == 0.55  # only uncontested


JSON_ANSWERS = [
    ("user", "What does notes.md say?"),
    ("tool_calls", {"round": 1, "calls": [{"call_id": "c1", "tool": "read_file", "arguments": {"path": "notes.md"}}]}),
    ("tool_result", {"call_id": "c1", "tool": "read_file", "outcome": "ok", "output": "The release is on Friday."}),
    ("assistant", '{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}'),
    ("user", "Read notes.md again."),
    ("assistant", '{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes'),  # cut off by the limit
    ("user", "Which section of config.toml holds the port?"),
    ("assistant", "[server] holds port = 8080 in config.toml."),
]


def test_an_answer_that_is_tool_call_json_is_never_a_candidate(store: MemoryStore, workspace: Path) -> None:
    found = _distill(store, workspace, JSON_ANSWERS)
    assert [c.content for c in found] == [
        "Read notes.md again.",
        "Q: Which section of config.toml holds the port? A: [server] holds port = 8080 in config.toml.",
    ]


def test_the_guard_rejects_tool_call_json_whole_cut_off_or_as_an_answer(store: MemoryStore, workspace: Path) -> None:
    _, events = _session(store, workspace, JSON_ANSWERS)
    proposals = [
        KnowledgeCandidate("cut", '{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes'),
        KnowledgeCandidate("qa", 'Q: What does notes.md say? A: {"tool_calls": [{"name": "read_file", '
                                 '"arguments": {"path": "notes.md"}}]}'),
        KnowledgeCandidate("port", "[server] holds port = 8080 in config.toml."),  # prose opening with brackets
    ]
    result = guard_candidates(proposals, events=events)
    assert [c.key for c in result.candidates] == ["port"]
    assert result.rejected["rejected_machinery"] == 2
    # The JSON answer alone marks it, whoever said it: even where nothing was left out as relayed or unanswering.
    said = [event_body(e) for e in events]
    assert machinery(proposals[1].content, said, [], kept=None)


CASUAL = _chat(
    "Hey Gina!", "Hi Maya! Did you find the right spot?",
    "Yes! The climbing gym on Elm Road opens at seven.", "Cool, Maya!",
    "Did you find the right spot?", "Hey Gina!",
    "I'm moving to Porto in June.", "No way!",
    "She starts school there in September.", "Makes sense.",
    "Whoa, congrats Maya!", "Ha, I know.",
)


def test_a_casual_conversation_keeps_what_was_told_not_greetings_vocatives_remarks_or_reactions(
    store: MemoryStore, workspace: Path
) -> None:
    found = _distill(store, workspace, CASUAL)
    contents = [c.content for c in found]
    # "No way!" is surprise, not a rejection of the move; "She ..." leans on who she is; a greeting answers nothing.
    assert contents == ["The climbing gym on Elm Road opens at seven.", "I'm moving to Porto in June."]
    assert [c.key for c in found] == ["climbing-gym-elm", "porto"]


def test_a_change_of_a_named_place_in_other_words_supersedes_the_earlier_statement(
    store: MemoryStore, workspace: Path
) -> None:
    """A later statement that says it changes something ("now", "moved", "switched", ...) about the same subject as
    an earlier one (a word of what it is about in common) and names a place or thing the earlier did not replaces
    it: in the same Session before anything is stored, and in a later Session as a new version of its key. A
    statement that merely names the same place again, changing nothing, replaces nothing."""
    found = _distill(store, workspace, _chat(
        "Our book club meets at the Elm Street library on Mondays.", "Nice.",
        "We left the library and now meet at Kettle Cafe on Wednesdays.", "Good to know.",
    ))
    assert [c.content for c in found] == ["We left the library and now meet at Kettle Cafe on Wednesdays."]
    first = _distill(store, workspace, _chat("I booked the cabin at Birch Lake for the second week of August.",
                                             "Great.", "We buy our bread at the Harbor Market.", "Yum."))
    for c in first:
        store.remember(workspace, c.key, c.content, confidence=c.confidence)
    known = store.recall(workspace).entries
    later = _distill(store, workspace, _chat(
        "They double-booked it, so I moved our booking to Cedar Ridge, same week.", "Fine by me.",
        "We met Ines at the Harbor Market on Sunday.", "Fun.",
    ), knowledge=known)
    cabin = next(c for c in first if "Birch Lake" in c.content)
    assert [(c.key, c.content) for c in later] == [
        (cabin.key, "They double-booked it, so I moved our booking to Cedar Ridge, same week."),  # a new version
        (later[1].key, "We met Ines at the Harbor Market on Sunday.")]
    assert later[1].key != next(c.key for c in first if "bread" in c.content)  # names the market, changes nothing


def test_what_leans_on_the_context_behind_a_greeting_or_a_first_clause_is_judged_by_what_stands_alone(
    store: MemoryStore, workspace: Path
) -> None:
    """A greeting or an interjection before a comma is set aside before asking whether a sentence leans on its
    context ("Hey Sam, that dinner was the best!" leans on "that"); a sentence that opens leaning but ends in a
    clause of its own ("..., so we swim at the Northside Centre now.") says something on its own."""
    found = _distill(store, workspace, _chat(
        "Hey Sam, that dinner was the best!", "It really was.",
        "They closed the pool for repairs, so we swim at the Northside Centre now.", "Good call.",
        "Wow, the Northside Centre has a sauna too.", "Nice.",
        "It rained all day, and it was cold.", "Brr.",
    ))
    assert [c.content for c in found] == ["They closed the pool for repairs, so we swim at the Northside Centre now.",
                                          "Wow, the Northside Centre has a sauna too."]


def test_a_sentence_addressed_to_the_other_speaker_that_names_nothing_is_about_the_exchange_not_knowledge(
    store: MemoryStore, workspace: Path
) -> None:
    """A statement in the second person ("you", "your") is read by whoever it was said to; when it names nothing (no
    identifier, value or proper name) it is about the exchange ("I can walk you through your options."), which a
    later reader cannot place. One that names something says it about that, and stays."""
    found = _distill(store, workspace, _chat(
        "The greenhouse heater runs on propane.", "I can walk you through your heating options.",
        "Your greenhouse sounds like a lovely project.", "Happy to help you plan your planting calendar.",
        "You need Python 3.11 to run the sensor script.", "Noted.",
        "Your seedlings go to the Maple Street allotment in April.", "Lovely.",
    ))
    assert [c.content for c in found] == ["The greenhouse heater runs on propane.",
                                          "You need Python 3.11 to run the sensor script.",
                                          "Your seedlings go to the Maple Street allotment in April."]


def test_a_new_day_month_or_name_for_the_same_subject_supersedes_whatever_verb_says_so(
    store: MemoryStore, workspace: Path
) -> None:
    """A later statement about the same subject (a word of what it is about in common) that gives a new value of a
    kind the earlier gave (a weekday, a month, a proper name), and says all the earlier said (a value of each of its
    kinds), replaces it, with no word saying it changed. One that changes part of it (a new month, but no place where
    the earlier named one) leaves the earlier standing; one about another subject replaces nothing."""
    found = _distill(store, workspace, _chat(
        "Our choir practice is on Wednesdays at the Elm Hall.", "Lovely.",
        "I'm opening a bakery on Harbor Road in March.", "Exciting.",
        "We swim at the Northside Centre on Mondays.", "Nice.",
        "Choir practice happens on Fridays at the Elm Hall from next week.", "Noted.",
        "We pushed the bakery opening to April.", "Oh well.",
        "We play chess at the Riverside Club on Tuesdays.", "Fun.",
    ))
    assert [c.content for c in found] == [
        "I'm opening a bakery on Harbor Road in March.",
        "We swim at the Northside Centre on Mondays.",
        "Choir practice happens on Fridays at the Elm Hall from next week.",
        "We pushed the bakery opening to April.",
        "We play chess at the Riverside Club on Tuesdays."]
    for c in found:
        store.remember(workspace, c.key, c.content, confidence=c.confidence)
    later = _distill(store, workspace, _chat("We swim at the Northside Centre on Thursdays now.", "OK."),
                     knowledge=store.recall(workspace).entries)
    swim = next(c for c in found if "swim" in c.content)
    assert [(c.key, c.content) for c in later] == [(swim.key, "We swim at the Northside Centre on Thursdays now.")]
    # One word in common is not one subject: "deploy" of two different things, each named anew, replaces nothing.
    assert not supersedes("We deploy the docs with Netlify on Fridays.", "We deploy the shop with Ansible on Mondays.")
    # The capital opening a sentence names nothing, and the "Q:" and "A:" labels are no word two entries share.
    assert not supersedes("Q: How old is she? A: Four.", "Q: How's the garden going? A: Really well.")
    assert not supersedes("Q: What's the cafe called? A: It is Bean & Co.",
                          "Q: Which boots do you hike in? A: The Salomon Quest boots.")
