"""The command line imports a command's code only when that command runs, and its `--help` stays complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer

from emelex_memory import MemoryStore
from emelex_workers.cli import app
from emelex_workers.cli.common import LazyGroup, load_command
from emelex_workers.settings import WorkerSettings

PROBE = """
import json, sys
from emelex_workers.cli import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write("MODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _modules_after(home: Path, *args: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env["EMELEX_HOME"] = str(home)
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=120)
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def test_help_imports_no_storage_plugin_or_command_code(tmp_path: Path) -> None:
    loaded = _modules_after(tmp_path / "home", "--help")
    ours = {m for m in loaded if m.startswith(("emelex_memory", "emelex_workers", "emelex_llamacpp"))}
    assert ours == {"emelex_workers", "emelex_workers.cli", "emelex_workers.cli.common"}
    assert "pydantic" not in loaded


def test_an_idle_worker_imports_only_its_own_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    MemoryStore.open(WorkerSettings(home=home)).close()
    loaded = _modules_after(home, "memory", "work")
    commands = {m for m in loaded if m.startswith("emelex_workers.cli.")}
    assert commands == {"emelex_workers.cli.common", "emelex_workers.cli.memory", "emelex_workers.cli.work",
                        "emelex_workers.cli.work_display"}
    for unused in ("emelex_workers.host.manager", "emelex_workers.models", "emelex_workers.worker.planning",
                   "emelex_workers.faithfulness.guards", "emelex_llamacpp", "llama_cpp", "rich"):
        assert unused not in loaded, unused


def test_an_idle_worker_builds_only_the_queue_services(tmp_path: Path) -> None:
    home = tmp_path / "home"
    MemoryStore.open(WorkerSettings(home=home)).close()
    loaded = _modules_after(home, "memory", "work")
    assert {"emelex_memory.store", "emelex_memory.queue.service", "emelex_memory.queue.status"} <= loaded
    features = ("compaction", "knowledge", "maintenance", "snapshots")
    assert {m for m in loaded if m.startswith(tuple(f"emelex_memory.{f}." for f in features))} == set()
    unused = ("sessions.service", "sessions.leases", "sessions.transcript", "sessions.workspace_admin",
              "assets.service", "assets.catalog", "queue.runner", "queue.renewal")
    assert {f"emelex_memory.{m}" for m in unused} & loaded == set()


def _lazy_groups(group: LazyGroup, path: str):
    yield path, group
    for name in group.lazy_commands:
        command = load_command(name, group.lazy_commands[name].target)
        if isinstance(command, LazyGroup):
            yield from _lazy_groups(command, f"{path} {name}")


def test_every_lazy_listing_says_what_its_command_says() -> None:
    root = typer.main.get_command(app)
    checked = 0
    for path, group in _lazy_groups(root, "emelex"):
        for name, lazy in group.lazy_commands.items():
            real = load_command(name, lazy.target)
            stand_in = group.command_summary(None, name) if name not in group.commands else None
            assert stand_in is not None, f"{path} {name} was loaded by listing"
            for limit in (30, 45, 60, 80, 200):
                assert stand_in.get_short_help_str(limit) == real.get_short_help_str(limit), f"{path} {name}"
            checked += 1
    assert checked >= 14


def test_a_lazy_group_runs_and_lists_its_commands() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["memory", "jobs", "--help"], env={"EMELEX_HOME": "/nonexistent-home"})
    assert result.exit_code == 0
    for command in ("list", "failed", "retry", "cancel", "rescue"):
        assert f"\n  {command} " in result.output


def test_search_help_imports_no_store(tmp_path: Path) -> None:
    loaded = _modules_after(tmp_path / "home", "memory", "search", "--help")
    assert "emelex_workers.cli.search" in loaded
    store_chain = ("emelex_memory.store", "emelex_memory.core.database", "emelex_memory.search",
                   "emelex_memory.knowledge", "emelex_memory.sessions")
    assert {m for m in loaded if m.startswith(store_chain)} == set()
