"""docs/plugins.md, "Your first plugin", followed command by command: a plugin package made from the template in a
temporary folder, installed by its entry point into a fresh virtual environment, run by `emelex memory work`
without an installed model, and named by the provenance of what it wrote. Every `$` line of the section's console
blocks runs; every line shown under it must appear in what it printed ("..." stands for anything)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_workers.settings import WorkerSettings

DOCS = Path(__file__).parents[3] / "docs" / "plugins.md"
CLI = ["-c", "from emelex_workers.cli import main; main()"]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]


def _section() -> str:
    text = DOCS.read_text()
    start = text.index("## Your first plugin")
    return text[start:text.index("\n## ", start + 5)]


def _steps(section: str) -> list[tuple[str, list[str]]]:
    """(command, the lines the page shows under it) for every `$` line of the console blocks, in order."""
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line.strip():
                steps[-1][1].append(line)
    return steps


def _fresh_venv(root: Path) -> Path:
    """A new virtual environment whose own site-packages hold setuptools (to build the plugin without build
    isolation) and which sees this project's environment (Emelex, pytest) through a .pth file; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    wheels = root / "wheels"
    subprocess.run([*PIP, "download", "-q", "--no-deps", "-d", str(wheels), "setuptools>=64"], check=True,
                   timeout=300)
    subprocess.run([*PIP, "--python", str(python), "install", "-q", "--no-deps", "--no-index", "--find-links",
                    str(wheels), "setuptools"], check=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(site, "emelex-project.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


@pytest.mark.timeout(900)
def test_the_walkthrough_works_as_written(tmp_path: Path) -> None:
    section = _section()
    chat = re.search(r"`chat.jsonl`:\n\n```json\n(.*?)```", section, re.S).group(1)
    python = _fresh_venv(tmp_path)
    home, cwd = tmp_path / "home", tmp_path / "work"
    cwd.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_") and k != "PYTHONPATH"}
    base["EMELEX_HOME"] = str(home)
    steps = _steps(section)
    assert [c.split()[0] for c, _ in steps][:4] == ["emelex", "cd", "python", "pip"]
    for command, shown in steps:
        words, env = shlex.split(command), dict(base)
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if "SESSION" in words:
            with MemoryStore.open(WorkerSettings(home=home), create=False) as store:
                words[words.index("SESSION")] = store.list_sessions().sessions[0].id
        if words[0] == "cd":
            cwd = cwd / words[1]
            continue
        if "chat.jsonl" in words:
            (cwd / "chat.jsonl").write_text(chat)
        if words[0] == "emelex":
            argv = [str(python), *CLI, *words[1:]]
        elif words[0] == "python":
            argv = [str(python), *words[1:]]
        else:
            assert words[:2] == ["pip", "install"], command
            argv = [*PIP, "--python", str(python), "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", *words[2:]]
        out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        printed = out.stdout + out.stderr
        assert out.returncode == 0, f"$ {command}\n{printed}"
        assert "Traceback" not in printed, printed
        for line in shown:
            pattern = ".*".join(re.escape(part) for part in line.split("..."))
            assert re.search(pattern, printed), f"$ {command}: {line!r} not in\n{printed}"
    installed = subprocess.run([str(python), "-c", "import emelex_notes, sys; print(emelex_notes.__file__)"],
                               capture_output=True, text=True, cwd=tmp_path, env=base)
    assert "venv" in installed.stdout, installed  # the plugin came from the fresh environment, by its entry point
    with MemoryStore.open(WorkerSettings(home=home), create=False) as store:
        jobs = store.list_jobs().jobs
        assert {j.kind: j.state for j in jobs} == {"compaction": "done", "distill": "done"}
        producers = {j.kind: j.result["producer"] for j in jobs}
    assert producers["compaction"] == {"plugin": "notes", "distribution": "emelex-notes", "version": "0.1.0",
                                       "kind": "summarizer", "name": "notes", "mode": "extractive"}
    assert producers["distill"] == {**producers["compaction"], "kind": "distiller"}
