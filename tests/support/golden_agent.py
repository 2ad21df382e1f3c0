"""Golden agent Sessions: what every model round of a scripted chat saw (its messages and its grammar's schema) and
what a resume of that Session shows the model, for Sessions made with each protocol version before turn policies
(`emelex-tools/1`, `/2`, `/3`), recorded from the code that made them.

`tests/workers/agent/test_agent_golden.py` runs the same scripted chats with today's code and requires the same
rounds, byte for byte, and a resume of the Sessions the old code recorded (their events and snapshot, replayed into a
store) to show the model exactly what it showed then: the guided rules keep their behaviour and an old Session resumes
exactly. Regenerate the file only from the code whose behaviour it records:
`python -m tests.support.golden_agent tests/workers/agent/golden_sessions.json`.

Each scenario is a fresh workspace (`files`) and turns: the user's line, then the scripted round outputs (an answer or
calls); every call asking for approval is approved. The chat's own parts make the Session: the built-in tools, the
workspace map and recall context sources, the chat's system prompt. Call IDs are numbered, not random.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_workers.agent import workspace_map
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.recall import RECALL_SOURCE, recall_source
from emelex_workers.agent.tools import registered_tools
from emelex_workers.cli.chat import SYSTEM_PROMPT
from emelex_workers.host.manager import get_plugin_manager
from emelex_workers.settings import WorkerSettings
from tests.support.agent import ScriptedBinding

MODEL_REFERENCE = "scripted@sha256:" + "5" * 64
SNAPSHOT_ID = "sha256:" + "6" * 64
CONTEXT = (workspace_map.SOURCE, RECALL_SOURCE)


def _answer(text: str) -> dict:
    return {"answer": text}


def _calls(*proposed: tuple[str, dict]) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments} for name, arguments in proposed]}


FILES = {"config.ini": "[server]\nport = 8421\n", "notes/todo.md": "- ship it\n", "recipes/pizza.txt": "pineapple\n",
         "quote.txt": 'version = "2.7.1"\npath = C:\\tmp\n', "greet.py": "print('launch code', 5519)\n"}
SCENARIOS: dict[str, dict[str, Any]] = {
    "v3": {"protocol": "emelex-tools/3", "turns": [
        ["What port does config.ini set?", _calls(("read_file", {"path": "config.ini"})),
         _answer("config.ini: port = 8421")],
        ["hi", _answer("Hello! I can read, list and search the files in this workspace, create a file, or run a "
                       "command you name.")],
        ["Which file mentions pineapple?", _calls(("search_text", {"text": "pineapple"})),
         _answer("recipes/pizza.txt:1: pineapple")],
        ["What version does quote.txt set?", _calls(("read_file", {"path": "quote.txt"})),
         _answer('quote.txt: version = "2.7.1"')],
        ["Create hello.txt with the text: hi there",
         _calls(("write_file", {"path": "hello.txt", "content": "hi there"})), _answer("hello.txt: wrote 8 bytes")],
        ["Run the command python3 greet.py and tell me what it prints.",
         _calls(("run_command", {"command": "python3 greet.py"})), _answer("run_command python3 greet.py: exit code 0")],
        ["List the notes folder", _calls(("list_dir", {"path": "notes"})), _calls(("list_dir", {"path": "recipes"})),
         _calls(("read_file", {"path": "notes/todo.md"})), _calls(("read_file", {"path": "config.ini"})),
         _answer("notes/todo.md: - ship it")],
    ]},
    "v2": {"protocol": "emelex-tools/2", "turns": [
        ["What port does config.ini set?", _calls(("read_file", {"path": "config.ini"})),
         _answer("The port is 8421.")],
        ["Read it again", _calls(("read_file", {"path": "quote.txt"})), _calls(("search_text", {"text": "version"})),
         _calls(("search_text", {"text": "version"})), _answer("It says version 2.7.1.")],
    ]},
    "v1": {"protocol": "emelex-tools/1", "turns": [
        ["What is in notes?", _calls(("list_dir", {"path": "notes"})), _answer("todo.md")],
    ]},
}


@contextmanager
def numbered_call_ids() -> Iterator[None]:
    """Call IDs "call-1", "call-2", ... instead of random ones, so recorded rounds compare byte for byte."""
    counter = itertools.count(1)

    class Numbered:
        def __init__(self) -> None:
            self.hex = f"call-{next(counter)}"

    with mock.patch("emelex_workers.agent.durable.uuid.uuid4", Numbered):
        yield


def _write(workspace: Path) -> None:
    for path, text in FILES.items():
        target = workspace / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def recorded_tools(tools: dict) -> dict:
    """The built-in tools as the recorded Sessions had them: write_file as it was (it created or replaced a file,
    with no `replace` argument and no preview) and no edit_file. A tool whose authority changed fails a resume
    closed; this keeps the recorded rounds comparable with the guided rules of today."""
    from dataclasses import replace

    from emelex_tools import files

    kept = {name: tool for name, tool in tools.items() if name != "edit_file"}
    write = kept["write_file"]
    schema = {**write.spec.input_schema, "properties": {
        k: v for k, v in write.spec.input_schema["properties"].items() if k != "replace"}}
    kept["write_file"] = replace(write, spec=replace(write.spec, description="Create or replace a text file in the "
                                                     "workspace.", input_schema=schema, run=files.write_file,
                                                     preview=None))
    return kept


def _parts(settings: WorkerSettings, binding: ScriptedBinding, protocol: str):
    tools = recorded_tools(registered_tools(get_plugin_manager(settings)))
    snapshot = build_snapshot(binding, tools, model_reference=MODEL_REFERENCE, model_snapshot_id=SNAPSHOT_ID,
                              system_prompt=SYSTEM_PROMPT, context=CONTEXT, protocol=protocol)
    sources = {**{workspace_map.SOURCE: workspace_map.workspace_map_source}, RECALL_SOURCE: recall_source(512)}
    return tools, snapshot, sources


def _scrub(value: Any, root: Path) -> Any:
    """`value` with the temporary directory's path replaced by "<tmp>"."""
    return json.loads(json.dumps(value).replace(str(root), "<tmp>"))


