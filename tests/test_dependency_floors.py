"""The declared dependency floors are true: every floor in pyproject.toml is pinned in constraints-min.txt, and a
fresh virtual environment built at exactly those pins (without the llama extra, which compiles llama.cpp)
imports Emelex without a warning and passes a representative part of the suite (core, plugins, worker retries,
CLI; no model needed).

The environment comes from the package index through pip and pip's cache, so building it needs the index; it
is skipped, saying so, only when the index cannot be reached. It is kept in `.venv/floors-<key>` and rebuilt
only when pyproject.toml or constraints-min.txt change.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints-min.txt"
BUILT_MARKER = "emelex-floors-built"
NOT_INSTALLED = {"llama-cpp-python"}  # the llama extra: a source build, far too slow for the suite
# Extras kept out of the floor environment altogether (neither floored nor installed there): the MCP SDK pins its
# major version (`>=X,<N`), and its dependencies (starlette, uvicorn, ...) have no place in a floor check of the core.
UNFLOORED_EXTRAS = {"mcp", "compare"}  # compare: the other agents' stores bench_recall.py measures
# A part of the suite that exercises every dependency: apsw (leases, compaction), hypothesis (the policy's
# properties), tenacity (in-process retries), pluggy (plugins), pydantic-settings and typer (the CLI).
FLOOR_TESTS = (
    "tests/sessions/test_leases.py",
    "tests/compaction/test_compaction.py",
    "tests/compaction/test_compaction_policy.py",
    "tests/queue/test_jobs_worker.py",
    "tests/workers/host/test_plugins.py",
    "tests/workers/cli/test_cli_memory.py",
)
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Name or service not known|Temporary failure in name "
    r"resolution|Network is unreachable|Connection refused|ConnectTimeout|timed out|Max retries exceeded"
)


def _floors() -> dict[str, Version]:
    """Every requirement of pyproject.toml (dependencies and extras) -> its floor; each must be exactly `>=X`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for name, extra in project["optional-dependencies"].items():
        if name not in UNFLOORED_EXTRAS:
            requirements += extra
    floors = {}
    for text in requirements:
        req = Requirement(text)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == ">=", f"{text}: declare exactly one floor, `>=X`"
        floors[canonicalize_name(req.name)] = Version(specs[0].version)
    return floors


def _pins() -> dict[str, Version]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_floor_is_pinned_in_the_constraints() -> None:
    assert _pins() == _floors()


def test_the_unfloored_extras_pin_their_major_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for name in UNFLOORED_EXTRAS:
        for text in project["optional-dependencies"][name]:
            ops = {spec.operator for spec in Requirement(text).specifier}
            assert ops == {">=", "<"}, f"{text}: an unfloored extra declares a floor and the next major (`>=X,<N`)"


def _run(args: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def _floor_env(tmp_path: Path, pins: dict[str, Version]) -> str:
    """The Python of a virtual environment at the pinned floors, with Emelex installed editable.

    Kept in `.venv/floors-<key>` (key: the pyproject and constraints contents) so later runs reuse it; it counts
    as built only once its versions were checked and its marker written, and other keys' environments go.
    """
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + CONSTRAINTS.read_bytes()).hexdigest()[:16]
    env_dir = ROOT / ".venv" / f"floors-{key}"
    python = str(env_dir / "bin" / "python")
    if (env_dir / BUILT_MARKER).exists():
        return python
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "1", "--timeout", "20",
         "--dest", str(tmp_path / "probe"), f"apsw=={pins['apsw']}"],
        capture_output=True, text=True, timeout=300,
    )
    if probe.returncode != 0 and _UNREACHABLE.search(probe.stdout + probe.stderr):
        pytest.skip("the package index is unreachable, so the dependency floors were not checked: "
                    + (probe.stderr.strip().splitlines() or ["no output"])[-1])
    assert probe.returncode == 0, probe.stdout + probe.stderr
    for old in env_dir.parent.glob("floors-*"):
        shutil.rmtree(old)
    _run([sys.executable, "-m", "venv", str(env_dir)], "creating the virtual environment")
    _run([python, "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS), "-e", f"{ROOT}[dev]"],
         "installing Emelex at its dependency floors")
    names = sorted(pins)
    versions = json.loads(_run([python, "-c", (
        "import importlib.metadata as m, json, sys\n"
        "def version(name):\n"
        "    try:\n"
        "        return m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({n: version(n) for n in sys.argv[1:]}))"
    ), *names], "reading the installed versions").stdout)
    expected = {name: None if name in NOT_INSTALLED else pins[name] for name in names}
    assert {n: v and Version(v) for n, v in versions.items()} == expected
    (env_dir / BUILT_MARKER).write_text(json.dumps(versions))
    return python


def test_the_suite_passes_at_the_dependency_floors(tmp_path: Path) -> None:
    python = _floor_env(tmp_path, _pins())
    _run([python, "-W", "error", "-c",
          "import emelex_memory, emelex_workers.cli, emelex_workers.host.manager, emelex_llamacpp.plugin; "
          "emelex_memory.Settings(home='/nonexistent/unused')"],
         "importing Emelex with warnings as errors")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FLOOR_TESTS],
         "the suite at the dependency floors", cwd=ROOT, env=env)
