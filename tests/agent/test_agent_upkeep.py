"""Upkeep around an open agent journal: why its jobs wait, deletion and retention, asset collection."""

from __future__ import annotations

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal as j
from emelex_workers.cli.work_display import waiting_line
from tests.support.agent_engine import leased_session
from tests.support import table_rows


def interrupted(store: MemoryStore, workspace):
    """A Session whose agent turn was left open (its process died), with its lease released."""
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "do it")
    lease.release()
    return session


def test_a_job_of_a_session_with_an_open_journal_says_it_waits_on_the_journal(cstore: MemoryStore, workspace, db_path):
    session = interrupted(cstore, workspace)
    cstore.queue_distillation(session.id)
    before = table_rows(db_path)
    waiting = cstore.waiting_jobs()
    assert table_rows(db_path) == before
    [job] = waiting.jobs
    assert (job.reason, job.holder, job.until) == ("agent-journal", None, None)
    line = waiting_line(job, "no more due jobs")
    assert "open agent journal" in line and f"`emelex memory sessions recover {session.id}`" in line


def test_delete_session_refuses_an_open_journal_unless_discarded(store: MemoryStore, workspace, db_path):
    from emelex_memory import OpenJournalError

    session = interrupted(store, workspace)
    before = table_rows(db_path)
    with pytest.raises(OpenJournalError, match=f"sessions recover {session.id}"):
        store.delete_session(session.id)
    assert table_rows(db_path) == before
    deleted = store.delete_session(session.id, discard_journal=True)
    assert deleted.events == 1 and not table_rows(db_path)["agent_turns"]


def test_the_cli_refuses_to_delete_an_open_journal_unless_discarded(home, workspace, monkeypatch):
    from typer.testing import CliRunner

    from emelex_memory import Settings
    from emelex_workers.cli import app

    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(Settings()) as store:
        session = interrupted(store, workspace)
    refused = CliRunner().invoke(app, ["memory", "sessions", "delete", session.id, "--yes"])
    assert refused.exit_code != 0 and "sessions recover" in refused.output and "Traceback" not in refused.output
    with MemoryStore.open(Settings()) as store:
        assert store.get_session(session.id).id == session.id
    done = CliRunner().invoke(app, ["memory", "sessions", "delete", session.id, "--yes", "--discard-journal"])
    assert done.exit_code == 0, done.output
    assert f"deleted Session {session.id}" in done.output


def test_retention_skips_a_session_with_an_open_journal(db_path, home, clock, workspace):
    from emelex_memory import Settings

    with MemoryStore.open_path(db_path, Settings(home=home, session_retention_days=30), clock=clock) as store:
        kept = interrupted(store, workspace)
        idle = store.create_session(workspace)
        clock.now += 31 * 86_400
        report = store.maintain()
        assert report.sessions_deleted == 1
        assert [s.id for s in store.list_sessions().sessions] == [kept.id] != [idle.id]
        assert j.read_journal(store, kept.id) is not None


def test_an_asset_only_the_journal_names_outlives_the_grace_period(cstore: MemoryStore, clock, workspace, db_path):
    from emelex_memory.agent.recovery import recover_session

    session, lease = leased_session(cstore, workspace)
    j.open_turn(cstore, lease, "do it")
    j.plan_batch(cstore, lease, 1, "{}", [("c1", "effect", {"path": "big"})])
    j.start_call(cstore, lease, "c1")
    ref = cstore.put_asset(b"a large tool output", "text/plain")
    result = {"call_id": "c1", "tool": "effect", "outcome": "ok", "output": f"stored as {ref.digest}",
              "assets": [ref.digest]}
    j.complete_call(cstore, lease, "c1", result, [ref])
    lease.release()  # the process dies before the batch is published
    clock.now += 10 * 86_400
    collected = cstore.collect_assets()
    assert collected.removed_entries == 0 and cstore.read_asset(ref) == b"a large tool output"
    clock.now += 1
    recovered = recover_session(cstore, session.id)
    assert recovered.reconciled.results == (result,)
    [published] = [e for e in cstore.replay(session.id).events if e.kind == "tool_result"]
    assert published.assets == (ref,) and cstore.read_asset(ref) == b"a large tool output"
