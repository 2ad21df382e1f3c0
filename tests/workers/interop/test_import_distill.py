"""Imported Sessions are distilled like a closed chat: `emelex memory work` on the embedded default model runs the
distillation jobs the import queued and stores Knowledge whose provenance cites the imported Session's events."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, Settings
from emelex_workers.cli import app
from emelex_workers.models import ModelManager

from ...support.models import require_default_model
from .test_import import history

require_default_model()
runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_PLUGINS_AUTOLOAD", "0")
    with ModelManager(Settings()) as manager:
        manager.install_default(link=True)
    return home


def test_memory_work_distills_imported_sessions(tmp_path: Path, workspace: Path) -> None:
    sessions = set()
    for name in ("claude-code.jsonl", "codex.jsonl", "generic.jsonl"):
        result = runner.invoke(app, ["memory", "import", str(history(tmp_path, name, workspace))])
        assert result.exit_code == 0, result.output
    with MemoryStore.open(Settings()) as store:
        sessions = {s.id for s in store.list_sessions().sessions}
        assert len(store.list_jobs(kind="distill").jobs) == 3
    worked = runner.invoke(app, ["memory", "work"])
    assert worked.exit_code == 0, worked.output
    with MemoryStore.open(Settings()) as store:
        jobs = store.list_jobs(kind="distill").jobs
        entries = store.recall(workspace).entries
    assert [j.state for j in jobs] == ["done"] * 3, [j.diagnostics for j in jobs]
    assert entries, "the default model's distillation kept nothing from three imported conversations"
    assert {e.head.source.session_id for e in entries} <= sessions
    assert all(e.head.origin == "distillation" for e in entries)
