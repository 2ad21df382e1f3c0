"""Text that is not valid UTF-8 is a typed error, never a `UnicodeEncodeError` or an apsw error: an ID given on the
command line as raw bytes names nothing, and a workspace directory whose name is not UTF-8 cannot be stored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    InvalidInputError,
    InvalidKnowledgeError,
    JobNotFoundError,
    KnowledgeSource,
    MemoryStore,
    SessionNotFoundError,
    Settings,
)
from emelex_workers.cli import app

from ..support import table_rows

RAW = os.fsdecode(b"\xff")  # what Python makes of the argument $'\xff': a lone surrogate


@pytest.mark.parametrize("args", [
    ["sessions", "show", RAW],
    ["sessions", "delete", RAW, "--yes"],
    ["jobs", "retry", RAW],
    ["jobs", "cancel", RAW],
    ["compact", RAW, "--context-window", "4096"],
], ids=lambda a: " ".join(x for x in a[:2] if x != RAW))
def test_a_non_utf8_id_on_the_command_line_names_nothing(
    home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(Settings()) as store:
        store.create_session(workspace)
    before = table_rows(Settings().database_path)
    result = CliRunner().invoke(app, ["memory", *args])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: no ") and "list them with" in result.output
    assert table_rows(Settings().database_path) == before


def test_non_utf8_ids_and_text_are_typed_errors_in_the_library(store: MemoryStore, workspace: Path,
                                                               db_path: Path) -> None:
    before = table_rows(db_path)
    for call in (store.get_session, store.replay, store.delete_session, store.queue_distillation,
                 lambda sid: store.acquire_lease(sid, workspace)):
        with pytest.raises(SessionNotFoundError):
            call(RAW)
    for call in (store.get_job, store.cancel_job, store.retry_failed_job):
        with pytest.raises(JobNotFoundError):
            call(RAW)
    for kwargs in ({"kind": RAW}, {"session_id": RAW}):
        with pytest.raises(InvalidInputError, match="not valid UTF-8"):
            store.list_jobs(**kwargs)
    with pytest.raises(InvalidInputError, match="title .* not valid UTF-8"):
        store.create_session(workspace, title=RAW)
    with pytest.raises(InvalidKnowledgeError):
        store.remember(workspace, "k", "v", source=KnowledgeSource(RAW, 1, 1, "0" * 64))
    assert table_rows(db_path) == before


@pytest.mark.parametrize("spelling", ["text", "bytes"])
def test_a_workspace_whose_name_is_not_utf8_is_refused_and_nothing_is_written(
    store: MemoryStore, tmp_path: Path, db_path: Path, spelling: str
) -> None:
    raw = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(raw)
    path = raw if spelling == "bytes" else os.fsdecode(raw)
    before = table_rows(db_path)
    for call in (store.create_session, lambda p: store.remember(p, "k", "v"), store.recall):
        with pytest.raises(InvalidInputError, match="not valid UTF-8.*rename the directory") as caught:
            call(path)
        assert "\n" not in str(caught.value)
    assert table_rows(db_path) == before


def test_a_workspace_given_as_bytes_is_the_same_workspace_as_its_text(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(os.fsencode(workspace))
    assert session.workspace.path == str(workspace) and store.create_session(workspace).workspace_id == 1
