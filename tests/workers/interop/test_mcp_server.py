"""`emelex mcp` driven by the MCP SDK's own client over stdio, against a real `emelex mcp` subprocess: the tools it
lists (and, read-only, does not), cited search confined to its workspace, remember/forget naming the client, a bad
argument, a huge query, a pinned entry, a client that disconnects mid-call; the store unchanged wherever a call was
refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]' (make test installs it)")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402
from mcp.types import INVALID_PARAMS, Implementation  # noqa: E402

from emelex_memory import MemoryStore, NewEvent, Settings  # noqa: E402

from ...support import table_rows  # noqa: E402

EMELEX = str(Path(sys.executable).parent / "emelex")
CLIENT = Implementation(name="emelex-test", version="1.0")
DEADLINE_S = 60
READING = {"search", "recall", "list_knowledge", "show_knowledge", "list_sessions", "show_session"}
WRITING = {"remember", "forget", "pin"}  # not unpin: a pinned entry is the user's, no agent lifts the pin


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def other(tmp_path: Path) -> Path:
    w = tmp_path / "other"
    w.mkdir()
    return w


@pytest.fixture
def seeded(home: Path, workspace: Path, other: Path) -> dict[str, str]:
    """A store with a Session and Knowledge in `workspace`, and a secret Session and entry in `other`."""
    with MemoryStore.open(Settings(home=home)) as store:
        ids = {}
        for where, words in ((workspace, "the staging database listens on port 6543"),
                             (other, "the secret vault password is hunter2 port 6543")):
            session = store.create_session(where, title=where.name)
            with store.acquire_lease(session.id, where) as lease:
                list(lease.replay_all())
                lease.append_turn([NewEvent("user", {"text": words}), NewEvent("assistant", {"text": "noted"})])
                lease.release()
            ids[where.name] = session.id
        store.remember(workspace, "staging-port", "The staging database listens on port 6543.")
        store.remember(workspace, "pinned-rule", "Always run make test before pushing.")
        store.pin(workspace, "pinned-rule")
        store.remember(other, "vault", "The vault password is hunter2 (port 6543).")
    return ids


def db(home: Path) -> Path:
    return home / "memory" / "emelex.sqlite3"


def run(home: Path, workspace: Path, script, *extra: str):
    """Run `script(session)` against a fresh `emelex mcp` subprocess for `workspace`; return its result."""
    env = {"EMELEX_HOME": str(home), "EMELEX_PLUGINS_AUTOLOAD": "0"}
    if "PYTHONPATH" in os.environ:  # the code under test, where it is not the installed one (`make mutants`)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    params = StdioServerParameters(command=EMELEX, args=["mcp", "-w", str(workspace), *extra], env=env)

    async def main():
        with anyio.fail_after(DEADLINE_S):
            with open(os.devnull, "w") as errlog:
                async with stdio_client(params, errlog=errlog) as streams:
                    async with ClientSession(*streams, client_info=CLIENT) as session:
                        await session.initialize()
                        return await script(session)

    return anyio.run(main)


def text(result) -> str:
    return result.content[0].text


def test_it_lists_every_tool_and_read_only_only_those_that_read(home, workspace, seeded) -> None:
    async def names(session):
        return {t.name for t in (await session.list_tools()).tools}

    assert run(home, workspace, names) == READING | WRITING
    before = table_rows(db(home))

    async def refused_write(session):
        tools = await session.list_tools()
        try:
            await session.call_tool("remember", {"key": "k", "content": "a new fact"})
        except MCPError as exc:  # a tool the server does not offer is a protocol error, as the MCP spec says
            return tools, exc.error
        return tools, None

    tools, error = run(home, workspace, refused_write, "--read-only")
    assert {t.name for t in tools.tools} == READING
    assert error is not None and error.code == INVALID_PARAMS
    assert error.message == ("Unknown tool: remember; this server offers list_knowledge, list_sessions, recall, "
                             "search, show_knowledge, show_session")
    assert table_rows(db(home)) == before


def test_search_cites_this_workspace_and_never_another(home, workspace, other, seeded) -> None:
    async def script(session):
        found = await session.call_tool("search", {"query": "6543"})
        sessions = await session.call_tool("list_sessions", {})
        theirs = await session.call_tool("show_session", {"session": seeded["other"]})
        mine = await session.call_tool("show_session", {"session": seeded["workspace"][:8]})
        notes = await session.call_tool("recall", {"query": "staging database"})
        resource = await session.read_resource("emelex://knowledge/staging-port")
        return found, sessions, theirs, mine, notes, resource

    before = table_rows(db(home))
    found, sessions, theirs, mine, notes, resource = run(home, workspace, script)
    hits = found.structured_content["hits"]
    assert {h["kind"] for h in hits} == {"knowledge", "session"}
    assert {h.get("key") for h in hits if h["kind"] == "knowledge"} == {"staging-port"}
    assert {h["session"] for h in hits if h["kind"] == "session"} == {seeded["workspace"]}
    assert all("hunter2" not in h["snippet"] for h in hits)
    assert [s["session"] for s in sessions.structured_content["sessions"]] == [seeded["workspace"]]
    assert theirs.is_error and "no Session" in text(theirs) and "hunter2" not in text(theirs)
    assert [e["kind"] for e in mine.structured_content["events"]] == ["user", "assistant"]
    assert notes.structured_content["notes"][0]["key"] == "pinned-rule"  # pinned first; past turns may follow
    assert "staging-port" in resource.contents[0].text
    assert table_rows(db(home)) == before


def test_remember_and_forget_name_the_client(home, workspace, seeded) -> None:
    async def script(session):
        made = await session.call_tool("remember", {"key": "deploy", "content": "Deploys go through ops/deploy.sh.",
                                                    "confidence": 0.9})
        gone = await session.call_tool("forget", {"key": "deploy"})
        return made, gone

    made, gone = run(home, workspace, script)
    assert not made.is_error and not gone.is_error
    with MemoryStore.open(Settings(home=home)) as store:
        history = store.knowledge_history(workspace, "deploy", 0).versions
    assert [(v.content, v.tombstone, v.confidence, v.client) for v in history] == [
        ("Deploys go through ops/deploy.sh.", False, 0.9, "emelex-test 1.0"), (None, True, 0.9, "emelex-test 1.0")]


def test_refused_calls_change_nothing(home, workspace, seeded) -> None:
    async def script(session):
        return [
            await session.call_tool("search", {"query": "port", "limit": 0}),          # a bad argument
            await session.call_tool("search", {"query": "port " * 250_000}),           # a 1.2 MB query
            await session.call_tool("search", {"query": "port", "scope": "everything"}),
            await session.call_tool("remember", {"key": "pinned-rule", "content": "Never run the tests."}),
            await session.call_tool("forget", {"key": "pinned-rule"}),
            await session.call_tool("remember", {"key": " padded ", "content": "a fact"}),
            await session.call_tool("show_knowledge", {"key": "vault"}),              # another workspace's key
        ]

    before = table_rows(db(home))
    results = run(home, workspace, script)
    assert all(r.is_error for r in results)
    messages = [text(r) for r in results]
    assert "greater than or equal to 1" in messages[0]
    assert "at most 4096 bytes" in messages[1]
    assert "pinned" in messages[3] and "pinned" in messages[4]
    assert "whitespace" in messages[5]
    assert "hunter2" not in messages[6]
    assert table_rows(db(home)) == before


def test_a_client_that_disconnects_mid_call_leaves_a_whole_write_or_none(home, workspace, seeded) -> None:
    async def disconnect(session):
        async with anyio.create_task_group() as group:
            group.start_soon(session.call_tool, "remember", {"key": "half", "content": "A fact written as we leave."})
            await anyio.sleep(0)
            group.cancel_scope.cancel()
        return None

    run(home, workspace, disconnect)

    async def look(session):
        return await session.call_tool("list_knowledge", {"include_forgotten": True})

    entries = {e["key"]: e for e in run(home, workspace, look).structured_content["entries"]}
    assert set(entries) - {"half"} == {"staging-port", "pinned-rule"}
    if "half" in entries:
        assert entries["half"]["content"] == "A fact written as we leave."


def test_a_read_only_server_without_a_store_says_so_in_one_line_and_creates_nothing(home, workspace) -> None:
    import subprocess

    env = {**os.environ, "EMELEX_HOME": str(home)}
    result = subprocess.run([EMELEX, "mcp", "--read-only", "-w", str(workspace)], env=env, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=DEADLINE_S)
    assert result.returncode == 1 and result.stdout == ""  # stdout is the protocol's: nothing else is written there
    assert result.stderr.startswith("error: no store at") and len(result.stderr.splitlines()) == 1
    assert not home.exists()


def test_a_bad_argument_is_told_in_one_line_naming_it(home, workspace, seeded) -> None:
    """Arguments that do not fit a tool's input schema are a tool error (the model reads it and corrects itself) of
    one line naming the argument, what it should be and what came, as every other refusal is."""
    async def script(session):
        return [
            await session.call_tool("search", {"query": "port", "limit": 1000}),
            await session.call_tool("search", {"query": 12345}),
            await session.call_tool("search", {}),
            await session.call_tool("remember", {"key": "k", "content": "c", "confidence": "high"}),
            await session.call_tool("show_session", {"session": ["a", "list"]}),
        ]

    before = table_rows(db(home))
    results = run(home, workspace, script)
    assert all(r.is_error for r in results)
    messages = [text(r) for r in results]
    assert all(len(m.splitlines()) == 1 and "pydantic" not in m for m in messages), messages
    assert messages[0] == "Error executing tool search: `limit` should be less than or equal to 50, got 1000"
    assert messages[1] == "Error executing tool search: `query` should be a valid string, got 12345"
    assert messages[2] == "Error executing tool search: `query` is required"
    assert "`confidence` should be a valid number" in messages[3] and "got 'high'" in messages[3]
    assert "`session` should be a valid string, got ['a', 'list']" in messages[4]
    assert table_rows(db(home)) == before


def test_the_input_schemas_say_exactly_what_each_tool_takes_and_other_keys_are_refused(home, workspace,
                                                                                      seeded) -> None:
    """A misspelt argument (`limt`) is not silently dropped for its default: the schemas admit no other property,
    say which scopes there are, and the server names itself with Emelex's version."""
    from importlib import metadata

    async def script(session):
        return (await session.list_tools(), await session.call_tool("search", {"query": "port", "limt": 5}),
                await session.call_tool("list_knowledge", {"include_forgotten": True, "workspace": "/etc"}))

    before = table_rows(db(home))
    tools, misspelt, foreign = run(home, workspace, script)
    schemas = {t.name: t.input_schema for t in tools.tools}
    assert all(s.get("additionalProperties") is False for s in schemas.values()), schemas
    assert schemas["search"]["properties"]["scope"]["enum"] == ["all", "knowledge", "sessions"]
    assert misspelt.is_error and text(misspelt) == (
        "Error executing tool search: `limt` is not an argument of search; it takes query, scope, limit, cursor")
    assert foreign.is_error and "`workspace` is not an argument of list_knowledge" in text(foreign)
    assert table_rows(db(home)) == before

    env = {"EMELEX_HOME": str(home), "EMELEX_PLUGINS_AUTOLOAD": "0"}
    params = StdioServerParameters(command=EMELEX, args=["mcp", "-w", str(workspace)], env=env)

    async def main():
        with anyio.fail_after(DEADLINE_S):
            with open(os.devnull, "w") as errlog:
                async with stdio_client(params, errlog=errlog) as streams:
                    async with ClientSession(*streams, client_info=CLIENT) as session:
                        return (await session.initialize()).server_info

    info = anyio.run(main)
    assert (info.name, info.version) == ("emelex-memory", metadata.version("emelex-memory"))


