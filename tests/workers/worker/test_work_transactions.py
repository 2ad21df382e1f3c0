"""What a compaction job asks of the database, counted (tests/support/counting.py): the worker claims it, binds the
model, reads the job's source once (every page in one read transaction, the job not read again), and commits the
Summary; the source's shape is checked at the claim, by the reader (which refuses a malformed source whoever asks)
and at the commit.

Measured before the compaction job became one straight line through the worker (`Worker._compact`): a run of one
compaction job made 4 write transactions and 4 reads (the job read again by its ID, the Session's row, then the
source page), 30 statements; the source's shape was checked five times in the worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, NewEvent
from emelex_memory.compaction import planning
from emelex_workers.settings import WorkerSettings
from emelex_workers.worker.work import Worker

from ...support.counting import Counted
from .test_work import env, seed  # noqa: F401 - the fixture the worker tests share

__all__ = ["env"]


def test_a_compaction_job_reads_its_source_once_in_one_read_transaction_and_checks_it_three_times(
    env: WorkerSettings, workspace: Path, monkeypatch  # noqa: F811 - the fixture imported above
) -> None:
    monkeypatch.setenv("EMELEX_FAKE_PLUGIN", json.dumps({"chat": 2}))
    checks = []
    check = planning.check_fields  # what `validate_compaction_source` checks a source's shape with
    monkeypatch.setattr(planning, "check_fields", lambda *args: checks.append(1) or check(*args))
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        seed(store, workspace, distill=False)
        worker = Worker(store, env, kinds=("compaction",))
        try:
            assert worker.run(max_jobs=1).counts["done"] == 1  # the first job binds and loads the model
            checks.clear()
            with Counted(store) as counts:
                report = worker.run(max_jobs=1)
        finally:
            worker.close()
    assert report.counts["done"] == 1
    # rescue, claim, the model's binding to the Session, the completion with its Summary
    assert counts.writes == 4, counts.sql
    # the queue's pending probe, the source (one read transaction, every page), the report's waiting jobs
    assert counts.reads == 3, counts.sql
    assert sum(sql.startswith("BEGIN DEFERRED") for sql in counts.sql) == 1
    assert len(checks) == 3  # at the claim, by the reader and at the commit (five times before)
