"""`emelex memory search`: hits name what `sessions show` and `knowledge show` take; a deleted Session's words are
never found again; a bad query is one error line."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent, Settings
from emelex_workers.cli import app


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, home: Path, workspace: Path):
    """Run `emelex ARGS` in `workspace` on the store of `home`."""
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.chdir(workspace)
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click 8.2 keeps stderr apart by default
        runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def say(workspace: Path, user: str, answer: str) -> str:
    with MemoryStore.open(Settings()) as store:
        sid = store.create_session(workspace).id
        with store.acquire_lease(sid, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": user}), NewEvent("assistant", {"text": answer})])
            lease.release()
    return sid


def test_hits_lead_to_sessions_show_and_knowledge_show(cli, workspace: Path) -> None:
    sid = say(workspace, "where does the flamingo config live", "in etc")
    assert cli("memory", "knowledge", "remember", "flamingo.config", "the flamingo config is in etc").exit_code == 0
    done = cli("memory", "search", "flamingo")
    assert done.exit_code == 0, done.stderr
    lines = sorted(done.stdout.splitlines())  # one ranking: either kind may come first
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    assert lines[0].split()[:4] == ["knowledge", "flamingo.config", "v1", today]
    assert lines[1].split()[:4] == ["session", sid[:8], today, "#1"]
    assert "[flamingo]" in lines[1]
    assert sid in cli("memory", "sessions", "show", lines[1].split()[1]).stdout
    assert "flamingo config is in etc" in cli("memory", "knowledge", "show", lines[0].split()[1]).stdout
    as_json = json.loads(cli("memory", "search", "flamingo", "--sessions", "--json").stdout)
    assert [(h["kind"], h["session"], h["seq"], h["turn"]) for h in as_json["hits"]] == [("sessions", sid, 1, 1)]
    assert [h["key"] for h in json.loads(cli("memory", "search", "flamingo", "--knowledge", "--json").stdout)["hits"]] \
        == ["flamingo.config"]


def test_a_deleted_sessions_words_are_never_found_again(cli, workspace: Path) -> None:
    sid = say(workspace, "the vault code is ultraviolet", "noted")
    assert cli("memory", "search", "ultraviolet", "--json").stdout.count(sid) == 1
    assert cli("memory", "sessions", "delete", sid, "--yes").exit_code == 0
    done = cli("memory", "search", "ultraviolet", "--json")
    assert done.exit_code == 0 and json.loads(done.stdout)["hits"] == []
    assert cli("memory", "search", "ultraviolet").stdout.strip() == "nothing found in this workspace"


@pytest.mark.parametrize("query", ["", '"((*', "x" * 5000, "\udcff\udcfe"])
def test_a_bad_query_is_one_error_line_and_exit_1(cli, workspace: Path, query: str) -> None:
    say(workspace, "hello", "hi")
    done = cli("memory", "search", query)
    assert done.exit_code == 1
    assert done.stderr.startswith("error: the search query") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr + done.stdout


def test_several_words_are_one_query_finding_any_of_them(cli, workspace: Path) -> None:
    port = say(workspace, "the proxy listens on port 8443", "ok")
    other = say(workspace, "tls 8443 only", "ok")
    done = cli("memory", "search", "port", "8443", "--sessions", "--json")
    assert done.exit_code == 0, done.stderr
    assert {h["session"] for h in json.loads(done.stdout)["hits"]} == {port, other}


def test_more_than_32_distinct_words_is_refused_not_cut(cli, workspace: Path) -> None:
    say(workspace, "w33 is the last word", "ok")
    words = [f"w{i}" for i in range(1, 34)]
    done = cli("memory", "search", *words)
    assert done.exit_code == 1 and done.stdout == ""
    assert done.stderr.startswith("error: the search query has 33 distinct words; at most 32") \
        and done.stderr.count("\n") == 1, done.stderr
    assert cli("memory", "search", *words[:31], "w33", "w33").exit_code == 0  # repeated words count once


def test_knowledge_and_sessions_together_is_a_usage_error(cli, workspace: Path) -> None:
    say(workspace, "hello", "hi")
    assert cli("memory", "search", "hello", "--knowledge", "--sessions").exit_code == 2


def test_a_key_with_a_space_is_printed_quoted_so_it_can_be_pasted(cli, workspace: Path) -> None:
    import shlex

    assert cli("memory", "knowledge", "remember", "door code", "the pelican door code is 4711").exit_code == 0
    line = cli("memory", "search", "pelican").stdout.splitlines()[0]
    assert line.startswith("knowledge  'door code'  v1  ")
    key = shlex.split(line)[1]
    assert "4711" in cli("memory", "knowledge", "show", key).stdout


def test_context_shows_a_hits_neighbouring_turns(cli, workspace: Path) -> None:
    with MemoryStore.open(Settings()) as store:
        sid = store.create_session(workspace).id
        with store.acquire_lease(sid, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "what are you reading these days?"}),
                               NewEvent("assistant", {"text": "The Lean Startup, it is great"})])
            lease.append_turn([NewEvent("user", {"text": "and after it?"}), NewEvent("assistant", {"text": "Dune"})])
            lease.release()
    done = cli("memory", "search", "Lean", "Startup", "--sessions", "--context", "1")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["session", sid[:8], dt.datetime.now(dt.timezone.utc).date().isoformat(), "#2"]
    assert lines[1:3] == ["    #1 user: what are you reading these days?", "    #3 user: and after it?"]
    as_json = json.loads(cli("memory", "search", "Lean", "--context", "1", "--json").stdout)
    assert as_json["hits"][0]["context"] == [{"seq": 1, "kind": "user", "text": "what are you reading these days?"},
                                             {"seq": 3, "kind": "user", "text": "and after it?"}]
    assert cli("memory", "search", "Lean", "--context", "11").exit_code == 2
