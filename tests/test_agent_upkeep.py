"""Upkeep around an open agent journal: why its jobs wait, deletion and retention, asset collection."""

from __future__ import annotations

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal as j
from emelex_workers.cli.work_display import waiting_line
from tests.agent_engine_support import leased_session
from tests.conftest import table_rows


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
