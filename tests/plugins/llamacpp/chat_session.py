"""A chat Session as `emelex chat` writes it: the adapter over the built-in tools in a real workspace, with a
workspace map and recalled notes recorded before the first round, driven by a scripted binding whose rounds are
what the default model proposes (repeated calls, a path built from a tool's name, an answer that echoes a listing,
answers that are tool-call JSON, a denied command, identical rounds, each answered from the first and then
forced to an answer as the adapter does, and an answer forced once the turn's results hold it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.tools import registered_tools
from emelex_workers.host.manager import get_plugin_manager
from emelex_workers.settings import WorkerSettings

from ...support.agent import ScriptedBinding, answer, calls

FILES = {
    "config.toml": "[server]\nport = 8080\nhost = \"127.0.0.1\"\n",
    "main.py": "import sys\n\n\ndef parse_args(argv):\n    return argv[1:]\n",
    "notes.md": "# Notes\nThe release is on Friday.\n",
}
BUILTIN = ("read_file", "list_dir", "search_text", "write_file", "run_command")

# (user message, the model's rounds, decisions for the calls that need approval)
TURNS = [
    ("What files are in this workspace?",
     [calls(("list_dir", {"path": "."})), calls(("list_dir", {"path": "."})),
      answer("file 40 config.toml\nfile 52 main.py\nfile 31 notes.md")], []),
    ("What port does config.toml set?",
     [calls(("read_file", {"path": "config.toml"})), answer("config.toml sets port = 8080.")], []),
    ("What does notes.md say?",  # answers that are tool-call JSON, the second cut off by the token limit
     [calls(("read_file", {"path": "notes.md"})),
      answer('{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]}')], []),
    ("Read notes.md again.",
     [calls(("read_file", {"path": "notes.md"})),
      answer('{"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}, {"name": "read_file", '
             '"arguments": {"path": "notes')], []),
    ("How many lines does notes.md have?",  # the count of notes.md, read for the model, answers it: forced
     [calls(("list_dir", {"path": "list_dir.txt"})), answer("notes.md has 2 lines.")], []),
    ("Which file defines the function parse_args?",
     [calls(("read_file", {"path": "read_file.py"})), calls(("search_text", {"text": "def parse_args"})),
      answer("parse_args is defined in main.py.")], []),
    ("Create a file hello.txt that says hello.",
     [calls(("write_file", {"path": "hello.txt", "content": "hello\n"})), answer("I created hello.txt.")],
     ["approve"]),
    ("Run ls and tell me the output.",
     [calls(("run_command", {"command": "ls"})), answer("The command was not run, you denied it.")], ["deny"]),
    ("Thanks, that is all.", [answer("You're welcome.")], []),
]


NOTE = "Notes from earlier Sessions (may be outdated): the deploy runs from the release branch."
CONTEXT = {  # context sources as the chat's: a workspace map and recalled notes, recorded before the first round
    "workspace_map": lambda request: {"text": "Workspace: " + ", ".join(
        f"{p.name} ({p.stat().st_size} bytes)" for p in sorted(request.workspace.iterdir())), "entries": len(FILES)},
    "recall": lambda request: {"text": NOTE, "notes": [{"key": "deploy-release-branch", "version": 1}]},
}


def chat_session(store: MemoryStore, settings: WorkerSettings, workspace: Path) -> str:
    """Write `FILES` into `workspace`, run `TURNS` through the adapter with the built-in tools, close cleanly (which
    queues distillation); the Session's ID."""
    for name, text in FILES.items():
        (workspace / name).write_text(text)
    tools = {name: tool for name, tool in registered_tools(get_plugin_manager(settings)).items() if name in BUILTIN}
    binding = ScriptedBinding([output for _, rounds, _ in TURNS for output in rounds])

    async def main() -> str:
        snapshot = build_snapshot(binding, tools, model_reference="test/scripted", model_snapshot_id="s" * 64,
                                  system_prompt="You are a coding assistant.", context=tuple(CONTEXT))
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, context_sources=CONTEXT)
        for text, _rounds, decisions in TURNS:
            pending = iter(decisions)
            await agent.turn(text, approve=lambda call, tool: next(pending))
        await agent.close()
        return agent.session_id

    return asyncio.run(main())