def run_scenario(name: str, root: Path) -> dict[str, Any]:
    """Run scenario `name` in a fresh workspace and Home under `root`: every round's messages and schema, the
    Session's snapshot and events, and what a resume shows the model (its messages and the next round's schema)."""
    scenario = SCENARIOS[name]
    workspace, home = root / "workspace", root / "home"
    workspace.mkdir()
    _write(workspace)
    settings = WorkerSettings(home=home, plugins_autoload=False)
    outputs = [item for turn in scenario["turns"] for item in turn[1:]]
    binding = ScriptedBinding(outputs, window=4096)
    tools, snapshot, sources = _parts(settings, binding, scenario["protocol"])

    async def approve(call, tool):
        return "approve"

    async def chat(store: MemoryStore) -> tuple[str, list]:
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, context_sources=sources)
        results = []
        for turn in scenario["turns"]:
            result = await agent.turn(turn[0], approve=approve)
            results.append({"outcome": result.outcome, "answer": result.answer, "rounds": result.rounds,
                            "calls": result.calls, "forced": result.forced})
        await agent.close()
        return agent.session_id, results

    async def resume(store: MemoryStore, session_id: str) -> dict:
        again = ScriptedBinding([], window=4096)
        agent = await DurableAgentSession.resume(store, session_id, workspace, again, tools, snapshot,
                                                 context_sources=sources)
        try:
            return {"messages": agent.agent.messages, "schema": agent.agent.round_schema(workspace)}
        finally:
            await agent.close()

    with numbered_call_ids(), MemoryStore.open(settings) as store:
        session_id, results = asyncio.run(chat(store))
        events = [{"kind": e.kind, "turn": e.turn, "payload": e.payload} for e in store.replay(session_id).events]
        stored = journal.stored_snapshot(store, session_id)
        resumed = asyncio.run(resume(store, session_id))
    table: list[dict] = []  # every distinct message once; a round names its messages by their index here
    rounds = [{"messages": _indexed(r["messages"], table), "schema": r["schema"]} for r in binding.rounds]
    resumed["messages"] = _indexed(resumed["messages"], table)
    return _scrub({"protocol": scenario["protocol"], "results": results, "messages": table, "rounds": rounds,
                   "snapshot": stored.to_json(), "digest": stored.digest, "events": events, "resumed": resumed}, root)


def _indexed(messages: list[dict], table: list[dict]) -> list[int]:
    """The index in `table` of each of `messages`, adding those it lacks."""
    found = []
    for message in messages:
        if message not in table:
            table.append(message)
        found.append(table.index(message))
    return found


def expand(record: dict[str, Any], indexes: list[int]) -> list[dict]:
    """The messages a recorded round or resume names by index."""
    return [record["messages"][i] for i in indexes]


def main(path: str) -> None:
    """Write every scenario's record to `path`."""
    record = {}
    for name in SCENARIOS:
        with tempfile.TemporaryDirectory(prefix="emelex-golden-") as tmp:
            record[name] = run_scenario(name, Path(tmp))
    Path(path).write_text(json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
