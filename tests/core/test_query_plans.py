"""Every statement the hot operations run is planned without a full table scan, on a real (small) store.

Each operation runs with apsw's exec trace on the store's connection, which
records every statement it prepares with its bindings; each one is then
planned with `EXPLAIN QUERY PLAN` (after `ANALYZE`, as `maintain`'s `PRAGMA
optimize` leaves a store). A plan step `SCAN <table>` without an index
reads the whole table, which grows with the store's lifetime: it fails the
test. An index scan (`SCAN <table> USING [COVERING] INDEX`) is allowed only
where listed in `BOUNDED_INDEX_SCANS`, each with the reason it stays bounded.
"""

from __future__ import annotations

import re
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    COMPACTION_KIND,
    Event,
    MemoryStore,
    NewEvent,
    Settings,
    compaction_handler,
    run_one_job,
)
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.maintenance import doctor as doctor_module
from emelex_memory.maintenance.doctor import diagnose

from ..support import Clock

# (table, index) -> why scanning that index stays bounded.
BOUNDED_INDEX_SCANS: dict[tuple[str, str], str] = {
    ("model_states", "model_states_by_age"):
        "maintain reads saved model states newest first and stops at its batch's last deletion: model_states_keep "
        "rows, one batch, and the rows of Sessions with a live lease",
}

# Tables small by construction -> why a scan of them stays bounded.
BOUNDED_TABLES: dict[str, str] = {
    "agent_calls": "holds only the calls of open agent journals (publishing a batch deletes its rows): at most "
                   "calls_per_batch rows per Session with an interrupted turn",
}

# Statements (by a fragment of their text) whose sort is bounded -> why.
BOUNDED_SORTS: dict[str, str] = {
    "FROM workspaces WHERE device = ?1 AND inode = ?2":
        "sorts the workspace rows of one device and inode: one, plus one per rebind or replacement of that directory",
    "FROM knowledge k CROSS JOIN knowledge_versions v":
        "version pruning sorts the old versions of the entries knowledge_prunable selects, those storing more than "
        "knowledge_keep_versions versions: at most one maintain batch once pruned, plus the entries changed more "
        "than that many times within the grace period",
}


def _bounded_sort(sql: str) -> bool:
    return any(fragment in sql for fragment in BOUNDED_SORTS)


# Plan steps that are not table reads at all (a table-valued function such as json_each over one row's value).
_NOT_TABLES = re.compile(r"SCAN (CONSTANT ROW\b|json_each\b|json_tree\b|\w+ VIRTUAL TABLE INDEX)")
_SCAN = re.compile(r"^SCAN (\w+)(?: AS \w+)?(?: USING (?:COVERING )?INDEX (\w+))?")


def _table_of(conn: apsw.Connection, name: str, sql: str) -> str:
    """The table a plan step's name (a table or an alias in `sql`) refers to."""
    alias = re.search(rf"\b(\w+)\s+(?:AS\s+)?{name}\b", sql)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type IN ('table', 'view')")}
    if name in tables:
        return name
    return alias.group(1) if alias and alias.group(1) in tables else name


class Recorder:
    """Collects the statements run on a connection while `active`, per operation name."""

    def __init__(self) -> None:
        self.operation: str | None = None
        self.statements: dict[str, dict[str, object]] = {}

    def __call__(self, cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        if self.operation is not None:
            self.statements.setdefault(self.operation, {}).setdefault(sql, bindings)
        return True


def _skip(sql: str) -> bool:
    head = sql.lstrip().split(None, 1)[0].upper()
    return head in {"BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA", "VACUUM", "ANALYZE", "END"}


def full_scans(conn: apsw.Connection, sql: str, bindings: object) -> list[str]:
    """The plan steps of `sql` that read a whole table (or an index not listed as bounded). A scan of a subquery's
    materialized result is not a table read: that subquery's own steps are checked."""
    bad = []
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, bindings)]
    subqueries = {d.split()[-1] for d in plan if d.startswith(("MATERIALIZE ", "CO-ROUTINE "))}
    for detail in plan:
        if detail.startswith("USE TEMP B-TREE") and not _bounded_sort(sql):
            bad.append(detail)
        if _NOT_TABLES.match(detail):
            continue
        m = _SCAN.match(detail)
        if not m or m.group(1) in subqueries or m.group(1).startswith("("):
            continue
        table = _table_of(conn, m.group(1), sql)
        if table in BOUNDED_TABLES:
            continue
        if m.group(2) is None or (table, m.group(2)) not in BOUNDED_INDEX_SCANS:
            bad.append(detail)
    return bad


