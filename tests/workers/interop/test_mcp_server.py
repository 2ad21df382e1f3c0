"""`emelex mcp` driven by the MCP SDK's own client over stdio, against a real `emelex mcp` subprocess: the tools it
lists (and, read-only, does not), cited search confined to its workspace, remember/forget naming the client, a bad
argument, a huge query, a pinned entry, a client that disconnects mid-call; the store unchanged wherever a call was
refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed: pip install -e '.[mcp]' (make test installs it)")

from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.types import Implementation  # noqa: E402

from emelex_memory import MemoryStore, NewEvent, Settings  # noqa: E402

from ...support import table_rows  # noqa: E402

EMELEX = str(Path(sys.executable).parent / "emelex")
CLIENT = Implementation(name="emelex-test", version="1.0")
DEADLINE_S = 60
READING = {"search", "recall", "list_knowledge", "show_knowledge", "list_sessions", "show_session"}
WRITING = {"remember", "forget", "pin", "unpin"}


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
        return await session.list_tools(), await session.call_tool("remember", {"key": "k", "content": "a new fact"})

    tools, result = run(home, workspace, refused_write, "--read-only")
    assert {t.name for t in tools.tools} == READING
    assert result.is_error and "remember" in text(result)
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
