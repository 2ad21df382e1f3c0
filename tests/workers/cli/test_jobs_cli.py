"""`emelex memory jobs list|failed|retry|cancel` and `emelex memory compact` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.job_kinds import builtin_kinds
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support import kinds_fixture, table_rows

runner = CliRunner()
KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def mem(*args: str):
    return runner.invoke(app, ["memory", *args])


def _seed(workspace: Path, turns: int = 10) -> str:
    with MemoryStore.open(WorkerSettings(), kinds=KINDS) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            for i in range(turns):
                lease.append_turn([NewEvent("user", {"text": f"question {i} " + "x" * 380}),
                                   NewEvent("assistant", {"text": f"answer {i} " + "y" * 380})])
            lease.release()
    return session.id


def test_compact_queues_a_job_and_says_why_when_it_does_not(workspace: Path, home: Path) -> None:
    sid = _seed(workspace)  # ten turns of about 200 estimated tokens each
    calm = mem("compact", sid, "--context-window", "100000")
    assert calm.exit_code == 0 and calm.output.startswith("nothing queued: history uses") and "trigger" in calm.output
    queued = mem("compact", sid, "--context-window", "2000")
    assert queued.exit_code == 0 and queued.output.startswith("queued compaction job "), queued.output
    again = mem("compact", sid, "--context-window", "2000", "--json")
    data = json.loads(again.output)
    assert not data["created"] and data["job"]["kind"] == "compaction" and data["plan"]["compact_turns"] >= 1
    forced = mem("compact", sid, "--context-window", "100000", "--force", "--json")
    assert json.loads(forced.output)["job"]["id"] == data["job"]["id"]  # one active compaction per Session
    listed = mem("jobs", "list")
    assert listed.exit_code == 0 and data["job"]["id"] in listed.output and "pending" in listed.output
    with MemoryStore.open(WorkerSettings(), kinds=KINDS) as store:
        assert store.get_session(sid).last_seq == 20  # planning never writes a Summary


def test_compact_refuses_bad_input_with_one_line(workspace: Path, home: Path) -> None:
    sid = _seed(workspace, turns=1)
    before = table_rows(home / "memory" / "emelex.sqlite3")
    missing = mem("compact", "no-such-session", "--context-window", "100")
    assert missing.exit_code == 1 and missing.output.startswith("error: no Session")
    assert mem("compact", sid, "--context-window", "0").exit_code != 0
    assert table_rows(home / "memory" / "emelex.sqlite3") == before


def test_failed_retry_and_cancel(workspace: Path, home: Path) -> None:
    sid = _seed(workspace, turns=1)
    with MemoryStore.open(WorkerSettings(), kinds=KINDS) as store:
        broken = store.enqueue_job("noop", sid, {"n": 1}).job
        store.claim_job("noop").fail("model exploded\nwith a traceback", permanent=True)
        waiting = store.enqueue_job("noop", sid, {"n": 2}).job
    failed = mem("jobs", "failed")
    assert failed.exit_code == 0 and broken.id in failed.output and "model exploded with a traceback" in failed.output
    assert f"{broken.id}  noop         failed    attempt 1 of 3  Session " in failed.output
    assert "permanent attempt 1 of 3  model exploded" in failed.output  # one wording of attempts everywhere
    assert waiting.id not in failed.output
    data = json.loads(mem("jobs", "failed", "--json").output)
    assert [j["id"] for j in data["jobs"]] == [broken.id] and data["jobs"][0]["diagnostics"][0]["event"] == "permanent"

    retried = mem("jobs", "retry", broken.id)
    assert retried.exit_code == 0 and "pending again" in retried.output
    cancelled = mem("jobs", "cancel", waiting.id)
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    assert f"{broken.id}  noop         pending   attempt 1 of 3 due " in mem("jobs", "list").output
    states = {j["id"]: (j["state"], j["attempts"]) for j in json.loads(mem("jobs", "list", "--json").output)["jobs"]}
    assert states == {broken.id: ("pending", 0), waiting.id: ("cancelled", 0)}

    before = table_rows(home / "memory" / "emelex.sqlite3")
    again = mem("jobs", "cancel", waiting.id)
    assert again.exit_code == 1 and again.output.startswith("error: job ") and "cancelled" in again.output
    bad = mem("jobs", "retry", "no-such-job")
    assert bad.exit_code == 1 and bad.output.startswith("error: no job")
    weird = mem("jobs", "list", "--state", "weird")
    assert weird.exit_code == 2
    assert weird.output.startswith("error: Invalid value for '--state': must be one of pending")
    assert table_rows(home / "memory" / "emelex.sqlite3") == before


def test_jobs_list_pages_with_a_cursor(workspace: Path) -> None:
    sid = _seed(workspace, turns=1)
    with MemoryStore.open(WorkerSettings(), kinds=KINDS) as store:
        ids = [store.enqueue_job("noop", sid, {"n": i}).job.id for i in range(3)]
    first = mem("jobs", "list", "--limit", "2")
    assert first.exit_code == 0 and ids[2] in first.output and ids[1] in first.output and ids[0] not in first.output
    cursor = first.output.strip().splitlines()[-1].split("--cursor ")[1]
    second = mem("jobs", "list", "--limit", "2", "--cursor", cursor)
    assert ids[0] in second.output and "more:" not in second.output
    assert mem("jobs", "list", "--state", "failed").output.strip() == "no jobs"


def test_a_turn_too_large_for_the_window_names_the_flag_and_a_window_that_fits(workspace: Path, home: Path) -> None:
    sid = _seed(workspace, turns=6)  # each turn about 200 estimated tokens
    before = table_rows(home / "memory" / "emelex.sqlite3")
    refused = mem("compact", sid, "--context-window", "400", "--force")
    assert refused.exit_code == 1 and refused.output.startswith("error: turn 1 of Session "), refused.output
    assert refused.output.count("\n") == 1  # one line
    fits = int(refused.output.split("`--context-window ")[1].split("`")[0])
    assert f"re-run with `--context-window {fits}` or more" in refused.output
    assert "model_max_context_tokens" in refused.output and "emelex models install PATH" in refused.output
    assert table_rows(home / "memory" / "emelex.sqlite3") == before  # nothing queued
    queued = mem("compact", sid, "--context-window", str(fits), "--force")
    assert queued.exit_code == 0 and queued.output.startswith("queued compaction job "), queued.output


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
def test_compact_never_reports_a_plan_that_already_failed_as_queued(workspace: Path, home: Path, ending: str) -> None:
    sid = _seed(workspace)
    first = json.loads(mem("compact", sid, "--context-window", "2000", "--json").output)["job"]["id"]
    with MemoryStore.open(WorkerSettings()) as store:
        if ending == "failed":
            store.claim_job("compaction").fail("the summarizer exploded", permanent=True)
        else:
            store.cancel_job(first)
    before = table_rows(home / "memory" / "emelex.sqlite3")
    again = mem("compact", sid, "--context-window", "2000")
    assert again.exit_code == 1, again.output  # nothing was queued: not a success
    assert again.output.startswith(f"nothing queued: this exact plan already {ending} as compaction job {first}")
    assert f"`emelex memory jobs retry {first}` runs it again" in again.output
    data = json.loads(mem("compact", sid, "--context-window", "2000", "--json").output)
    assert (data["outcome"], data["created"], data["job"]["state"]) == (ending, False, ending)
    assert table_rows(home / "memory" / "emelex.sqlite3") == before
