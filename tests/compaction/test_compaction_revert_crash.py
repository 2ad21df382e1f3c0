"""Reverting and redoing a compaction are crash-safe: a real child process SIGKILLed inside either transaction (after
it cancelled the queued compaction, after it changed the Summary's mark) leaves the database exactly as before, and
one killed right after the commit leaves the whole change; replay verifies in every case."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, Settings, compaction_handler, run_one_job

from ..support import table_rows
from .test_compaction import WINDOW, add_turns, summarize, tokens

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from emelex_memory import MemoryStore, Settings
    db, home, session_id, action, point = sys.argv[1:6]
    store = MemoryStore.open_path(db, Settings(home=home))
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if point == "commit":
        def hook(conn, name, pages):  # called once the commit is in the WAL
            die()
        store.db.conn.set_wal_hook(hook)
    else:
        seen = []
        def tracer(cursor, sql, bindings):  # runs before each statement: die at the one after `point`
            if seen:
                die()
            if sql.startswith(point):
                seen.append(sql)
            return True
        store.db.conn.exec_trace = tracer
    getattr(store, action + "_compaction")(session_id)
    sys.exit(3)  # the point was never reached
    """
)
POINTS = ("UPDATE jobs", "UPDATE summaries", "commit")  # after cancelling the queued job, after the mark, the commit


def _seed(db: Path, settings: Settings, workspace: Path, action: str) -> tuple[str, int]:
    """A compacted Session with a compaction job queued on its Summary; for "redo", the Summary is reverted (and
    the job queued after the revert). Returns the Session ID and the Summary's event ID."""
    with MemoryStore.open_path(db, settings) as store:
        session = store.create_session(workspace)
        add_turns(store, session.id, workspace, 10)
        store.queue_compaction(session.id, context_window=WINDOW, count_tokens=tokens)
        summary = run_one_job(store, compaction_handler(summarize)).job.result["summary_event_id"]
        if action == "redo":
            store.revert_compaction(session.id)
        add_turns(store, session.id, workspace, 8, label="later")
        assert store.queue_compaction(session.id, context_window=WINDOW, count_tokens=tokens).created
        return session.id, summary


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("action", ("revert", "redo"))
def test_a_revert_or_redo_killed_at_any_point_is_all_or_nothing(
    db_path: Path, settings: Settings, workspace: Path, action: str, point: str
) -> None:
    sid, summary = _seed(db_path, settings, workspace, action)
    before = table_rows(db_path)
    child = subprocess.run([sys.executable, "-c", CHILD, str(db_path), str(settings.home), sid, action, point],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    with MemoryStore.open_path(db_path, settings) as store:
        view = store.replay(sid).events  # verifies whatever Summary it starts from
        pending = [j for j in store.list_jobs(kind="compaction").jobs if j.state in ("pending", "cancelled")]
        changed = point == "commit"
        if not changed:
            assert table_rows(db_path) == before
        reverted = (action == "revert") == changed
        assert (view[0].id == summary) is not reverted and all(e.kind != "summary" for e in view[1:])
        assert [j.state for j in pending] == (["cancelled"] if changed else ["pending"])
        again = store.redo_compaction(sid) if reverted else store.revert_compaction(sid)  # consistent: either works
        assert again.summary_event_id == summary
