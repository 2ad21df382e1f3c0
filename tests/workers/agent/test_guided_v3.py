"""The guided rules of version 3, by mechanism rather than by wording: the text a change replaces is one the
Session read of the file it changes (a value of the shape the request writes, a line the request names, or nothing:
an append), and a request that names no file changes the file the previous answer quoted ("make it 3000").
A question about the previous answer that names nothing of its own ("which file is it in?") is answered with that
quote. Sessions that recorded version 2 keep its rules."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.agent.policies import GuidedPolicy
from emelex_workers.agent.session import AgentSession
from tests.support.agent import ScriptedBinding, answer

from .test_agent_quotes import BUILTIN, answer_form, offered, ok, snapshot
from .test_guided_v2 import first_round, project

V3 = dataclasses.replace(snapshot(), policy=GuidedPolicy().describe())
V2 = dataclasses.replace(snapshot(), policy={"name": "guided", "version": 2})
SERVER = "const http = require('http');\nconst PORT = process.env.PORT || 5174;\nhttp.createServer().listen(PORT);\n"
TODO = "# Todo\n- [ ] passport\n- [ ] plumber\n"


def test_a_change_replaces_only_a_text_the_file_read_holds(store: MemoryStore, workspace: Path) -> None:
    project(workspace, {"src/server.js": SERVER, "todo.md": TODO})
    for request, old, new in (("in server.js change the default port to 8080", ["5174"], ["8080"]),
                              ("add buy stamps to todo.md", [""], ["buy stamps"]),
                              ("in todo.md mark the plumber as done", ["", "- [ ] plumber"], None)):
        edit = offered(first_round(store, workspace, request, V3))["edit_file"]["properties"]
        assert edit["old"]["enum"] == old, request
        assert edit["new"].get("enum") == new, request
    # named by no word: the file whose line holds the most of the request's rare words ("port")
    (workspace / "src/slug.js").write_text("function slugify(text) {}\n")
    edit = offered(first_round(store, workspace, "change the default port to 8080", V3))["edit_file"]["properties"]
    assert (edit["path"]["enum"], edit["old"]["enum"], edit["new"]["enum"]) == (["src/server.js"], ["5174"], ["8080"])
    legacy = offered(first_round(store, workspace, "in server.js change the default port to 8080", V2))
    assert "enum" not in legacy["edit_file"]["properties"]["old"]  # version 2: the model's own text


def test_a_follow_up_naming_no_file_changes_the_file_the_previous_answer_quoted(workspace: Path) -> None:
    project(workspace, {"src/server.js": SERVER, "src/slug.js": "function slugify(text) {}\n"})
    for policy_snapshot, followed in ((V3, True), (V2, False)):
        agent = AgentSession(None, policy_snapshot, BUILTIN)
        agent.add_user("where is the port set?")
        agent.add_answer("src/server.js:2: const PORT = process.env.PORT || 5174;")
        agent.add_user("make it 3000")
        tools = offered(agent.round_schema(workspace))
        if followed:
            assert tools["edit_file"]["properties"]["path"] == {"type": "string", "enum": ["src/server.js"]}
            assert tools["edit_file"]["properties"]["old"]["enum"] == ["5174"]
            assert tools["edit_file"]["properties"]["new"]["enum"] == ["3000"]
            assert "write_file" not in tools  # the file exists: the change is an edit, never a write to "src"
        else:
            assert set(tools["edit_file"]["properties"]["path"]["enum"]) == {"src/server.js", "src/slug.js"}
            assert "enum" not in tools["edit_file"]["properties"]["old"]


def test_the_answer_after_a_change_says_its_file_once(workspace: Path) -> None:
    project(workspace, {"notes.txt": "Mon: garden\n"})
    for policy_snapshot, said in ((V3, "notes.txt: appended (1 -> 2 lines)"),
                                  (V2, "notes.txt: notes.txt: appended (1 -> 2 lines)")):
        agent = AgentSession(None, policy_snapshot, BUILTIN)
        agent.add_user("add shipped to notes.txt")
        ok(agent, "edit_file", {"path": "notes.txt", "new": "shipped"}, "notes.txt: appended (1 -> 2 lines)")
        assert answer_form(agent.round_schema(workspace))["enum"] == [said]


def test_a_resumed_follow_up_asks_about_and_changes_what_the_previous_answer_quoted(store: MemoryStore,
                                                                                    workspace: Path) -> None:
    """The previous answer is read from the recorded history, so a resumed Session follows up as the live one:
    "which file is it in?" is answered with that quote again (no tool offered), "make it 3000" edits its file."""
    project(workspace, {"src/server.js": SERVER, "src/slug.js": "function slugify(text) {}\n"})
    quoted = "src/server.js:2: const PORT = process.env.PORT || 5174;"

    async def first():
        agent = await DurableAgentSession.create(store, workspace, ScriptedBinding([answer(quoted)]), BUILTIN, V3)
        result = await agent.turn("where is the port set?")
        await agent.close()
        return agent.session_id, result

    session_id, result = asyncio.run(first())
    assert result.answer == quoted
    for request in ("which file is it in?", "make it 3000"):
        binding = ScriptedBinding([answer(quoted)])

        async def again():
            agent = await DurableAgentSession.resume(store, session_id, workspace, binding, BUILTIN, V3)
            await agent.turn(request)
            await agent.close()

        asyncio.run(again())
        schema = binding.rounds[0]["schema"]
        if request.startswith("which"):
            assert answer_form(schema)["enum"] == [quoted] and offered(schema) == {}
        else:
            assert offered(schema)["edit_file"]["properties"]["old"]["enum"] == ["5174"]
