"""What every `emelex` command does alike: plain help with placeholders, usage errors as one line and exit 2,
`--version`, `--json` with an outcome (and errors as JSON on stderr), and a quiet exit when stdout closes early."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support.plugins import fake_model_file

EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
TYPE_NOISE = ("<str>", "<int>", "<float>", "<bool>", "<path>", "TEXT", "INTEGER", "FLOAT", "BOOLEAN", "{")


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def _runner() -> CliRunner:
    """A runner keeping stderr apart from stdout (click before 8.2 mixes them unless told not to)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


def run(*args: str):
    return _runner().invoke(app, list(args))


def _leaves(command, path: tuple[str, ...] = ()):
    """(path, click command) of every command that runs something, depth first (loading lazy subcommands)."""
    if not hasattr(command, "list_commands"):
        yield path, command
        return
    for name in command.list_commands(None):
        yield from _leaves(command.get_command(None, name), (*path, name))


LEAVES = list(_leaves(typer.main.get_command(app)))
# a conversation on stdin and stdout (the chat's, or the MCP protocol's JSON-RPC): no one JSON object to print
INTERACTIVE = {("chat",), ("mcp",)}


def test_there_are_commands_to_check() -> None:
    assert len(LEAVES) >= 29 and ("memory", "sessions", "show") in [p for p, _ in LEAVES]


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=" ".join)
def test_every_command_has_json_and_plain_help_with_placeholders(path: tuple[str, ...]) -> None:
    command = dict(LEAVES)[path]
    has_json = any("--json" in p.opts for p in command.params)
    assert has_json != (path in INTERACTIVE), f"emelex {' '.join(path)} has no --json"
    result = run(*path, "--help")
    assert result.exit_code == 0, result.output
    usage = result.output.splitlines()[0]
    assert usage.startswith(f"Usage: emelex {' '.join(path)} [OPTIONS]")
    assert not [noise for noise in TYPE_NOISE if noise in result.output], result.output
    for param in command.params:
        if param.param_type_name == "argument":
            assert param.metavar and param.metavar.isupper() and param.metavar in usage, (path, param.name)


def test_help_shows_the_placeholders_a_user_types() -> None:
    result = run("memory", "sessions", "show", "--help")
    lines = result.output.splitlines()
    assert lines[0] == "Usage: emelex memory sessions show [OPTIONS] SESSION"
    assert any(line.split()[:1] == ["SESSION"] for line in lines)
    assert any(line.split()[:2] == ["--after", "SEQ"] for line in lines)
    assert any(line.split()[:2] == ["--limit", "N"] for line in lines)


def test_version_is_the_installed_distributions() -> None:
    result = run("--version")
    assert result.exit_code == 0 and result.output == f"emelex {metadata.version('emelex-memory')}\n"


@pytest.mark.parametrize("args, message", [
    (["memory", "sessions", "show"], "error: Missing argument 'SESSION'."),
    (["memory", "sessions", "show", "abcd", "--after", "-1"], "error: Invalid value for '--after': "),
    (["memory", "sessions", "list", "--limit", "0"], "error: Invalid value for '--limit': must be between 1 and"),
    (["memory", "sessions", "list", "--bogus"], "error: No such option: --bogus"),
    (["memory", "jobs", "list", "--state", "weird"], "error: Invalid value for '--state': must be one of pending"),
    (["memory", "compact", "abcd", "--target-ratio", "0.9"], "error: --target-ratio (0.9) must not exceed"),
    (["memory", "work", "--kind", "other"], "error: Invalid value for '--kind': must be one of compaction"),
    (["memory", "jobs", "list", "--kind", "bogus"], "error: Invalid value for '--kind': must be one of "),
    (["memory", "sesions"], "error: No such command 'sesions'."),
])
def test_a_usage_error_is_one_line_naming_the_flag_and_a_hint_with_exit_2(home: Path, args, message) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    error, hint = result.stderr.splitlines()
    assert error.startswith(message) and "after_seq" not in error and "Traceback" not in result.output
    command = args[:-1] if args[-1] == "sesions" else [a for a in args if a.isalpha() and a.islower()][:3]
    assert hint.startswith("try 'emelex ") and hint.endswith(" --help'") and " ".join(command[:2]) in hint
    assert not os.path.lexists(home)  # nothing was created