def tokens(event: Event) -> int:
    return 100


@pytest.fixture
def busy_store(tmp_path: Path) -> tuple[MemoryStore, Path, Clock]:
    """A small store with the shapes the hot operations touch: Sessions, a compacted one, assets, Knowledge with
    history, jobs, expired and live leases; ANALYZEd."""
    clock = Clock(5_000_000.0)
    settings = Settings(home=tmp_path / "home", knowledge_keep_versions=2, knowledge_grace_days=1)
    d = tmp_path / "db"
    d.mkdir(mode=0o700)
    kinds = builtin_kinds()
    kinds.register("plan_noop")
    store = MemoryStore.open_path(d / "plans.sqlite3", settings, clock=clock, kinds=kinds)
    ws = tmp_path / "ws"
    ws.mkdir()
    for n in range(3):
        s = store.create_session(ws, title=f"s{n}")
        with store.acquire_lease(s.id, ws) as lease:
            list(lease.replay_all())
            ref = store.put_asset(f"image {n}".encode(), "image/png")
            for i in range(12):
                lease.append_turn([NewEvent("user", {"text": f"q{i}"}, assets=(ref,) if i == 0 else ()),
                                   NewEvent("assistant", {"text": f"a{i}"})])
            lease.release()
        store.enqueue_job("plan_noop", s.id, {"n": n})
    for v in range(5):
        store.remember(ws, "fact", f"version {v}")
        store.remember(ws, f"k{v}", "content")
    queued = store.queue_compaction(s.id, context_window=2000, count_tokens=tokens)
    assert queued.job is not None
    outcome = run_one_job(store, compaction_handler(lambda events, job: "summary", model_ref="m@sha256:abc"),
                          kinds=COMPACTION_KIND)
    assert outcome.status == "done", outcome.detail
    stale = store.create_session(ws, title="stale")
    store.acquire_lease(stale.id, ws, ttl_s=10)
    clock.now += 3 * 86_400
    yield store, ws, clock
    store.close()


def without_statistics(conn: apsw.Connection) -> None:
    """Drop the statistics the store's open-time `PRAGMA optimize` may have gathered, so the planner uses its
    defaults, as on a store that was never optimized."""
    with conn:
        if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_stat1'").fetchall():
            conn.execute("DELETE FROM sqlite_stat1")
            conn.execute("ANALYZE sqlite_schema")


def at_lifetime_scale(conn: apsw.Connection, factor: int = 100_000) -> None:
    """Give the planner the statistics of a store `factor` times larger in every dimension: ANALYZE, then scale each
    `sqlite_stat1` figure but the unique ones (1) and reload them. On the small store itself, the planner rightly
    prefers scanning a table of ten rows; what matters is the plan it picks once the tables are large."""
    with conn:
        conn.execute("ANALYZE")
        for tbl, idx, stat in conn.execute("SELECT tbl, idx, stat FROM sqlite_stat1").fetchall():
            rows, *per_key = [int(f) for f in stat.split() if f.isdigit()]
            figures = [rows * factor] + [f * factor if f > 1 else 1 for f in per_key]
            conn.execute("UPDATE sqlite_stat1 SET stat = ? WHERE tbl = ? AND idx IS ?", (" ".join(map(str, figures)), tbl, idx))
        if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_stat4'").fetchall():
            conn.execute("DELETE FROM sqlite_stat4")
        conn.execute("ANALYZE sqlite_schema")