def test_list_sessions_pages_through_every_session_of_the_workspace_once(home, workspace, other, seeded) -> None:
    with MemoryStore.open(Settings(home=home)) as store:
        for i in range(3):  # made one after another: one page of the store's Sessions holds them all
            store.create_session(workspace, title=f"later {i}")
            store.create_session(other, title=f"theirs {i}")
        mine = [s.id for s in store.list_sessions(limit=100).sessions if s.workspace.path == str(workspace)]

    async def script(session):
        seen, cursor = [], None
        while True:
            page = (await session.call_tool("list_sessions", {"limit": 1, **({"cursor": cursor} if cursor else {})}))
            seen += [s["session"] for s in page.structured_content["sessions"]]
            cursor = page.structured_content["next_cursor"]
            if cursor is None or len(seen) > 10:
                return seen

    assert run(home, workspace, script) == mine and len(mine) == 4


def test_run_by_hand_at_a_terminal_it_says_what_it_is_and_ctrl_c_stops_it_at_once(home, workspace, seeded) -> None:
    """A person who runs `emelex mcp` in a terminal is told it is a server an agent starts, not a prompt; Ctrl-C ends
    it promptly (status 130), though the SDK's reader is blocked on the terminal waiting for a line."""
    import pty
    import select
    import signal
    import time

    master, slave = pty.openpty()
    env = {**os.environ, "EMELEX_HOME": str(home), "EMELEX_PLUGINS_AUTOLOAD": "0"}
    process = subprocess.Popen([EMELEX, "mcp", "-w", str(workspace)], stdin=slave, stdout=slave, stderr=slave,
                               env=env, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + DEADLINE_S
        while b"Ctrl-C stops it" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 4096)
        assert b"not a prompt" in seen and str(workspace).encode() in seen, seen
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C at its terminal sends
        started = time.monotonic()
        assert process.wait(timeout=DEADLINE_S) == 130
        assert time.monotonic() - started < 10, "Ctrl-C waited for a line to be typed"
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)


