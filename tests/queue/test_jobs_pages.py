"""Byte bounds of job and Session model reference pages are hard: a minimum instead of an oversized first item."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emelex_memory.sessions.rows import session_rowid
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory import InvalidInputError, MemoryStore
from emelex_memory.queue.jobs import MAX_JOB_ROW_BYTES
from emelex_memory.snapshots.refs import MIN_REF_PAGE_BYTES, REF_ROW_BYTES

from ..support import kinds_fixture, table_rows

KINDS = builtin_kinds()
KINDS.register("noop")

kinds = kinds_fixture(KINDS)


def test_model_reference_pages_refuse_a_byte_bound_below_one_row_and_never_exceed_theirs(
    store: MemoryStore, workspace: Path, db_path: Path
) -> None:
    session = store.create_session(workspace)
    refs = [(f"sha256:{i:064x}", f"model{i}@sha256:{'a' * 64}" + "x" * (20 * i)) for i in range(5)]
    with store.db.write() as conn:
        rowid = session_rowid(conn, session.id)
        for snapshot, reference in refs:
            conn.execute("INSERT INTO session_model_refs VALUES (?, ?, ?, 1, 1)", (rowid, snapshot, reference))
    before = table_rows(db_path)
    with pytest.raises(InvalidInputError, match=f"max_bytes must be between {MIN_REF_PAGE_BYTES}"):
        store.session_model_refs(session.id, max_bytes=MIN_REF_PAGE_BYTES - 1)
    assert table_rows(db_path) == before
    seen, cursor, pages = [], None, 0
    while True:
        page = store.session_model_refs(session.id, cursor=cursor, max_bytes=MIN_REF_PAGE_BYTES)
        assert 1 <= len(page.refs) and sum(REF_ROW_BYTES + len(r.reference) for r in page.refs) <= MIN_REF_PAGE_BYTES
        seen += [r.snapshot_id for r in page.refs]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [s for s, _ in refs] and pages > 1


def test_job_pages_refuse_a_byte_bound_below_the_largest_job_and_never_exceed_theirs(
    store: MemoryStore, workspace: Path, db_path: Path
) -> None:
    sid = store.create_session(workspace).id
    ids = [store.enqueue_job("noop", sid, {"n": i, "pad": "x" * 15_000}).job.id for i in range(5)]
    before = table_rows(db_path)
    for listing in (store.list_jobs, store.failed_jobs):
        with pytest.raises(InvalidInputError, match=f"max_bytes must be between {MAX_JOB_ROW_BYTES}"):
            listing(max_bytes=MAX_JOB_ROW_BYTES - 1)
    assert table_rows(db_path) == before
    seen, cursor, pages = [], None, 0
    while True:
        page = store.list_jobs(cursor=cursor, max_bytes=MAX_JOB_ROW_BYTES)
        assert 1 <= len(page.jobs) and sum(300 + len(json.dumps(j.source)) for j in page.jobs) <= MAX_JOB_ROW_BYTES
        seen += [j.id for j in page.jobs]
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == ids[::-1] and pages == 3  # two jobs of about 15 KiB per page
