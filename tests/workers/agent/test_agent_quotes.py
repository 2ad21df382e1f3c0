"""Protocol "emelex-tools/3": answers quoted from what was read, tools and arguments narrowed by what the request
asks for, and the files a request names read for the model and recorded; over the scripted binding, the built-in
tools and real workspaces in tmp_path."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_workers.agent import protocol
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.agent.policies.guided.mentions import mentions_note
from emelex_workers.agent.protocol import ProposedCall
from emelex_workers.agent.policies.guided.quotes import answers, choose, note_quotes, result_quotes
from emelex_workers.agent.policies.guided.request import asks_for, set_off, small_talk, spans, verbs, words
from emelex_workers.agent.schema import validate
from emelex_workers.agent.session import AgentSession
from emelex_workers.agent.tools import RegisteredTool
from emelex_workers.agent.workspace_map import workspace_map
from emelex_workers.cli.chat_show import ending_line
from emelex_tools.plugin import tool_specs
from tests.support.agent import ScriptedBinding, answer, calls

BUILTIN = {s.name: RegisteredTool(s, "tools", "test") for s in tool_specs()}


def snapshot(version: str = protocol.PROTOCOL_V3) -> SessionSnapshot:
    return SessionSnapshot("scripted@sha256:" + "0" * 64, "0" * 64, version, "1" * 64, 4096, 0.0, 42, 256, 4, 2,
                           "You are a test agent.", tuple(t.authority() for t in BUILTIN.values()))


def offered(schema: dict) -> dict[str, dict]:
    """The arguments schema of each tool a round offers, by name."""
    batch = schema["anyOf"][1] if "anyOf" in schema else schema if "tool_calls" in schema["properties"] else None
    if batch is None:
        return {}
    return {o["properties"]["name"]["const"]: o["properties"]["arguments"]
            for o in batch["properties"]["tool_calls"]["items"]["anyOf"]}


def answer_form(schema: dict) -> dict:
    return (schema["anyOf"][0] if "anyOf" in schema else schema)["properties"]["answer"]


def agent_for(root: Path, request: str, version: str = protocol.PROTOCOL_V3) -> AgentSession:
    agent = AgentSession(ScriptedBinding([]), snapshot(version), BUILTIN)
    agent.add_user(request)
    return agent


def ok(agent: AgentSession, tool: str, arguments: dict, output: str) -> None:
    agent.record(ProposedCall(tool, arguments), {"call_id": tool, "tool": tool, "outcome": "ok", "output": output})


def test_the_request_is_read_by_rule() -> None:
    assert verbs("Please create a.txt, then run it.") == ["create", "run"]
    assert verbs("Can you run ls?") == ["run"]
    assert verbs("How do I install this, according to README.md?") == ["how", "according"]
    program = {"python3", "ls"}.__contains__
    assert spans("Run the command python3 greet.py and tell me what it prints.", program) == ["python3 greet.py"]
    assert spans("Run `sleep 20; echo done` now", program) == ["sleep 20; echo done"]  # set off: that alone
    assert set_off('Create hello.txt containing the text: Hello, world!') == ["Hello, world!"]
    assert set_off('Make greeting.txt that says "hi there"') == ["hi there"]
    assert set_off("Create hello.txt") == []
    assert set_off("please make notes/reminder.txt that says call the dentist.") == ["call the dentist"]
    assert set_off("Save the line 'deadline is March 3' to plans/q1.txt") == ["deadline is March 3"]
    assert spans("Run wc -l words.txt", {"wc"}.__contains__) == ["wc -l words.txt"]
    assert spans("run calc.py with python3 and tell me the output", program, {"calc.py": "python3"}.get) == \
        ["python3 calc.py"]
    assert asks_for(verbs("creat a file greeting.md"), frozenset({"create"}))
    assert not asks_for(verbs("what is in it"), frozenset({"write"}))
    assert small_talk("hi!") and small_talk("What can you do?") and small_talk("thanks") and not small_talk("ls src")


def test_an_answer_quotes_the_precise_line_or_else_the_whole_output() -> None:
    config = result_quotes("config.ini", "[server]\nport = 8421\n\n[log]\nlevel = info\n", "port?")
    assert choose("What port does config.ini set?", config) == ["config.ini: port = 8421"]  # not the whole file
    assert choose("What is in config.ini?", config) == ["config.ini: [server]; port = 8421; [log]; level = info"]
    ran = result_quotes("python3 greet.py", "exit code 0\nlaunch code 5519\n", "run it")
    assert choose("Run python3 greet.py and tell me what it prints", ran) == \
        ["python3 greet.py: exit code 0; launch code 5519"]  # only the label matched: its output whole
    big = result_quotes("big.ini", "".join(f"key{n} = {n}\n" for n in range(40)) + "port = 8421\n", "port")
    assert choose("What port does big.ini set?", big) == ["big.ini: port = 8421"]
    assert choose("How many lines does big.ini have?", result_quotes("big.ini", "a\nb\n", "how many lines")) == \
        ["big.ini: 2 lines, 4 bytes"]
    assert not any("bytes" in q.text for q in result_quotes("a", "x\ny\n", "what does it say"))  # no count asked
    assert choose("hello", config, relevant_only=True) == []
    poem = result_quotes("poem.txt", "line number 1 of the poem\nline number 2\n", "count the lines")
    assert choose("count the lines in poem.txt", poem) == ["poem.txt: 2 lines, 40 bytes"]  # a count asked: counts
    hit = note_quotes([{"hits": ["src/fetcher.py:1: # TODO: handle retries on timeout"]}], "x")
    missed = result_quotes("recall retries", "nothing in this workspace's memory matches 'retries'", "x")
    assert choose("Which file contains the word retries?", [*missed, *hit]) == \
        ["src/fetcher.py:1: # TODO: handle retries on timeout"]  # the line found, not the tool that found none


def test_a_round_answers_with_a_quote_once_the_turn_has_read_something(tmp_path: Path) -> None:
    (tmp_path / "config.ini").write_text("port = 8421\n")
    agent = agent_for(tmp_path, "What port does config.ini set?")
    assert answer_form(agent.round_schema(tmp_path)) == {"type": "string", "maxLength": 500}  # nothing read yet
    ok(agent, "read_file", {"path": "config.ini"}, "port = 8421\n")
    for forced in (None, "chain_limit"):
        assert answer_form(agent.round_schema(tmp_path, forced))["enum"] == ["config.ini: port = 8421"]
    agent.add_user("Explain monads")  # a new turn that read nothing, whose words no note has: a free answer
    assert answer_form(agent.round_schema(tmp_path)) == {"type": "string", "maxLength": 500}
    older = agent_for(tmp_path, "What port does config.ini set?", protocol.PROTOCOL_V2)
    ok(older, "read_file", {"path": "config.ini"}, "port = 8421\n")
    assert answer_form(older.round_schema(tmp_path)) == {"type": "string", "maxLength": 500}  # v2: never quoted


def test_a_question_never_offers_a_write_or_a_command(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x\n")
    for question in ("What does notes.txt say?", "How do I install this?", "Which file mentions pizza?"):
        tools = offered(agent_for(tmp_path, question).round_schema(tmp_path))
        assert {"read_file", "list_dir", "search_text"} <= set(tools), question
        assert not {"write_file", "run_command"} & set(tools), question
    assert {"write_file", "run_command"} <= set(offered(agent_for(tmp_path, "x", protocol.PROTOCOL_V2)
                                                        .round_schema(tmp_path)))


def test_small_talk_offers_no_tool_and_answers_in_kind(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    for talk, reply in (("hi", "Hello! I can read"), ("thanks!", "You're welcome."), ("what can you do?", "Hello!"),
                        ("ok bye", "Goodbye.")):
        schema = agent_for(tmp_path, talk).round_schema(tmp_path)
        assert offered(schema) == {}, talk
        assert len(answer_form(schema)["enum"]) == 1 and answer_form(schema)["enum"][0].startswith(reply), talk


def test_a_request_to_write_offers_the_write_it_names_first_and_once(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    agent = agent_for(tmp_path, "Write a file docs/notes.md with the line: meeting at noon")
    schema = agent.round_schema(tmp_path)
    first = offered(schema)
    assert set(first) == {"write_file"} and "answer" not in json.dumps(schema)  # it must act: no answer form yet
    assert first["write_file"]["properties"]["path"] == {"type": "string", "enum": ["docs/notes.md"]}
    assert first["write_file"]["properties"]["content"]["enum"] == ["meeting at noon"]
    (tmp_path / "docs" / "notes.md").write_text("meeting at noon")  # what the call did
    ok(agent, "write_file", {"path": "docs/notes.md", "content": "meeting at noon"}, "wrote 15 bytes to docs/notes.md")
    after = offered(agent.round_schema(tmp_path))
    assert "write_file" not in after and "read_file" in after  # one effect per request; reading goes on
    assert answer_form(agent.round_schema(tmp_path))["enum"] == ["docs/notes.md: wrote 15 bytes to docs/notes.md"]


def test_a_command_is_a_span_of_the_request_that_starts_with_a_program(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, "Run the command python3 greet.py and tell me what it prints.")
    command = offered(agent.round_schema(tmp_path))["run_command"]["properties"]["command"]
    assert command["enum"] == ["python3 greet.py"]
    (tmp_path / "calc.py").write_text("print(1)\n")
    only = offered(agent_for(tmp_path, "run calc.py with python3 and tell me the output").round_schema(tmp_path))
    assert only["run_command"]["properties"]["command"]["enum"] == ["python3 calc.py"]


def test_a_named_path_the_authority_refuses_is_never_offered(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "link_out")
    named = ["../x.txt", "/etc/passwd", ".hidden", "src/../../x.txt", "link_out/new.txt", "nope/x.txt",
             "x" * 300 + ".md"]
    agent = agent_for(root, "Create " + " ".join(named) + " and src/ok.txt")
    path = offered(agent.round_schema(root))["write_file"]["properties"]["path"]
    authority = snapshot().tool("write_file").input_schema["properties"]["path"]
    assert path == {"type": "string", "enum": ["src/ok.txt"]}
    assert all(validate(value, authority) is None for value in path["enum"])


def test_the_files_a_request_names_are_read_and_a_symlink_is_not(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "config").mkdir(parents=True)
    (root / "config" / "db.toml").write_text('name = "inventory_prod"\n')
    (root / "pizza.txt").write_text("ham and pineapple\n")
    (tmp_path / "secret.txt").write_text("SECRET\n")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    os.symlink(tmp_path / "secret.txt", root / ".env")  # a hidden file is read only when named, never through a link
    note = mentions_note(root, "What is in db.toml, link.txt, .env and ../secret.txt? Which one mentions pineapple?")
    assert [f["path"] for f in note["files"]] == ["config/db.toml"]
    assert note["hits"] == ["pizza.txt:1: ham and pineapple"]
    assert "inventory_prod" in note["text"] and "SECRET" not in json.dumps(note)
    assert mentions_note(root, "hello there") is None
    assert mentions_note(root, "Do you like pineapple?") is None  # not looking for where: no search
    (root / ".flags").write_text("beta=on\n")
    assert mentions_note(root, "What does .flags say?")["files"] == [{"path": ".flags", "bytes": 8,
                                                                      "content": "beta=on\n"}]


def test_the_map_offers_its_files_as_quotes(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x")
    (tmp_path / "notes.txt").write_text("y")
    assert workspace_map(tmp_path)["quotes"] == ["workspace files (here, this folder): notes.txt, src/a.py",
                                                "files in src/: a.py"]


def test_a_named_file_is_recorded_with_the_input_and_a_resume_replays_it_byte_identically(
        store: MemoryStore, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "motd.txt").write_text("Deploy freeze starts Friday.\n")
    binding = ScriptedBinding([answer("motd.txt: Deploy freeze starts Friday.")])

    async def main():
        agent = await DurableAgentSession.create(store, root, binding, BUILTIN, snapshot())
        result = await agent.turn("What does motd.txt say?")
        sid = agent.session_id
        await agent.close()
        (root / "motd.txt").write_text("changed\n")
        resumed = await DurableAgentSession.resume(store, sid, root, ScriptedBinding([]), BUILTIN, snapshot())
        messages = resumed.agent.messages
        await resumed.close()
        return result, sid, messages

    result, sid, messages = asyncio.run(main())
    assert [p["source"] for p in result.context] == ["mentions"]
    kinds = [e.kind for e in store.replay(sid).events]
    assert kinds[:2] == ["context", "user"]  # recorded before the input, in its transaction
    live = binding.rounds[0]["messages"]
    assert "Deploy freeze starts Friday." in live[-2]["content"] and live[-1]["content"] == "What does motd.txt say?"
    assert answer_form(binding.rounds[0]["schema"])["enum"][0] == "motd.txt: Deploy freeze starts Friday."
    assert messages[:len(live)] == live  # replayed, not read again: the file's change is not seen


def test_an_older_session_keeps_its_protocol_and_records_no_file(store: MemoryStore, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "motd.txt").write_text("hi\n")
    binding = ScriptedBinding([calls(("read_file", {"path": "motd.txt"})), answer("it says hi")])

    async def main():
        agent = await DurableAgentSession.create(store, root, binding, BUILTIN, snapshot(protocol.PROTOCOL_V2))
        result = await agent.turn("What does motd.txt say?")
        await agent.close()
        return result

    assert asyncio.run(main()).context == ()
    assert answer_form(binding.rounds[1]["schema"]) == {"type": "string", "maxLength": 500}
    assert "write_file" in offered(binding.rounds[0]["schema"])


def test_the_worked_example_answers_with_the_quote_its_round_would_offer() -> None:
    text = protocol.system_message(snapshot())
    example = protocol.QUOTED_EXAMPLE
    assert f"assistant: {protocol.answer_text(example.answer)}" in text and "<file>: <line>" in text
    offered = choose(example.question, result_quotes(example.call.arguments["path"], example.result, example.question))
    assert offered == [example.answer]
    assert "config.ini: port = 8080" not in protocol.system_message(snapshot(protocol.PROTOCOL_V2))


def test_a_turn_that_reads_nothing_may_quote_what_an_earlier_turn_read(tmp_path: Path) -> None:
    agent = agent_for(tmp_path, "Run `echo hello from the tool`")
    ok(agent, "run_command", {"command": "echo hello from the tool"}, "exit code 0\nhello from the tool\n")
    agent.add_answer("run_command echo hello from the tool: exit code 0; hello from the tool")
    agent.add_user("What did the echo command print?")
    assert answer_form(agent.round_schema(tmp_path))["enum"] == \
        ["run_command echo hello from the tool: exit code 0; hello from the tool"]
    agent.add_user("Explain monads")  # no word of it in what was read: a free answer
    assert answer_form(agent.round_schema(tmp_path)) == {"type": "string", "maxLength": 500}


def test_a_turn_stops_reading_once_its_results_hold_the_answer(store: MemoryStore, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "server.log").write_text("INFO started\nINFO ready\n")
    (root / "logs" / "worker.log").write_text("INFO started\nERROR disk full\n")
    (root / "config.ini").write_text("[server]\nport = 8421\n")
    more = [calls(("list_dir", {"path": "."}))] * 4  # a model that would go on reading to the chain limit
    binding = ScriptedBinding([calls(("read_file", {"path": "config.ini"})), answer("config.ini: port = 8421"),
                               calls(("list_dir", {"path": "logs"})), *more[:2], answer("logs/worker.log: ERROR disk full")])

    async def main():
        agent = await DurableAgentSession.create(store, root, binding, BUILTIN, snapshot())
        port = await agent.turn("What port does config.ini set?")
        error = await agent.turn("Which log has the word ERROR?")
        await agent.close()
        return port, error

    port, error = asyncio.run(main())
    assert (port.rounds, port.forced, port.answer) == (2, "answered", "config.ini: port = 8421")
    assert binding.rounds[1]["schema"]["properties"].keys() == {"answer"}  # the answer form alone, after one read
    assert "the tool results above answer it" in binding.rounds[1]["messages"][-1]["content"]
    # A listing names the logs but not what is sought ("error" is in no quote): the turn reads on.
    assert binding.rounds[3]["schema"] != binding.rounds[1]["schema"]
    assert error.outcome == "answer" and error.forced != "answered"
    assert ending_line(port) is None  # an answer in hand is no limit: the screen says nothing of it


def test_what_holds_the_answer_is_decided_by_rule() -> None:
    listing = result_quotes("logs/", "server.log\nworker.log\n", "")
    error = result_quotes("logs/worker.log", "INFO started\nERROR disk full\n", "")
    assert not answers("Which log file has an ERROR in it?", listing)  # "error" is in no quote yet
    assert answers("Which log file has an ERROR in it?", listing + error)
    config = result_quotes("config.ini", "port = 8421\n", "")
    assert answers("What port does config.ini set?", config)
    assert not answers("What port does app.toml set?", config)  # not the file it names
    assert answers("What does config.ini say?", config)  # no word but the file's name: any quote of it
    assert not answers("What files are here?", result_quotes("src", "file 12 main.py\n", ""))  # "file" answers nothing
    assert answers("How many lines does a.txt have?", result_quotes("a.txt", "x\ny\n", "how many lines"))
    # The count of a file read is no answer to what else the request counts.
    assert not answers("How many files are in the photos folder?", result_quotes("a.txt", "x\n", "how many files")
                       + result_quotes("workspace files", "photos/a.jpg, photos/b.jpg", ""))
    assert words("What does motd.txt say?") == {"motd.txt", "motd", "txt"}  # "does" is common, not "doe"
    # A file named by a plain word ("database" for database.py, read for the request) narrows the quotes only when
    # it holds what is sought, or nothing but its name is asked about.
    db = result_quotes("database.py", "import sqlite3\n# connect here\n", "")
    env = result_quotes("secrets/db.env", "DB_PASSWORD=hunter42\n", "")
    assert not answers("What's the database password?", db, named=["database.py"])
    assert answers("What's the database password?", db + env, named=["database.py"])
    assert choose("What's the database password?", db + env, named=["database.py"]) == \
        ["secrets/db.env: DB_PASSWORD=hunter42"]
    assert {q.split(":")[0] for q in choose("Show the database", db + env, named=["database.py"])} == {"database.py"}
    hit = note_quotes([{"hits": ["logs/worker.log:2: ERROR disk full"]}], "")
    quotes = result_quotes("workspace files", "logs/server.log, logs/worker.log", "") + error + hit
    # "error" is rare among what is quoted (one file), though three quotes hold it: the line wins over the listing.
    assert choose("Which log file has an ERROR in it?", quotes)[0] == "logs/worker.log: ERROR disk full"
