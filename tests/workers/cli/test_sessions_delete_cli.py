"""`emelex memory sessions delete`: its question goes to stderr (so `--json` prints one JSON object on stdout), an
answer that is neither yes nor no is asked again, saying what to type, and declining deletes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support import table_rows


@pytest.fixture
def sid(monkeypatch: pytest.MonkeyPatch, home: Path, workspace: Path) -> str:
    """A Session of one turn in the store of `home`, which the CLI uses."""
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(WorkerSettings()) as store:
        session = store.create_session(workspace, title="doomed")
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "hello"})])
            lease.release()
    return session.id


def _delete(*args: str, answers: str):
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click 8.2 keeps stderr apart by default
        runner = CliRunner()
    return runner.invoke(app, ["memory", "sessions", "delete", *args], input=answers)


def test_the_question_goes_to_stderr_so_the_json_stays_whole(sid: str) -> None:
    done = _delete(sid, "--json", answers="y\n")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "deleted"
    assert f"Delete Session {sid}" in done.stderr and "Delete" not in done.stdout


def test_an_answer_that_is_neither_yes_nor_no_is_asked_again_saying_what_to_type(sid: str) -> None:
    done = _delete(sid, answers="maybe\ny\n")
    assert done.exit_code == 0, done.stderr
    assert "invalid input" not in done.stderr
    assert "answer y to delete Session" in done.stderr and done.stderr.count(f"Delete Session {sid}") == 2
    assert f"deleted Session {sid}" in done.stdout


@pytest.mark.parametrize("answers", ["n\n", "\n", "", "what\n"])  # no, the default, end of input, no valid answer
def test_declining_deletes_nothing(sid: str, home: Path, answers: str) -> None:
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    declined = _delete(sid, "--json", answers=answers)
    assert declined.exit_code == 1 and declined.stdout == ""
    error = {"error": {"type": "Aborted", "message": "not confirmed; nothing was deleted"}}
    assert declined.stderr.endswith(json.dumps(error) + "\n")  # after the question (the terminal echoes the answer)
    assert table_rows(db) == before
