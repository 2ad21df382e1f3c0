"""A capable served model through the real `emelex chat`: the open policy with native tool calling, against a scripted
server on 127.0.0.1 that replays a model's tool calls in the format llama-server, vLLM or Ollama streams them
(tests/support/tool_server.py). A multi-sentence answer printed whole; two and three tool rounds; parallel calls; calls
outside the authority or the round refused; a disabled tool never offered; SIGKILL during a tool, then recover and a
resume that shows the model byte for byte what it saw; and the recorded policy kept after the default changed."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_workers.settings import WorkerSettings
from tests.support.agent import agent_plugin_distribution
from tests.support.served import add_served
from tests.support.tool_server import FLAVOURS, ToolServer, text, tool_calls

pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[3]
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
ANSWER = "The server listens on port 8421.\nThe one note left says: ship it. Nothing else needs doing."


@pytest.fixture
def env(tmp_path: Path, home: Path) -> dict[str, str]:
    dist = agent_plugin_distribution(tmp_path / "dist")  # the `effect` tool, which can hold while it runs
    return {**os.environ, "EMELEX_HOME": str(home), "PYTHONPATH": f"{dist}{os.pathsep}{ROOT}",
            "EMELEX_AGENT_TEST": json.dumps({"effects": str(tmp_path / "effects")})}


@pytest.fixture
def project(workspace: Path) -> Path:
    (workspace / "config.ini").write_text("[server]\nport = 8421\n")
    (workspace / "notes").mkdir()
    (workspace / "notes" / "todo.md").write_text("- ship it\n")
    return workspace


def served(home: Path, server: ToolServer) -> None:
    add_served(WorkerSettings(home=home), "served", server.url, server.model_id, context_window=8192)


def chat(env: dict, workspace: Path, stdin: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--model", "served", *args],
                          input=stdin, env=env, capture_output=True, text=True, timeout=120)


def history(home: Path) -> list[tuple[str, dict]]:
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        return [(e.kind, e.payload) for e in store.replay(session.id).events]


def offered(body: dict) -> dict[str, dict]:
    return {tool["function"]["name"]: tool["function"]["parameters"] for tool in body.get("tools", [])}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_capable_model_reads_in_several_rounds_and_answers_in_its_own_words(env, home, project, flavour) -> None:
    with ToolServer(flavour, [tool_calls(("read_file", {"path": "config.ini"})),
                              tool_calls(("list_dir", {"path": "notes"})),
                              tool_calls(("read_file", {"path": "notes/todo.md"})), text(ANSWER)]) as server:
        served(home, server)
        out = chat(env, project, "What port does the server use, and what is left to do?\n/exit\n")
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    assert "; policy open (a served model); commands: " in first
    assert second.endswith("; tools are called natively (the server's tool calling)")
    assert ANSWER in out.stdout  # printed whole, line break and all
    events = history(home)
    assert [k for k, _ in events] == ["context", "user"] + ["tool_calls", "tool_result"] * 3 + ["assistant", "audit"]
    assert [p["outcome"] for k, p in events if k == "tool_result"] == ["ok"] * 3
    assert events[-1][1] == {"event": "answer", "rounds": 4, "calls": 3, "model": events[-1][1]["model"]}
    # every round offered every enabled tool with its own schema, and saw the calls before it as tool messages
    authority = {name: schema for name, schema in offered(server.chats[0]).items()}
    assert {"read_file", "list_dir", "search_text", "write_file", "run_command", "effect"} <= set(authority)
    assert all(offered(body) == authority and body["tool_choice"] == "auto" for body in server.chats)
    (calls_id,) = [c["call_id"] for k, p in events if k == "tool_calls" for c in p["calls"]][:1]
    assert server.chats[1]["messages"][-2:] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": calls_id, "type": "function", "function": {
            "name": "read_file", "arguments": '{"path": "config.ini"}'}}]},
        {"role": "tool", "tool_call_id": calls_id, "content": "[server]\nport = 8421\n"}]
    assert len(server.chats[3]["messages"]) == len(server.chats[0]["messages"]) + 6


def test_parallel_calls_run_in_one_round_and_calls_outside_the_authority_are_refused(env, home, project) -> None:
    round_one = tool_calls(("read_file", {"path": "config.ini"}), ("read_file", {"path": "notes/todo.md"}))
    round_two = tool_calls(("delete_everything", {}), ("read_file", {"path": "x" * 2000}),
                           ("run_command", {"command": "ls"}), ("list_dir", {"path": "."}),
                           ("read_file", {"path": "config.ini"}))
    with ToolServer("llama-server", [round_one, round_two, text("Done: port 8421, and ship it.")]) as server:
        served(home, server)
        out = chat(env, project, "/tools disable run_command\nLook around.\n/exit\n")
    assert out.returncode == 0, out.stderr
    assert "run_command" not in offered(server.chats[0])  # a disabled tool is never offered
    events = history(home)
    batches = [p["calls"] for k, p in events if k == "tool_calls"]
    assert [len(b) for b in batches] == [2, 5]
    results = [p for k, p in events if k == "tool_result"]
    assert [r["outcome"] for r in results[:2]] == ["ok", "ok"]  # both parallel calls ran
    sent = server.chats[1]["messages"]
    assert sent[-1] == {"role": "system", "content": "These tools are disabled now; do not call them: run_command."}
    assert [m["id"] for m in sent[-4]["tool_calls"]] == [call["call_id"] for call in batches[0]]
    assert sent[-3:-1] == [{"role": "tool", "tool_call_id": call["call_id"], "content": result["output"]}
                           for call, result in zip(batches[0], results[:2])]
    refused = {r["tool"] + str(n): r for n, r in enumerate(results[2:])}
    assert refused["delete_everything0"]["output"] == "there is no tool named 'delete_everything' in this Session"
    assert refused["read_file1"]["output"].startswith("invalid arguments for 'read_file'")
    assert refused["run_command2"]["output"] == "tool 'run_command' is disabled in this chat"
    assert refused["list_dir3"]["outcome"] == "ok"
    assert refused["read_file4"]["output"] == "this round allows at most 4 tool calls; this one was not run"
    assert all(refused[k]["outcome"] == "error" for k in ("delete_everything0", "read_file1", "run_command2",
                                                           "read_file4"))
    assert out.stdout.count("<- delete_everything: refused") == 1 and "<- read_file: refused" in out.stdout


def test_sigkill_during_a_tool_then_recover_and_the_resume_shows_the_model_what_it_saw(env, home, project,
                                                                                          tmp_path) -> None:
    started = tmp_path / "started"
    env = {**env, "EMELEX_SESSION_LEASE_TTL_S": "2", "EMELEX_AGENT_TEST": json.dumps({
        "effects": str(tmp_path / "effects"), "tool_started": str(started), "hold_tool": str(tmp_path / "never")})}
    with ToolServer("vllm", [tool_calls(("effect", {"label": "a"})),
                             text("The effect may have run; I will not repeat it.")]) as server:
        served(home, server)
        process = subprocess.Popen([*EMELEX, "chat", "--workspace", str(project), "--model", "served"], env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        process.stdin.write("Record the label a.\ny\n")
        process.stdin.flush()
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline and process.poll() is None, process.stderr.read()
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        process.stdout.close(), process.stderr.close(), process.stdin.close()
        seen = server.chats[0]["messages"]  # what the model saw in the round whose call was killed
        with MemoryStore.open(WorkerSettings(home=home)) as store:
            (session,) = [s.id for s in store.list_sessions().sessions]
        time.sleep(2.5)  # the killed chat's lease expires
        recovered = subprocess.run([*EMELEX, "memory", "sessions", "recover", session, "--accept-unknown-effects"],
                                   env=env, capture_output=True, text=True, timeout=60)
        assert recovered.returncode == 0, recovered.stderr
        later = {**env, "EMELEX_CHAT_POLICY": "guided"}  # the default changed since
        resumed = chat(later, project, "What happened?\n/exit\n", "--resume", session)
    assert resumed.returncode == 0, resumed.stderr
    assert "; policy open (recorded in the Session); commands: " in resumed.stdout.splitlines()[0]
    again = server.chats[1]
    assert json.dumps(again["messages"][:len(seen)]) == json.dumps(seen)  # byte for byte what it saw
    (call,) = [c for k, p in history(home) if k == "tool_calls" for c in p["calls"]]
    assert again["messages"][len(seen):] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": call["call_id"], "type": "function", "function": {
            "name": "effect", "arguments": '{"label": "a"}'}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "[unknown_effect] this call may have run; its "
                                                                     "effect is unknown; do not repeat it unless "
                                                                     "the user asks"},
        {"role": "system", "content": "The previous turn ended without an answer (interrupted): the process ended "
                                      "during this turn; reconciled on resume"},
        {"role": "user", "content": "What happened?"}]
    assert offered(again) == offered(server.chats[0])  # still native, still every tool
    assert len((tmp_path / "effects").read_text().splitlines()) == 1  # the effect ran once, never again


def test_a_session_whose_tools_were_called_natively_is_refused_by_a_server_that_no_longer_calls_them(
        env, home, project) -> None:
    with ToolServer("llama-server", [text("Hello. I can read and change the files here.")]) as server:
        served(home, server)
        assert chat(env, project, "hi\n/exit\n").returncode == 0
        with MemoryStore.open(WorkerSettings(home=home)) as store:
            (session,) = [s.id for s in store.list_sessions().sessions]
        server.native = False  # restarted without --jinja
        before = history(home)
        refused = chat(env, project, "/exit\n", "--resume", session)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"error: Session {session} was created with protocol 'openai-tools/1', but the "
                                     "current configuration has 'emelex-tools/2'; run the Emelex version the Session "
                                     "was created with (for `openai-tools/1`, a model server that calls tools "
                                     "natively: llama-server with --jinja, vLLM with a tool parser)")
    assert history(home) == before


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_server_without_native_tool_calls_gets_the_json_union_and_the_chat_says_why(env, home, project,
                                                                                    flavour) -> None:
    words = "Hello. I can read and change the files here."
    with ToolServer(flavour, [text(json.dumps({"answer": words}))], native=False) as server:
        served(home, server)
        out = chat(env, project, "hi\n/exit\n")
    assert out.returncode == 0, out.stderr
    line = out.stdout.splitlines()[1]
    assert line.endswith(")") and "; tools are called through a constrained JSON grammar (" in line
    assert {"llama-server": "tools param requires --jinja flag", "vllm": '"auto" tool choice requires',
            "ollama": "Ollama lists no tools in the model's capabilities"}[flavour] in line
    assert words in out.stdout
    (asked,) = server.chats
    assert "tools" not in asked and "response_format" in asked  # a round of the constrained union
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        assert journal.stored_snapshot(store, session.id).protocol == "emelex-tools/2"


def read_until(master: int, text: str, seen: str = "", deadline_s: float = 60) -> str:
    """What the terminal `master` shows, read until it holds `text` (at most `deadline_s`), after `seen`."""
    deadline = time.monotonic() + deadline_s
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{text!r} not shown within {deadline_s} s: {seen!r}"
        if select.select([master], [], [], left)[0]:
            seen += os.read(master, 4096).decode("utf-8", "replace")
    return seen


def test_a_chat_at_a_terminal_says_it_is_asking_the_server_until_the_server_answered(env, home, project) -> None:
    """A served model's server is asked what it supports (its tool calling) before the chat's first line: on a
    terminal a status line says so while it answers, and is erased before the first line."""
    release = threading.Event()
    with ToolServer("llama-server", [text("Hello.")], hold_probe=release) as server:
        served(home, server)
        master, slave = pty.openpty()
        process = subprocess.Popen([*EMELEX, "chat", "--workspace", str(project), "--model", "served"], env=env,
                                   stdin=slave, stdout=slave, stderr=subprocess.PIPE, text=True)
        os.close(slave)
        try:
            seen = read_until(master, f"asking the model server at {server.url} what it supports")
            assert "session " not in seen
            release.set()
            seen = read_until(master, "\n> ", seen)
            status = seen.index("asking the model server")
            assert seen[status:].index("\r\x1b[Ksession ") < seen[status:].index("\n")  # erased, then the line
            os.write(master, b"/exit\n")
            assert process.wait(timeout=60) == 0, process.stderr.read()
        finally:
            release.set()
            if process.poll() is None:
                process.kill()
            os.close(master)
