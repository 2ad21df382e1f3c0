"""Each round's grammar: path arguments narrowed to what exists (never wider than the snapshot's authority), no
identical repeat, and a forced answer at the chain limit or after a round that learned nothing; all in process
over the scripted binding and real workspaces in tmp_path."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import threading
from pathlib import Path

import pytest

from emelex_memory import Event, MemoryStore
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_workers.agent import protocol
from emelex_workers.agent.durable import DurableAgentSession
from emelex_workers.agent.protocol import ProposedCall, history_messages
from emelex_workers.agent.schema import validate
from emelex_workers.agent.session import AgentSession
from emelex_workers.agent.tools import RegisteredTool
from emelex_tools.plugin import tool_specs
from tests.support.agent import ScriptedBinding, answer, calls

from .test_agent_durable import effects, run, snap, tools  # noqa: F401 - the scripted tools and their fixtures

BUILTIN = {s.name: RegisteredTool(s, "tools", "test") for s in tool_specs()}
KINDS = {"read_file": "file", "list_dir": "directory", "search_text": "directory", "write_file": "new"}
ANSWER_ONLY = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 500}},
               "required": ["answer"], "additionalProperties": False}


def builtin_snapshot(version: str = protocol.PROTOCOL_V2) -> SessionSnapshot:
    """The built-in tools' snapshot, by default under "emelex-tools/2" (its grammar is not narrowed by the request:
    "emelex-tools/3" is tested in test_agent_quotes.py)."""
    return SessionSnapshot("scripted@sha256:" + "0" * 64, "0" * 64, version, "1" * 64, 4096, 0.0,
                           42, 256, 4, 2, "You are a test agent.", tuple(t.authority() for t in BUILTIN.values()))


def options(schema: dict) -> dict[str, dict]:
    """The arguments schema of each tool a round offers, by name ({} for the answer form alone)."""
    if "anyOf" not in schema:
        return {}
    batch = schema["anyOf"][1]["properties"]["tool_calls"]["items"]["anyOf"]
    return {o["properties"]["name"]["const"]: o["properties"]["arguments"] for o in batch}


def path_forms(schema: dict) -> tuple[list[str], list[str]]:
    """The enum values and the patterns of a narrowed path argument."""
    forms = schema.get("anyOf", [schema])
    return ([v for f in forms for v in f.get("enum", [])], [f["pattern"] for f in forms if "pattern" in f])


def random_tree(root: Path, seed: int) -> None:
    """A workspace of files, directories, hidden entries, symlinks (in and out), odd names and overlong paths."""
    rng = random.Random(seed)
    root.mkdir()
    (root.parent / f"outside{seed}").mkdir()
    (root.parent / f"outside{seed}" / "secret.txt").write_text("SECRET")
    names = ["a.txt", "src", "notes", "b c.md", "x-1.2.py", "ünï.txt", "deep", ".git", ".env", "node_modules",
             "__pycache__", "config.ini", "long" * 20]
    dirs = [root]
    for _ in range(rng.randint(5, 40)):
        parent = rng.choice(dirs)
        name = rng.choice(names) + (str(rng.randint(0, 3)) if rng.random() < 0.5 else "")
        target = parent / name
        if target.exists() or target.is_symlink() or len(str(target.relative_to(root))) > 400:
            continue
        if rng.random() < 0.4:
            target.mkdir()
            dirs.append(target)
        else:
            target.write_text(name)
    (root / "link_out").symlink_to(root.parent / f"outside{seed}")
    (root / "link_file").symlink_to(root.parent / f"outside{seed}" / "secret.txt")
    deep = root / ("d" * 100) / ("e" * 100)  # a file whose path is over the authority's 256 characters
    deep.mkdir(parents=True)
    (deep / ("f" * 100)).write_text("too deep to name")


def really_is(root: Path, path: str, kind: str) -> bool:
    """`path` exists inside `root` as `kind`, through no symlink, no hidden component and no cache directory."""
    parts = [] if path == "." else path.split("/")
    if any(p in ("", ".", "..", "node_modules", "__pycache__") or p.startswith(".") for p in parts):
        return False
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink():
            return False
    return current.is_file() if kind == "file" else current.is_dir()


ADVERSARIAL = ["../x.txt", "/etc/passwd", "~/x", ".hidden", "a/.x", "src/../../x", "link_out/secret.txt",
               "nope/x.txt", "", "x" * 300, "src//x", "a\0b", "link_out/new.txt"]


@pytest.mark.parametrize("seed", range(8))
def test_the_narrowed_grammar_never_admits_a_path_the_authority_refuses(tmp_path: Path, seed: int) -> None:
    root = tmp_path / "ws"
    random_tree(root, seed)
    snapshot = builtin_snapshot()
    agent = AgentSession(ScriptedBinding([]), snapshot, BUILTIN)
    offered = options(agent.round_schema(root))
    existing = [str(p.relative_to(root)) for p in root.rglob("*")]
    assert offered["run_command"] == snapshot.tool("run_command").input_schema  # no declared path: untouched
    for tool, kind in KINDS.items():
        authority = snapshot.tool(tool).input_schema
        narrowed = offered[tool]
        values, patterns = path_forms(narrowed["properties"]["path"])
        assert values or patterns
        for value in values:  # every offered path validates against the snapshot and exists as its kind
            assert validate(value, authority["properties"]["path"]) is None, value
            assert really_is(root, value, "file" if kind == "new" else kind), (tool, value)
            filled = {"path": value, "text": "t", "content": "c"}
            arguments = {k: filled[k] for k in authority["properties"] if k in authority.get("required", []) + ["path"]}
            assert agent.gate(ProposedCall(tool, arguments)) is None
        for pattern in patterns:  # every name the pattern admits fits the authority's bounds
            low, high = re._parser.parse(pattern[1:-1]).getwidth()
            assert 1 <= low and high <= authority["properties"]["path"]["maxLength"], pattern
            for candidate in ADVERSARIAL:
                assert not re.fullmatch(pattern, candidate), (pattern, candidate)
            for path in existing:
                if really_is(root, path, "directory") and re.fullmatch(r"[A-Za-z0-9_][\w.-]*(/[\w.-]+)*", path,
                                                                       re.ASCII) and len(path) < 150:
                    assert re.fullmatch(pattern, f"{path}/new_file.txt"), (pattern, path)
        for candidate in ADVERSARIAL + existing:  # a restriction: what the round admits, the snapshot admits
            if validate(candidate, narrowed["properties"]["path"]) is None:
                assert validate(candidate, authority["properties"]["path"]) is None, candidate
    assert "a\0b" not in json.dumps(offered) and "SECRET" not in json.dumps(offered)
    assert not any("link_" in v or "/." in v or v.startswith(".") and v != "." for t in KINDS
                   for v in path_forms(offered[t]["properties"]["path"])[0])


def test_a_large_tree_offers_the_nearest_entries_and_skips_huge_and_hidden_ones(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "huge").mkdir(parents=True)
    for n in range(1001):
        (root / "huge" / f"f{n}").write_text("")
    (root / "top.txt").write_text("")
    level = root
    for n in range(12):
        level = level / f"l{n}"
        level.mkdir()
        for m in range(30):
            (level / f"file{m}.txt").write_text("")
    home = root / "emelex-home"
    home.mkdir()
    (home / "inside.txt").write_text("")
    agent = AgentSession(ScriptedBinding([]), builtin_snapshot(), BUILTIN,
                         exclude={(home.stat().st_dev, home.stat().st_ino)})
    files = path_forms(options(agent.round_schema(root))["read_file"]["properties"]["path"])[0]
    directories = path_forms(options(agent.round_schema(root))["list_dir"]["properties"]["path"])[0]
    assert "top.txt" in files and "l0/file0.txt" in files  # the nearest ones
    assert not any(f.startswith("huge/") for f in files) and "huge" in directories  # listed, not its contents
    assert "emelex-home" not in directories and not any("inside" in f for f in files)
    assert len(files) + len(directories) <= 200 and not any(f.startswith("l0/l1/l2/l3/l4/l5/l6/l7/") for f in files)


def test_a_disabled_tool_and_a_tool_with_nothing_to_name_stay_unproposable(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    agent = AgentSession(ScriptedBinding([calls(("read_file", {"path": "x.txt"}))]), builtin_snapshot(), BUILTIN)
    agent.disable_tool("list_dir")
    offered = options(agent.round_schema(root))
    assert "list_dir" not in offered  # disabled, whatever exists
    assert "read_file" not in offered  # no file exists to read
    assert path_forms(offered["write_file"]["properties"]["path"]) == ([], ["^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"])
    out = agent.generate_round(stop=threading.Event(), workspace=root)
    assert "read_file" not in json.dumps(agent.binding.rounds[0]["schema"])
    assert agent.gate(out.calls[0]) is None  # the gate is the snapshot's: a missing path is the tool's error
    assert "disabled" in agent.gate(ProposedCall("list_dir", {"path": "."}))


def test_a_path_already_read_in_the_turn_is_not_offered_again_until_something_changed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a")
    (root / "b.txt").write_text("b")
    agent = AgentSession(ScriptedBinding([]), builtin_snapshot(), BUILTIN)
    agent.add_user("go")

    def readable() -> list[str]:
        offered = options(agent.round_schema(root))
        return path_forms(offered["read_file"]["properties"]["path"])[0] if "read_file" in offered else []

    assert readable() == ["a.txt", "b.txt"]
    assert agent.record(ProposedCall("read_file", {"path": "a.txt"}), {"call_id": "c1", "outcome": "ok", "output": "a"})
    assert readable() == ["b.txt"]
    assert agent.earlier_result(ProposedCall("read_file", {"path": "a.txt"}))["call_id"] == "c1"
    agent.record(ProposedCall("read_file", {"path": "b.txt"}), {"call_id": "c2", "outcome": "ok", "output": "b"})
    assert readable() == []  # every file read: read_file is not offered at all
    agent.record(ProposedCall("write_file", {"path": "a.txt", "content": "new"}),
                 {"call_id": "c3", "outcome": "ok", "output": "wrote"})
    assert readable() == ["a.txt", "b.txt"]  # a write may have changed them
    assert agent.earlier_result(ProposedCall("write_file", {"path": "a.txt", "content": "new"}))["call_id"] == "c3"
    agent.add_answer("done")
    assert readable() == ["a.txt", "b.txt"]
    assert agent.earlier_result(ProposedCall("read_file", {"path": "a.txt"})) is None


def event(seq: int, kind: str, payload) -> Event:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return Event((seq, seq, seq, 0, kind, text, len(text), 0, 0.0, None))


def test_replayed_history_rebuilds_what_the_open_turn_has_done(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a")
    (root / "b.txt").write_text("b")
    events = [event(1, "user", {"text": "go"}),
              event(2, "tool_calls", {"round": 1, "calls": [{"call_id": "c1", "tool": "read_file",
                                                              "arguments": {"path": "a.txt"}}]}),
              event(3, "tool_result", {"call_id": "c1", "tool": "read_file", "outcome": "ok", "output": "a"})]
    agent = AgentSession(ScriptedBinding([]), builtin_snapshot(), BUILTIN)
    agent.load_history(events)
    read = options(agent.round_schema(root))["read_file"]["properties"]["path"]
    assert path_forms(read)[0] == ["b.txt"]
    assert agent.earlier_result(ProposedCall("read_file", {"path": "a.txt"}))["call_id"] == "c1"
    agent.load_history([*events, event(4, "turn_failed", {"reason": "interrupted", "diagnostic": "x"})])
    assert agent.earlier_result(ProposedCall("read_file", {"path": "a.txt"})) is None  # that turn is over


# -- the durable turn ---------------------------------------------------------------------------------------


def results(store: MemoryStore, session_id: str) -> list[dict]:
    return [e.payload for e in store.replay(session_id).events if e.kind == "tool_result"]


def test_an_identical_call_never_runs_twice_in_a_turn(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([calls(("effect", {"label": "a"}), ("effect", {"label": "a"})),
                               calls(("effect", {"label": "a"}), ("peek", {"label": "b"})), answer("done")])
    asked: list[str] = []
    shown: list[str] = []

    async def approve(call, tool):
        asked.append(call.arguments["label"])
        return "approve"

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snap(binding, tools))
        result = await agent.turn("go", approve=approve, on_result=lambda call, r: shown.append(r["outcome"]))
        await agent.close()
        return agent, result

    agent, result = run(main())
    assert result.outcome == "answer" and result.forced is None
    assert effects.read_text().count(" a\n") == 1 and asked == ["a"]  # ran once, asked once
    first, *rest = results(store, agent.session_id)
    assert [r["outcome"] for r in (first, *rest)] == ["ok", "repeated", "repeated", "ok"]
    for repeat in rest[:2]:
        assert repeat["earlier_call_id"] == first["call_id"] and repeat["output"] == "did a"
        assert repeat["earlier_outcome"] == "ok" and repeat["call_id"] != first["call_id"]
    assert shown == ["ok", "repeated", "repeated", "ok"]


def test_a_round_that_learned_nothing_forces_an_answer(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([calls(("peek", {"label": "a"})), calls(("peek", {"label": "a"})), answer("a"),
                               calls(("peek", {"label": 7})), calls(("peek", {"label": 7})), answer("b")])

    async def main():
        agent = await DurableAgentSession.create(store, workspace, binding, tools,
                                                 snap(binding, tools, protocol=protocol.PROTOCOL_V2))
        repeated = await agent.turn("go")
        refused = await agent.turn("again")  # a gate error identical to the last one: nothing new either
        await agent.close()
        return repeated, refused

    repeated, refused = run(main())
    assert (repeated.outcome, repeated.forced, repeated.rounds) == ("answer", "repeat", 3)
    assert (refused.outcome, refused.forced, refused.rounds) == ("answer", "repeat", 3)
    assert binding.rounds[2]["schema"] == binding.rounds[5]["schema"] == ANSWER_ONLY
    assert "nothing new" in binding.rounds[2]["messages"][-1]["content"]
    assert binding.rounds[1]["schema"] != ANSWER_ONLY and binding.rounds[4]["schema"] != ANSWER_ONLY


def test_a_forced_answer_survives_resume_byte_identically(store: MemoryStore, workspace, tools, effects):
    binding = ScriptedBinding([calls(("peek", {"label": "a"})), answer("forced one")])
    later = ScriptedBinding([answer("after resume")])

    async def first():
        agent = await DurableAgentSession.create(store, workspace, binding, tools,
                                                 snap(binding, tools, chain_limit=1))
        result = await agent.turn("go")
        live = [dict(m) for m in agent.agent.messages]
        await agent.close()
        return agent, result, live

    agent, result, live = run(first())
    assert result.forced == "chain_limit"

    async def again():
        resumed = await DurableAgentSession.resume(store, agent.session_id, workspace, later, tools,
                                                   snap(later, tools, chain_limit=1))
        replayed = [dict(m) for m in resumed.agent.messages]
        await resumed.turn("more")
        await resumed.close()
        return replayed

    replayed = run(again())
    assert json.dumps(replayed) == json.dumps(live)  # byte-identical: the forcing note was never history
    events = store.replay(agent.session_id).events
    assert json.dumps(history_messages(agent.snapshot, events[:5])) == json.dumps(live)
    assert later.rounds[0]["messages"][:len(live)] == live
    audits = [e.payload for e in events if e.kind == "audit"]
    assert audits[0]["forced"] == "chain_limit" and "forced" not in audits[1]

