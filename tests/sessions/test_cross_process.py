"""Cross-process behaviour with real processes: lease races, stale authority, SIGKILL during append_turn."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from itertools import accumulate
from pathlib import Path

import pytest

from emelex_memory import LeaseLostError, MemoryStore, NewEvent, Settings, StaleCursorError

from ..support import table_rows

CTX = multiprocessing.get_context("spawn")


def _contend(db: str, home: str, session_id: str, workspace: str, start, done, results) -> None:
    store = MemoryStore.open_path(db, Settings(home=home))
    start.wait()
    try:
        lease = store.acquire_lease(session_id, workspace)
        results.put("won")
    except Exception as exc:  # the losers' typed error is the point
        lease = None
        results.put(type(exc).__name__)
    done.wait()  # keep a winner's lease alive until every contender has tried
    del lease


def test_processes_racing_for_one_lease_exactly_one_wins(db_path: Path, settings: Settings, workspace: Path) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        session = store.create_session(workspace)
    n = 6
    start, done, results = CTX.Barrier(n), CTX.Barrier(n), CTX.Queue()
    procs = [
        CTX.Process(target=_contend, args=(str(db_path), str(settings.home), session.id, str(workspace), start, done,
                                           results))
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=60) for _ in range(n))
    for p in procs:
        p.join(60)
    assert outcomes == ["LeaseHeldError"] * (n - 1) + ["won"]


def _take_over_and_append(db: str, home: str, session_id: str, workspace: str) -> None:
    store = MemoryStore.open_path(db, Settings(home=home))
    lease = store.acquire_lease(session_id, workspace)
    lease.replay()
    lease.append_turn([NewEvent("user", "from the other process")])
    lease.release()


def test_expired_lease_and_stale_cursor_are_refused_across_processes(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    store = MemoryStore.open_path(db_path, settings)
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace, ttl_s=0.2)
    lease.replay()
    lease.append_turn([NewEvent("user", "mine")])
    seen = lease.cursor
    time.sleep(0.3)  # let the lease expire so another process may take over
    other = CTX.Process(target=_take_over_and_append, args=(str(db_path), str(settings.home), session.id,
                                                          str(workspace)))
    other.start()
    other.join(60)
    assert other.exitcode == 0
    fresh = store.acquire_lease(session.id, workspace)
    fresh.replay()
    before = table_rows(db_path)
    with pytest.raises(LeaseLostError):
        lease.append_turn([NewEvent("user", "late write")])
    with pytest.raises(StaleCursorError):
        fresh.append_turn([NewEvent("user", "based on an old view")], expected_seq=seen)
    assert table_rows(db_path) == before
    store.close()


APPENDER = textwrap.dedent(
    """
    import os, signal, sys
    from emelex_memory import MemoryStore, NewEvent, Settings
    db, home, session_id, workspace, kill_after = sys.argv[1:6]
    kill_after = int(kill_after)
    store = MemoryStore.open_path(db, Settings(home=home))
    lease = store.acquire_lease(session_id, workspace, ttl_s=3600)
    list(lease.replay_all())
    inserts = 0
    def row_written(op, database, table, rowid):  # SQLite calls this for each row, in the middle of the statement
        global inserts
        if table == "events":
            inserts += 1
            if kill_after and inserts == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    store.db.conn.set_update_hook(row_written)
    print("ready", flush=True)
    turn = 0
    while True:
        turn += 1
        lease.append_turn([NewEvent("user", {"turn": turn, "i": i, "pad": "x" * 2000}) for i in range(50)])
    """
)


def _check_whole_turns(db: Path) -> int:
    rows = table_rows(db)
    events = sorted(rows["events"], key=lambda r: r[2])
    by_turn: dict[int, list[int]] = {}
    for e in events:
        by_turn.setdefault(e[3], []).append(e[4])
    assert all(positions == list(range(50)) for positions in by_turn.values()), "a partial turn was committed"
    assert [e[2] for e in events] == list(range(1, len(events) + 1))
    assert [e[10] for e in events] == list(accumulate(e[7] for e in events))  # byte_end: running total of size
    return len(by_turn)


def _spawn_appender(db: Path, settings: Settings, session_id: str, workspace: Path, kill_after: int):
    proc = subprocess.Popen(
        [sys.executable, "-c", APPENDER, str(db), str(settings.home), session_id, str(workspace), str(kill_after)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _fresh_session(db: Path, settings: Settings, workspace: Path) -> str:
    with MemoryStore.open_path(db, settings) as store:
        return store.create_session(workspace).id


@pytest.mark.parametrize("kill_after", [1, 25, 50, 73])
def test_sigkill_inside_append_turn_leaves_whole_turns(
    db_path: Path, settings: Settings, workspace: Path, kill_after: int
) -> None:
    session_id = _fresh_session(db_path, settings, workspace)
    proc = _spawn_appender(db_path, settings, session_id, workspace, kill_after)
    assert proc.wait(60) == -signal.SIGKILL
    turns = _check_whole_turns(db_path)
    assert turns == (kill_after - 1) // 50


def test_sigkill_at_random_moments_never_leaves_a_partial_turn(
    db_path: Path, settings: Settings, workspace: Path
) -> None:
    session_id = _fresh_session(db_path, settings, workspace)
    total = 0
    for delay in (0.05, 0.11, 0.2, 0.3):
        proc = _spawn_appender(db_path, settings, session_id, workspace, 0)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        turns = _check_whole_turns(db_path)
        assert turns >= total
        total = turns
        with MemoryStore.open_path(db_path, settings) as store:  # the dead holder's lease must be expired away
            with store.db.write() as conn:
                conn.execute("UPDATE session_leases SET expires_at = 0")


def _append_after_expiry(db: str, home: str, session_id: str, workspace: str, results) -> None:
    store = MemoryStore.open_path(db, Settings(home=home))
    lease = store.acquire_lease(session_id, workspace, ttl_s=0.2)
    lease.replay()
    time.sleep(0.3)
    try:
        lease.append_turn([NewEvent("user", "too late")])
        results.put("appended")
    except Exception as exc:
        results.put(type(exc).__name__)


def test_an_expired_lease_is_refused_in_another_process(db_path: Path, settings: Settings, workspace: Path) -> None:
    with MemoryStore.open_path(db_path, settings) as store:
        session = store.create_session(workspace)
    before = table_rows(db_path)["events"]
    results = CTX.Queue()
    proc = CTX.Process(target=_append_after_expiry, args=(str(db_path), str(settings.home), session.id,
                                                        str(workspace), results))
    proc.start()
    assert results.get(timeout=60) == "LeaseExpiredError"
    proc.join(60)
    assert table_rows(db_path)["events"] == before
