"""`emelex models bench NAME`: tokens per second at 1..N threads on the default model, and careless input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_workers.settings import WorkerSettings
from emelex_workers.cli import app
from emelex_workers.models import ModelManager
from tests.support.models import require_default_model

require_default_model()


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch, home: Path) -> str:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with ModelManager(WorkerSettings(home=home)) as manager:
        return manager.ensure_default(link=True)[0].name


def test_bench_measures_each_thread_count_and_says_the_choice(installed: str) -> None:
    result = CliRunner().invoke(app, ["models", "bench", installed, "--max-threads", "2", "--prompt-tokens", "16",
                                      "--tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [row["threads"] for row in data["rows"]] == [1, 2]
    assert all(row["prompt_tps"] > 0 and row["generate_tps"] > 0 for row in data["rows"])
    assert data["fastest"] in (1, 2) and data["model_threads"]["source"] == "chosen"
    text = CliRunner().invoke(app, ["models", "bench", installed, "--max-threads", "1", "--prompt-tokens", "16",
                                    "--tokens", "2"])
    assert text.exit_code == 0 and text.stdout.splitlines()[-1].startswith("fastest now: 1 thread; model threads: ")


def test_careless_input_is_one_typed_line(installed: str) -> None:
    unknown = CliRunner().invoke(app, ["models", "bench", "no-such-model"])
    assert unknown.exit_code == 1
    assert unknown.output.startswith("error: no model 'no-such-model' is installed under ")
    assert len(unknown.output.splitlines()) == 1
    for option in ("--max-threads", "--tokens", "--prompt-tokens"):
        usage = CliRunner().invoke(app, ["models", "bench", installed, option, "0"])
        assert usage.exit_code == 2 and usage.output.startswith(f"error: Invalid value for '{option}': ")
