"""The rule-made records of tool rounds and failed turns: what a Summary may say about the agent's machinery, and
that the Summary guard counts them as source text under their own speakers."""

from __future__ import annotations

from pathlib import Path

from emelex_memory import MemoryStore, NewEvent
from emelex_workers import faithfulness as fx
from emelex_workers.faithfulness import guards


def call(tool: str, **arguments) -> dict:
    return {"call_id": "c1", "tool": tool, "arguments": arguments}


def result(outcome: str, output: str) -> dict:
    return {"call_id": "c1", "tool": "t", "outcome": outcome, "output": output}


def test_a_call_record_names_the_tool_its_arguments_and_the_outcome() -> None:
    assert fx.call_record(call("read_file", path="config.toml"), result("ok", "[server]\nport = 8080\n")) == (
        "read_file `config.toml`: ok, `[server]`.")
    assert fx.call_record(call("write_file", path="a.txt", content="x\ny"), result("ok", "wrote 3 bytes to a.txt")) == (
        "write_file content=`x y` path=`a.txt`: ok, `wrote 3 bytes to a.txt`.")
    assert fx.call_record(call("run_command", command="ls"), result("denied", "the user denied this call")) == (
        "run_command `ls`: denied.")
    assert fx.call_record(call("effect", label="a"), result("not_executed", "not executed")) == (
        "effect `a`: not executed.")
    assert fx.call_record(call("effect", label="a"), result("unknown_effect", "it may have run")) == (
        "effect `a`: unknown effect.")
    assert fx.call_record(call("effect", label="a"), None) == "effect `a`: no result."


def test_an_error_record_quotes_the_failure_without_the_tool_prefix_and_long_values_are_cut() -> None:
    failed = result("error", "tool 'read_file' failed: WorkspacePathError: path 'x.py' does not exist in the workspace")
    assert fx.call_record(call("read_file", path="x.py"), failed) == (
        "read_file `x.py`: error, `WorkspacePathError: path 'x.py' does not exist in the workspace`.")
    long = call("search_text", text="a `tick` and " + "y" * 60, path=".")
    assert fx.call_record(long, result("ok", "\n\n" + "z" * 50)) == (
        "search_text path=`.` text=`a 'tick' and yyyyyyyyyyyyyyyyyyyyyyyy...`: ok, "
        "`zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...`.")
    assert fx.call_record(call("t", n=3, flags=[1, 2], empty=""), result("ok", "")) == (
        't empty="" flags=`[1,2]` n=`3`: ok.')
    assert len(fx.sentences(fx.call_record(long, result("ok", "a. B! c? d")))) == 1  # a record is one sentence


def test_the_summary_guard_counts_records_as_source_text_under_their_speakers(store: MemoryStore,
                                                                              workspace: Path) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        lease.append_turn([
            NewEvent("user", {"text": "What port does config.toml set?"}),
            NewEvent("tool_calls", {"round": 1, "calls": [call("read_file", path="config.toml")]}),
            NewEvent("tool_result", result("ok", "[server]\nport = 8080")),
            NewEvent("turn_failed", {"reason": "error",
                                     "diagnostic": "the model asked for more than 4 tool rounds in one turn"}),
        ])
        lease.release()
    events = store.replay(session.id).events
    summary = ("user: What port does config.toml set?\ntool: read_file `config.toml`: ok, `[server]`.\n"
               "system: The turn ended without an answer (error): `the model asked for more than 4 tool rounds in "
               "one turn`.")
    check = fx.check_summary(summary, sources=guards.source_texts(events), speakers=guards.speaker_texts(events))
    assert (check.text, check.problem, check.relabelled) == (summary, None, 0)
    invented = "tool: read_file `config.toml`: ok, `port = 9090`."
    check = fx.check_summary(invented, sources=guards.source_texts(events), speakers=guards.speaker_texts(events))
    assert check.invented + check.unsupported == 1 and check.problem is not None