def test_show_session_cuts_every_long_text_of_an_event_not_only_what_was_said(home, workspace, seeded) -> None:
    """An imported Session's tool outputs and arguments can be a file's whole text: `show_session` cuts every long
    string of an event, saying how much it left out, so one call cannot flood the agent's context."""
    long_output, long_content = "line of build log\n" * 6000, "x = 1\n" * 9000
    with MemoryStore.open(Settings(home=home)) as store:
        session = store.create_session(workspace, title="big outputs")
        with store.acquire_lease(session.id, workspace) as lease:
            list(lease.replay_all())
            lease.append_turn([
                NewEvent("user", {"text": "build it"}),
                NewEvent("tool_calls", {"calls": [{"call_id": "c1", "tool": "write_file",
                                                   "arguments": {"path": "a.py", "content": long_content}}]}),
                NewEvent("tool_result", {"call_id": "c1", "tool": "write_file", "outcome": "ok",
                                         "output": long_output}),
            ])
            lease.release()

    async def script(session_):
        return await session_.call_tool("show_session", {"session": session.id})

    shown = run(home, workspace, script).structured_content["events"]
    arguments = shown[1]["payload"]["calls"][0]["arguments"]
    output = shown[2]["payload"]["output"]
    assert arguments["path"] == "a.py"
    assert arguments["content"] == long_content[:4000] + f" [... {len(long_content) - 4000} characters cut]"
    assert output == long_output[:4000] + f" [... {len(long_output) - 4000} characters cut]"
