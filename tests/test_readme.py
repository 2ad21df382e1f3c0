"""README.md as a newcomer uses it: the library tour runs as written and shows a Summary, the commands it gives for
the demo store exist, and figures and contracts live in the project's own files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_workers.settings import WorkerSettings
from emelex_workers.cli import app
from emelex_workers.models import ModelManager

from .support.plugins import fake_model_file, fake_plugin_distribution
from .workers.worker.test_work import FAKE_SETTINGS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))


def section(title: str) -> str:
    """The README text from the heading `## {title}` to the next `## ` heading."""
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:] if end < 0 else README[start:end]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_tour_runs_as_written_and_shows_a_summary(tmp_path: Path, home: Path) -> None:
    (tour,) = code_blocks(section("A tour of the library"), "python")
    site = fake_plugin_distribution(tmp_path / "site")  # a scripted model binding, summarizer and distiller
    with ModelManager(WorkerSettings(home=home)) as manager:
        manager.install(fake_model_file(tmp_path / "files"), name="fake")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env.update(FAKE_SETTINGS, EMELEX_HOME=str(home), TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", tour], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("emelex work: 2 job(s) in ") and lines[0].endswith("(2 done); stopped: empty")
    assert lines[1].startswith("summary -> Summary of ") and "what does this plot show?" in lines[1]
    assert lines[2:] and all(line.startswith("knowledge: fact-") for line in lines[2:])


def test_the_demo_store_commands_exist(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    text = section("After `make demo`: look at the demo store")
    assert "export EMELEX_HOME=$PWD/.demo/home" in text
    (block,) = code_blocks(text, "sh")
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.startswith(".venv/bin/emelex ")]
    assert len(commands) >= 5
    for words in commands:
        path = [w for w in words[1:] if w.islower() and w.isalpha()]
        result = CliRunner().invoke(app, [*path, "--help"])
        assert result.exit_code == 0 and result.output.startswith(f"Usage: emelex {' '.join(path)} "), words


def test_the_command_line_section_links_the_generated_reference() -> None:
    text = section("Command line")
    assert "(docs/cli.md)" in text and (ROOT / "docs" / "cli.md").is_file()
    assert "```" not in text  # the commands are listed in docs/cli.md, generated, not here by hand


def test_readme_and_docs_point_only_into_the_project() -> None:
    for path in [ROOT / "README.md", *DOCS]:
        assert "../shared" not in path.read_text(), path.name


def test_every_figure_is_in_the_results_file_the_docs_link_to() -> None:
    results = ROOT / "benchmarks" / "RESULTS.md"
    assert results.is_file()
    assert "(benchmarks/RESULTS.md)" in section("Benchmarks")
    assert "| benchmark | ratio |" not in README
    for name in ("assets.md", "queues.md", "scheduling.md"):
        text = (ROOT / "docs" / name).read_text()
        assert "(../benchmarks/RESULTS.md#" in text, name
        assert not re.search(r"\d+(\.\d+)? ?(ms|MiB/s|jobs/s)\b", text), name  # measured figures stay there
        assert not re.search(r"\bon \d{4}-\d\d-\d\d\b", text), name  # nor figures copied by hand on a date
