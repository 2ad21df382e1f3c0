"""The guided rules of version 2, by mechanism rather than by wording: an answer with nothing to quote says it could
not find it (never a made-up value); a write or an edit goes to the file the request names wherever it is in the
workspace (a dotfile named without its dot too), never to a new file beside it; a command is the program the verb
is followed by ("can you run npm test" runs npm test, not `test`), and "run the tests" runs the project's own test
command found from its files. Sessions that recorded version 1 (or none) keep the rules of version 1."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.agent.policies import GuidedPolicy
from emelex_workers.agent.policies.guided import NOT_FOUND
from tests.support.agent import ScriptedBinding, answer

from .test_agent_quotes import BUILTIN, answer_form, offered, snapshot

V2 = dataclasses.replace(snapshot(), policy=GuidedPolicy().describe())


def first_round(store: MemoryStore, root: Path, request: str, policy_snapshot=V2) -> dict:
    """The schema of the first round of a turn on `request` in workspace `root` (the scripted model then answers
    with the first admissible answer, or the turn fails: only the round's schema matters here)."""
    binding = ScriptedBinding([answer(NOT_FOUND)] * 2)

    async def main():
        agent = await DurableAgentSession.create(store, root, binding, BUILTIN, policy_snapshot)
        await agent.turn(request)
        await agent.close()

    asyncio.run(main())
    return binding.rounds[0]["schema"]


def project(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_a_question_nothing_read_answers_only_that_it_could_not_find_it(store: MemoryStore, workspace: Path) -> None:
    project(workspace, {"pyproject.toml": '[project]\nversion = "0.1.0"\n'})
    schema = first_round(store, workspace, "who maintains it?")
    assert answer_form(schema) == {"type": "string", "enum": [NOT_FOUND]}
    assert "read_file" in offered(schema)  # it may read first
    found = first_round(store, workspace, "what version is it?")  # the line holding the word is read for it
    assert answer_form(found) == {"type": "string", "enum": ['pyproject.toml:2: version = "0.1.0"']}
    legacy = first_round(store, workspace, "who maintains it?", snapshot())  # version 1: a free answer
    assert answer_form(legacy) == {"type": "string", "maxLength": 500}


def test_a_change_goes_to_the_file_the_request_names_wherever_it_is(store: MemoryStore, workspace: Path) -> None:
    project(workspace, {"journal.txt": "Mon: garden\n", "src/pkg/utils.py": "MAX = 1\n", ".gitignore": "dist/\n",
                        "src/pkg/__init__.py": ""})
    for request, path in (("add a line to my journal saying shipped", "journal.txt"),
                          ("in utils.py change MAX to 2", "src/pkg/utils.py"),
                          ("add .DS_Store to the gitignore", ".gitignore")):
        tools = offered(first_round(store, workspace, request))
        assert tools["edit_file"]["properties"]["path"] == {"type": "string", "enum": [path]}, request
        assert "write_file" not in tools, request  # it would be refused without replace: the change is an edit
    legacy = offered(first_round(store, workspace, "add a line to my journal saying shipped", snapshot()))
    assert "pattern" in json.dumps(legacy["write_file"]["properties"]["path"])  # version 1: any new name


def test_a_command_is_the_program_after_the_verb_and_the_tests_are_the_projects(store: MemoryStore,
                                                                                workspace: Path) -> None:
    node = project(workspace / "node", {"package.json": json.dumps({"scripts": {"test": "node test/run.js"}}),
                                        "test/run.js": "console.log('ok')\n"})
    made = project(workspace / "py", {"Makefile": "test:\n\tpython3 -m unittest\n", "tests/test_a.py": ""})
    plain = project(workspace / "plain", {"tests/test_b.py": "", "src/b.py": ""})
    for root, request, command in ((node, "can you run npm test", "npm test"),
                                   (node, "run the tests", "npm test"),
                                   (made, "please run the tests", "make test"),
                                   (plain, "run the tests", "python3 -m unittest discover -s tests")):
        tools = offered(first_round(store, root, request))
        assert tools["run_command"]["properties"]["command"]["enum"] == [command], request


def test_where_a_name_is_defined_quotes_its_declaration_not_a_use() -> None:
    from emelex_workers.agent.policies.guided.quotes import choose, result_quotes

    request = "where is normalize_header defined"
    quotes = result_quotes("search_text normalize_header", "tests/test_a.py:19: self.assertEqual(normalize_header(' A "
                           "'), 'a')\nsrc/pkg/utils.py:4: def normalize_header(name):", request)
    assert choose(request, quotes, declarations=True) == [
        "search_text normalize_header: src/pkg/utils.py:4: def normalize_header(name):"]
    assert "tests/test_a.py:19" in choose(request, quotes)[0]  # version 1: the use too