def test_errors_under_json_are_one_json_object_on_stderr_with_the_same_status(home: Path) -> None:
    missing = run("memory", "knowledge", "show", "key", "--json")  # (every listing on a new Home is an empty list)
    assert missing.exit_code == 1 and missing.stdout == ""
    error = json.loads(missing.stderr)["error"]
    assert error["type"] == "NoStoreError" and error["message"].startswith("no store at ")
    usage = run("memory", "sessions", "list", "--limit", "0", "--json")
    assert usage.exit_code == 2 and usage.stdout == ""
    assert json.loads(usage.stderr) == {"error": {
        "type": "BadParameter", "message": "Invalid value for '--limit': must be between 1 and 10000, got 0"}}
    MemoryStore.open(WorkerSettings()).close()
    unknown = run("memory", "sessions", "show", "no-such-session", "--json")
    assert unknown.exit_code == 1 and json.loads(unknown.stderr)["error"]["type"] == "SessionNotFoundError"
    plain = run("memory", "sessions", "show", "no-such-session")
    assert plain.exit_code == 1 and plain.stderr.startswith("error: no Session 'no-such-session'")


def test_every_command_reports_its_outcome_under_json(home: Path, workspace: Path, tmp_path: Path) -> None:
    fake = fake_model_file(tmp_path / "files")
    w = ["-w", str(workspace)]

    def outcome(*args: str) -> dict:
        result = run(*args, "--json")
        assert result.exit_code == 0, (args, result.output)
        return json.loads(result.stdout)

    assert outcome("models", "install", str(fake), "--name", "fake")["outcome"] == "installed"
    assert outcome("models", "list")["outcome"] == "listed"
    assert outcome("models", "verify", "fake")["outcome"] == "intact"
    assert outcome("plugins", "list")["outcome"] == "listed"
    assert outcome("memory", "knowledge", "remember", "k", "v", *w)["outcome"] == "remembered"
    for args, expected in [(["list"], "listed"), (["show", "k"], "found"), (["history", "k"], "listed"),
                           (["pin", "k"], "pinned"), (["unpin", "k"], "unpinned"), (["forget", "k"], "forgotten")]:
        assert outcome("memory", "knowledge", *args, *w)["outcome"] == expected, args
    with MemoryStore.open(WorkerSettings()) as store:
        image = store.put_asset(b"png " * 8, "image/png")
        sid = store.create_session(workspace).id
        with store.acquire_lease(sid, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "look"}, assets=(image,)), NewEvent("assistant", "ok")])
    assert outcome("memory", "sessions", "list")["outcome"] == "listed"
    assert outcome("memory", "sessions", "show", sid)["outcome"] == "found"
    plan = ["memory", "compact", sid, "--context-window", "1000", "--preserve-turns", "0", "--force"]
    job = outcome(*plan)
    assert job["outcome"] == "queued" and outcome(*plan)["outcome"] == "already-queued"
    assert outcome("memory", "jobs", "list")["outcome"] == "listed"
    assert outcome("memory", "jobs", "cancel", job["job"]["id"])["outcome"] == "cancelled"
    assert outcome("memory", "jobs", "failed")["outcome"] == "listed"
    assert outcome("memory", "jobs", "retry", job["job"]["id"])["outcome"] == "retried"
    assert outcome("memory", "assets", "list")["outcome"] == "listed"
    assert outcome("memory", "assets", "show", image.digest)["outcome"] == "intact"
    assert outcome("memory", "assets", "verify")["outcome"] == "intact"
    workspaces = outcome("memory", "workspaces", "list")
    assert workspaces["outcome"] == "listed"
    wid = str(workspaces["workspaces"][0]["id"])
    assert outcome("memory", "workspaces", "rebind", wid, str(workspace), "--yes")["outcome"] == "unchanged"
    assert outcome("memory", "maintain", "--dry-run")["outcome"] == "dry-run"
    assert outcome("memory", "maintain")["outcome"] == "maintained"
    assert outcome("memory", "doctor")["outcome"] == "healthy"
    assert outcome("memory", "work", "--kind", "distill")["outcome"] == "idle"
    assert outcome("memory", "sessions", "delete", sid, "--yes")["outcome"] == "deleted"
    assert outcome("models", "remove", "fake")["outcome"] == "removed"
    os.remove(home / "memory" / "emelex.sqlite3")
    created = outcome("memory", "reinit", "--yes")
    assert created["outcome"] == "created" and created["database"] == str(home / "memory" / "emelex.sqlite3")


# -- a closed stdout, as real processes ---------------------------------------------------------------------------


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env["EMELEX_HOME"] = str(home)
    return env


def test_a_closed_stdout_ends_quietly_with_status_141(home: Path) -> None:
    MemoryStore.open(WorkerSettings()).close()
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write fails with EPIPE
    try:
        proc = subprocess.run([*EMELEX, "memory", "doctor"], stdout=write, stderr=subprocess.PIPE, text=True,
                              env=_env(home), timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == ""


def test_doctor_piped_into_head_prints_no_error(home: Path) -> None:
    MemoryStore.open(WorkerSettings()).close()
    command = " ".join(f"'{a}'" for a in EMELEX)
    proc = subprocess.run(["sh", "-c", f"{command} memory doctor | head -1"], capture_output=True, text=True,
                          env=_env(home), timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith("home: ")