@pytest.mark.parametrize("stats", ["none", "lifetime"])
def test_hot_statements_never_scan_a_whole_table(busy_store, stats: str) -> None:
    """Without statistics (a store `maintain` never optimized) and with a lifetime's, as `maintain`'s `PRAGMA
    optimize` leaves a large store."""
    store, ws, clock = busy_store
    recorder = Recorder()
    conn = store.db.conn
    conn.exec_trace = recorder
    first = store.list_sessions(limit=2)
    session_id = first.sessions[0].id

    def op(name: str, fn) -> None:
        recorder.operation = name
        try:
            fn()
        finally:
            recorder.operation = None

    def append() -> None:
        with store.acquire_lease(session_id, ws) as lease:
            list(lease.replay_all())
            ref = store.put_asset(b"fresh bytes", "image/png")
            lease.append_turn([NewEvent("user", {"text": "new"}, assets=(ref,))])
            lease.append_turn([NewEvent("user", {"text": "newer"})])
            lease.release()

    def claim_complete() -> None:
        claim = store.claim_job("plan_noop")
        assert claim is not None
        claim.complete()

    op("acquire, replay and append", append)
    op("replay page", lambda: store.replay(session_id, 0, limit=5))
    op("list sessions page", lambda: store.list_sessions(cursor=first.next_cursor, limit=2))
    op("claim and complete", claim_complete)
    op("recall", lambda: store.recall(ws, limit=3))
    op("asset read", lambda: store.read_asset(store.put_asset(b"image 0", "image/png")))
    op("maintain", lambda: store.maintain())
    conn.exec_trace = None
    (at_lifetime_scale if stats == "lifetime" else without_statistics)(conn)  # after maintain's PRAGMA optimize

    failures = {}
    for name, statements in recorder.statements.items():
        for sql, bindings in statements.items():
            if _skip(sql):
                continue
            bad = full_scans(conn, sql, bindings)
            if bad:
                failures.setdefault(name, []).append(f"{' '.join(sql.split())} -> {bad}")
    assert set(recorder.statements) >= {"acquire, replay and append", "claim and complete", "maintain"}
    assert not failures, "\n".join(f"{k}:\n  " + "\n  ".join(v) for k, v in failures.items())


def test_doctor_counts_the_events_exactly_in_its_payload_scan_not_in_a_scan_of_its_own(busy_store, monkeypatch) -> None:
    """The events table, the one that grows fastest, is read in full by doctor's full-read checks (transcripts,
    payloads) only: the exact event count comes from the payload check's scan, not from a scan of its own."""
    store, ws, _ = busy_store
    gone = store.list_sessions(limit=1).sessions[0].id
    store.delete_session(gone)  # leaves a gap in the event IDs: a count from max(id) would be wrong
    with store.db.read() as conn:
        stored = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    recorder = Recorder()
    recorder.operation = "doctor"
    real_open = doctor_module.open_as_is

    def open_traced(*args, **kwargs):
        conn, info = real_open(*args, **kwargs)
        conn.exec_trace = recorder
        return conn, info

    monkeypatch.setattr(doctor_module, "open_as_is", open_traced)
    report = diagnose(store.settings, database=store.path)
    assert report.healthy, report.checks
    assert report.facts["events"] == stored
    statements = recorder.statements["doctor"]
    events_reads = [
        sql for sql, bindings in statements.items() if not _skip(sql)
        and any(_table_of(store.db.conn, m.group(1), sql) == "events"
                for d in full_scans(store.db.conn, sql, bindings) if (m := _SCAN.match(d)))
    ]
    assert len(events_reads) == 2, events_reads  # the transcripts check and the payload check
