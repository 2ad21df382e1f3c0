"""What was said, told apart from what was relayed from a tool, asked of the agent or only addressed to someone:
`faithfulness.said.excluded`, `checks.vocatives` and `checks.interjection`, on events built as replay returns them."""

from __future__ import annotations

import json

from emelex_memory import Event
from emelex_workers import faithfulness as fx


def _events(*items: tuple[str, object]) -> tuple[Event, ...]:
    out = []
    for seq, (kind, payload) in enumerate(items, 1):
        body = json.dumps({"text": payload} if isinstance(payload, str) else payload, sort_keys=True)
        out.append(Event((seq, seq, seq, 0, kind, body, len(body), 0, 0.0, None)))
    return tuple(out)


def _call(tool: str, **arguments) -> tuple[str, dict]:
    return "tool_calls", {"round": 1, "calls": [{"call_id": "c", "tool": tool, "arguments": arguments}]}


def _result(output: str) -> tuple[str, dict]:
    return "tool_result", {"call_id": "c", "outcome": "ok", "output": output, "tool": "t"}


def test_names_are_vocatives_where_they_are_addressed_not_where_they_are_talked_about() -> None:
    assert fx.vocatives("Hey Gina!") == {"gina"} and fx.vocatives("Wow, Caroline!") == {"caroline"}
    assert fx.vocatives("See you then, Nora!") == {"nora"} and fx.vocatives("Theo!") == {"theo"}
    assert fx.vocatives("We moved to Berlin.") == set() and fx.vocatives("Four.") == set()
    assert fx.vocatives("Whoa, congrats Priya!") == set()
    assert fx.vocatives("Whoa, congrats Priya!", names={"priya"}) == {"priya"}  # a speaker's name, known
    assert fx.vacuous("Wow, Caroline!") and not fx.vacuous("Caroline moved to Berlin.")


def test_a_greeting_thanks_or_exclamation_is_an_interjection_and_an_answer_is_not() -> None:
    for said in ("Hey Gina!", "Cool, Gina!", "Ha!", "Thanks, Sam!", "Me.", "Lena! Hey!"):
        assert fx.interjection(said), said
    for said in ("Four.", "The cello.", "Yes, on a leash.", "Crumb & Co.", "Friday at 6 pm from my place.",
                 "Port 8080!"):
        assert not fx.interjection(said), said


def test_what_the_assistant_relays_from_a_tool_or_the_user_is_not_said() -> None:
    events = _events(
        ("user", "What line length does pyproject.toml set?"),
        _call("read_file", path="pyproject.toml"),
        _result("[tool.ruff]\nline-length = 100\n"),
        ("assistant", "pyproject.toml: line-length = 100"),  # a quoted tool output
        ("user", "Run `echo hello from the tool`"),
        _call("run_command", command="echo hello from the tool"),
        _result("exit code 0\nhello from the tool\n"),
        ("assistant", "run_command echo hello from the tool: hello from the tool"),  # a command's echo
        ("user", "The default branch is main."),
        ("assistant", "run_command echo hello from the main branch"),  # the tool's words and the user's
        ("user", "We format the code with ruff, not black."),
        ("assistant", "I can read, list and search the files in this workspace."),  # answers something else
        ("user", "Which Python does production run?"),
        ("assistant", "Production pins Python 3.12 so the wheels match the servers."),  # adds to it: said
    )
    gone = fx.excluded(events)
    assert gone == {3: {"pyproject.toml: line-length = 100"}, 4: {"Run `echo hello from the tool`"},
                    7: {"run_command echo hello from the tool: hello from the tool"},
                    9: {"run_command echo hello from the main branch"},
                    11: {"I can read, list and search the files in this workspace."}}


def test_a_request_is_a_sentence_its_own_turn_acted_on_and_a_statement_is_not() -> None:
    events = _events(
        ("context", {"source": "mentions", "files": [{"path": "app.py", "bytes": 9, "content": "x"}], "text": "x"}),
        ("user", "Explain in detail what app.py does."),  # the file read for it
        ("assistant", "app.py prints a greeting for the user at start-up."),
        ("user", "We keep the settings in config.toml. Create notes.txt with the text: hi"),
        _call("write_file", path="notes.txt", content="hi"),
        _result("wrote 2 bytes to notes.txt"),
        ("assistant", "notes.txt: wrote 2 bytes to notes.txt"),
    )
    gone = fx.excluded(events)
    assert gone[1] == {"Explain in detail what app.py does."}
    assert gone[3] == {"Create notes.txt with the text: hi"}  # "We keep ..." opens with a subject: said
    assert 2 not in gone  # it adds to what was read


def test_without_agent_machinery_only_an_echo_of_the_user_is_left_out() -> None:
    events = _events(("user", "The cutover window is Saturday 02:00 UTC."),
                     ("assistant", "Noted: the cutover window is Saturday 02:00 UTC."),
                     ("user", "Where is the runbook?"), ("assistant", "In docs/cutover.md, for the Saturday window."))
    assert fx.excluded(events) == {1: {"Noted: the cutover window is Saturday 02:00 UTC."}}


def test_the_guard_rejects_greeting_answers_relayed_output_and_requests_from_any_distiller() -> None:
    from emelex_memory import KnowledgeCandidate
    from emelex_workers.faithfulness.guards import guard_candidates

    events = _events(
        ("user", "Did you find the right spot?"), ("assistant", "Hey Gina! The spot is behind the old mill."),
        ("user", "Run `cat backup.conf`"), _call("run_command", command="cat backup.conf"),
        _result("target=/mnt/nas/photos\nkeep_days=90"), ("assistant", "run_command cat backup.conf: keep_days=90"),
        ("user", "We keep daily snapshots for 90 days on the NAS."),
    )
    proposals = [
        KnowledgeCandidate("spot", "Q: Did you find the right spot? A: Hey Gina!"),  # a greeting as the answer
        KnowledgeCandidate("wow", "Wow, Gina!"),  # one content word once the name is set aside
        KnowledgeCandidate("backup", "run_command cat backup.conf: keep_days=90"),  # quoted tool output
        KnowledgeCandidate("keep-days", "keep_days=90 in backup.conf."),  # the tool's words, in none said
        KnowledgeCandidate("cat", "Run `cat backup.conf`"),  # a request
        KnowledgeCandidate("spot-mill", "The spot is behind the old mill."),
        KnowledgeCandidate("snapshots", "We keep daily snapshots for 90 days on the NAS."),
    ]
    result = guard_candidates(proposals, events=events)
    assert [c.key for c in result.candidates] == ["spot-mill", "snapshots"]
    # (the greeting is also an assistant sentence of an agent Session answering nothing asked: machinery first)
    assert (result.rejected["rejected_vacuous"], result.rejected["rejected_machinery"]) == (1, 4)
    alone = guard_candidates(proposals[:1], events=_events(*[(k, p) for k, p in ((e.kind, json.loads(e.payload_json))
                                                                                 for e in events[:2])]))
    assert alone.candidates == () and alone.rejected["rejected_vacuous"] == 1  # without tools: a greeting answer
