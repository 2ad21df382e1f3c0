"""Costs at a lifetime of history: the hot operations on a lifetime-size store against a fresh small one, same run.

The large store holds 1,000,000 events across 10,000 Sessions, 100,000
Knowledge versions (5,000 entries of 20 versions), 10 GiB of assets (1,000
assets of about 10 MiB, one per Session among the first 1,000), a lease row
for every Session and a backlog of 100,000 due pending jobs. It is built once
and cached under `benchmarks/.cache/` (gitignored; delete it to rebuild).

How it is built: Sessions, leases, asset writes and links, the compaction of
one Session and the first turn of every asset Session go through the public
API; the bulk rows (the remaining events, Knowledge, leases of the other
Sessions, the job backlog) are inserted with `executemany` in few
transactions, with the values the API would write: payloads encoded by the
same `encode_turn`, consecutive seqs and turns per Session continuing from the
API's head, running `byte_end` and `media_end` totals, canonical JSON job
sources, version rows of the same shape `remember` writes. Asset bytes come from
sparse source files (runs of zero bytes of distinct lengths, so distinct
digests); `put_asset` streams them into the store, so the store's asset files
are ordinary files of real bytes, 10 GiB on disk.

The small store (100 Sessions of 100 events, 1,200 Knowledge versions (60 entries, so a page of 50 is full on both sides), a few
assets and jobs) is built fresh in every run. Each operation then alternates
between the two stores call by call, and the median time of each side is
compared; the target is a ratio <= 2. The inherently proportional costs (the
full integrity check, doctor's full reads and asset re-hash, VACUUM, replay of
an uncompacted Session, the asset folder scan for orphans, which `maintain`
runs at most hourly) are reported per MB, per event or per file instead, and the peak traced Python memory of replay and of
asset collection shows they stay bounded. The results go to the `scale` section
of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import hashlib
import os
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path

from emelex_memory import (
    COMPACTION_KIND,
    MemoryStore,
    NewEvent,
    Settings,
    compaction_handler,
    register_job_kind,
    run_one_job,
)
from emelex_memory.maintenance import doctor as doctor_module
from emelex_memory.maintenance.doctor import diagnose
from emelex_memory.sessions.transcript import encode_turn

sys.path.insert(0, str(Path(__file__).parent))
from results import met, publish, verdict  # noqa: E402

CACHE = Path(__file__).resolve().with_name(".cache")
BUILD = "scale-v1"
SESSIONS = 10_000
EVENTS_PER_SESSION = 100
KNOWLEDGE_ENTRIES, VERSIONS_PER_ENTRY = 5_000, 20
ASSETS, ASSET_BYTES = 1_000, 10 * 1024 * 1024
BACKLOG = 100_000
ROUNDS = 25
TARGET_RATIO = 2  # large store over small, per operation
SECTIONS = ("scale",)
MEASURES = ("emelex_memory",)  # the code its figures measure (results.py flags a section older than it)
KIND = "bench_noop"


def _turn(i: int) -> list[NewEvent]:
    return [
        NewEvent("user", {"text": f"question {i} about the parser and its error handling"}),
        NewEvent("assistant", {"text": f"answer {i}: the parser splits on whitespace and never raises."}),
    ]


def _tokens(event) -> int:
    return 100


def _bulk_events(store: MemoryStore, rowids: list[int], per_session: int) -> None:
    """Fill each Session up to `per_session` events, continuing from its head as `append_turn` would."""
    settings = store.settings
    encoded = [encode_turn(_turn(t), settings) for t in range(per_session // 2)]
    now = time.time()
    with store.db.write() as conn:
        for rowid in rowids:
            head = conn.execute("SELECT seq, turn, byte_end, media_end FROM events WHERE session_id = ? "
                                "ORDER BY seq DESC LIMIT 1", (rowid,)).fetchone() or (0, 0, 0, 0)
            seq, turn, byte_end, media_end = head
            rows = []
            while seq < per_session:
                turn += 1
                for k, e in enumerate(encoded[turn % len(encoded)]):
                    seq += 1
                    byte_end += e.size
                    rows.append((rowid, seq, turn, k, e.kind, e.payload, e.size, byte_end, media_end, now))
            conn.executemany(
                "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, media_end, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def _bulk_knowledge(store: MemoryStore, workspace: Path, entries: int, versions: int) -> None:
    """Entries of `versions` versions each, as `remember` writes them (one is written through it first)."""
    store.remember(workspace, "seed", "the first entry, through the API")
    now = time.time()
    with store.db.write() as conn:
        ws_id = conn.execute("SELECT workspace_id FROM knowledge WHERE key = 'seed'").fetchone()[0]
        for n in range(entries):
            key = f"fact-{n}"
            kid = conn.execute(
                "INSERT INTO knowledge (workspace_id, key, head_version, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?) RETURNING id", (ws_id, key, versions, now, now)).fetchone()[0]
            rows = []
            for v in range(1, versions + 1):
                content = f"version {v} of fact {n}: the build uses tabs"
                rows.append((kid, v, content, len(key.encode()) + len(content.encode()), 0.9, now, now))
            conn.executemany(
                "INSERT INTO knowledge_versions (knowledge_id, version, tombstone, content, size, confidence, "
                "origin, created_at, said_at) VALUES (?, ?, 0, ?, ?, ?, 'user', ?, ?)", rows)


def _bulk_leases_and_jobs(store: MemoryStore, rowids: list[int], backlog: int) -> None:
    now = time.time()
    with store.db.write() as conn:
        conn.executemany(
            "INSERT OR IGNORE INTO session_leases (session_id, token_hash, holder, state, acquired_at, expires_at, "
            "ended_at) VALUES (?, ?, 'bench@host', 'released', ?, ?, ?)",
            [(r, os.urandom(32), now, now + 60, now) for r in rowids])
        conn.executemany(
            "INSERT INTO jobs (uuid, kind, session_id, source_key, source, state, due_at, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
            [(str(uuid.uuid4()), KIND, rowids[i % len(rowids)], f"k{i}", f'{{"n":{i}}}', now - backlog + i, now, now)
             for i in range(backlog)])


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def build(root: Path, sessions: int, per_session: int, entries: int, versions: int, assets: int,
          asset_bytes: int, backlog: int, log: Callable[[str], None] = lambda s: None) -> None:
    """Build a store at `root/store.sqlite3` (workspace `root/ws`) of the given size; see the module docstring."""
    root.mkdir(parents=True, mode=0o700, exist_ok=True)
    workspace = root / "ws"
    workspace.mkdir(exist_ok=True)
    store = MemoryStore.open_path(root / "store.sqlite3", Settings(home=root / "home"))
    t0 = time.perf_counter()
    ids = [store.create_session(workspace, title=f"session {n}").id for n in range(sessions)]
    log(f"{sessions} Sessions: {time.perf_counter() - t0:.0f} s")
    source = root / "sparse.bin"
    for n in range(assets):
        ref = store.put_asset(open(_sparse(source, asset_bytes + n), "rb"), "application/octet-stream")
        with store.acquire_lease(ids[n], workspace) as lease:
            list(lease.replay_all())
            lease.append_turn([NewEvent("user", {"text": f"attachment {n}"}, assets=(ref,)),
                               NewEvent("assistant", {"text": "received"})])
            lease.release()
    source.unlink(missing_ok=True)
    log(f"{assets} assets: {time.perf_counter() - t0:.0f} s")
    with store.db.read() as conn:
        rowids = [r for (r,) in conn.execute("SELECT id FROM sessions ORDER BY id")]
    for i in range(0, len(rowids), 500):
        _bulk_events(store, rowids[i:i + 500], per_session)
    log(f"events: {time.perf_counter() - t0:.0f} s")
    hot = ids[-1]  # the compacted Session: its 100 events, then compaction through the API
    with store.acquire_lease(hot, workspace) as lease:
        list(lease.replay_all())
        lease.release()
    queued = store.queue_compaction(hot, context_window=4000, count_tokens=_tokens)
    assert queued.job is not None, queued.reason
    outcome = run_one_job(store, compaction_handler(lambda events, job: "summary of the early turns",
                                                    model_ref="bench@sha256:0"), kinds=COMPACTION_KIND)
    assert outcome.status == "done", outcome.detail
    _bulk_knowledge(store, workspace, entries, versions)
    _bulk_leases_and_jobs(store, rowids, backlog)
    store.maintain()  # PRAGMA optimize: the statistics a maintained store has
    store.close()
    (root / "built").write_text(f"{sessions} {per_session} {entries} {versions} {assets} {asset_bytes} {backlog}\n")
    log(f"built in {time.perf_counter() - t0:.0f} s")


class Side:
    """One store under measurement: a leased Session to append to, a compacted one, an uncompacted one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workspace = root / "ws"
        self.store = MemoryStore.open_path(root / "store.sqlite3", Settings(home=root / "home"))
        page = self.store.list_sessions(limit=2)
        self.compacted = page.sessions[0].id  # the newest: compacted at build
        self.plain = page.sessions[1].id
        self.middle = self.store.list_sessions(limit=50).next_cursor
        self.appender = self.store.create_session(self.workspace, title="appender").id
        self.lease = self.store.acquire_lease(self.appender, self.workspace, ttl_s=86_400)
        list(self.lease.replay_all())
        self.turns = 0

    def append(self) -> None:
        self.turns += 1
        self.lease.append_turn(_turn(self.turns))

    def resume_compacted(self) -> None:
        with self.store.acquire_lease(self.compacted, self.workspace) as lease:
            for _ in lease.replay_all():
                pass
            lease.release()

    def list_page(self) -> None:
        self.store.list_sessions(cursor=self.middle, limit=50)

    def claim_complete(self) -> None:
        claim = self.store.claim_job(KIND)
        assert claim is not None
        claim.complete()

    def recall(self) -> None:
        self.store.recall(self.workspace, limit=50)

    def maintain(self) -> None:
        report = self.store.maintain()
        assert not report.more and not report.leases_failed and not report.versions_pruned, report

    def doctor_fixed(self) -> None:
        diagnose(Settings(home=self.root / "home"), database=self.root / "store.sqlite3", max_asset_entries=1,
                 max_asset_bytes=1)

    def close(self) -> None:
        self.lease.release()
        self.store.close()


def _without_proportional_checks():
    """Run doctor without its checks that read every row (integrity, transcripts, payloads, which also counts the
    events, search index) and without its asset re-hash (bounded, but its cost is the size of the files it hashes): timed
    separately, per MB."""
    names = ("_check_integrity", "_check_transcripts", "_check_payloads", "_check_search_index", "_check_assets")
    saved = {n: getattr(doctor_module, n) for n in names}
    for n in saved:
        setattr(doctor_module, n, lambda report, store, *bounds: None)
    return saved


def alternate(small: Callable[[], None], big: Callable[[], None], rounds: int = ROUNDS) -> tuple[float, float]:
    """Median seconds per call of each side, alternating call by call and swapping which side goes first."""
    a, b = [], []
    for i in range(rounds):
        for side, fn, out in ((0, small, a), (1, big, b)) if i % 2 else ((1, big, b), (0, small, a)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _traced_peak(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6


def main() -> int:
    register_job_kind(KIND)
    started = time.perf_counter()
    big_root = CACHE / BUILD
    if not (big_root / "built").exists():
        print(f"building the lifetime store under {big_root} (cached for later runs)", flush=True)
        if big_root.exists():
            raise SystemExit(f"{big_root} holds an unfinished build: delete it and run again")
        build(big_root, SESSIONS, EVENTS_PER_SESSION, KNOWLEDGE_ENTRIES, VERSIONS_PER_ENTRY, ASSETS, ASSET_BYTES,
              BACKLOG, log=lambda s: print("  " + s, flush=True))
    build_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent, prefix=".bench-") as tmp:
        small_root = Path(tmp) / "small"
        build(small_root, 100, 100, 60, 20, 3, 1024, 2 * ROUNDS + 10)
        small, big = Side(small_root), Side(big_root)
        try:
            rows = []
            for name, op in (("append a turn (2 events)", "append"),
                             ("acquire + replay a compacted Session", "resume_compacted"),
                             ("list a page of 50 Sessions (middle cursor)", "list_page"),
                             ("claim + complete a job (100k due backlog on the large side, after ANALYZE)",
                              "claim_complete"),
                             ("recall a page of 50 Knowledge entries", "recall"),
                             ("maintain, nothing to do", "maintain")):
                s, b = alternate(getattr(small, op), getattr(big, op))
                rows.append((name, s, b))
            saved = _without_proportional_checks()
            try:
                s, b = alternate(small.doctor_fixed, big.doctor_fixed, rounds=9)
                rows.append(("doctor without its full-read checks (integrity, transcripts, payloads) and asset "
                             "re-hash", s, b))
            finally:
                for n, f in saved.items():
                    setattr(doctor_module, n, f)
            db = big_root / "store.sqlite3"
            mb = _mb(db)
            integrity_s = _timed(lambda: big.store.db.conn.execute("PRAGMA integrity_check").fetchall())
            doctor_s = _timed(lambda: diagnose(Settings(home=big_root / "home"), database=db, max_asset_entries=1,
                                               max_asset_bytes=1))
            plain_events = EVENTS_PER_SESSION
            replay_s = min(_timed(lambda: _replay_plain(big)) for _ in range(5))
            hashed = big.store.verify_assets(limit=1, max_hash_bytes=1).hashed_bytes / 1e6
            rehash_s = min(_timed(lambda: big.store.verify_assets(limit=1, max_hash_bytes=1)) for _ in range(3))
            scanned = len(list((big_root / "store.sqlite3.assets").iterdir())) - 1  # less tmp/
            scan_s = min(_timed(lambda: big.store.collect_assets(limit=1000)) for _ in range(3))
            replay_peak = _traced_peak(lambda: _replay_plain(big, assets=True))
            collect_peak = _traced_peak(lambda: big.store.collect_assets())
            vacuum_s = _timed(lambda: big.store.db.conn.execute("VACUUM").fetchall())
        finally:
            small.close()
            big.close()
    figures = {"rounds": ROUNDS, "total_s": time.perf_counter() - started, "build_s": build_s, "rows": rows,
               "mb": mb, "integrity_s": integrity_s, "doctor_s": doctor_s, "hashed_mb": hashed, "rehash_s": rehash_s,
               "scanned": scanned, "scan_s": scan_s, "vacuum_s": vacuum_s, "plain_events": plain_events,
               "replay_s": replay_s, "replay_peak_mb": replay_peak / 1e6, "collect_peak_mb": collect_peak / 1e6,
               "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(publish("scale", render, figures))
    return 0 if all(met(b / s, "<=", TARGET_RATIO) for _, s, b in rows) else 1


def render(figures: dict) -> str:
    """The `scale` section of the recorded `figures`."""
    f = figures
    mb = f["mb"]
    lines = [
        "## Scale (`bench_scale.py`)",
        "",
        "Built by `benchmarks/bench_scale.py` (what it measures and how the store is built: its docstring and",
        "[docs/storage.md](../docs/storage.md#costs-at-scale)). Large store: 1,000,000 events in 10,000 Sessions,",
        "100,000 Knowledge versions, 10 GiB of assets, 100,000 due jobs; small store: 10,000 events in 100 Sessions.",
        f"Medians of {f['rounds']} alternating calls (doctor: 9). Run on {f['measured']}: "
        f"{f['total_s']:.0f} s in all ({f['build_s']:.0f} s of it building or finding the cached large store).",
        "",
        "| operation | small | large | ratio | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, s, b in f["rows"]:
        lines.append(f"| {name} | {s * 1000:.2f} ms | {b * 1000:.2f} ms | {b / s:.2f} | "
                     f"{verdict(b / s, '<=', TARGET_RATIO)} |")
    lines += [
        "",
        "Proportional costs on the large store (database and WAL: "
        f"{mb:,.0f} MB):",
        "",
        "| operation | total | per unit |",
        "| --- | --- | --- |",
        f"| full integrity check (`PRAGMA integrity_check`) | {f['integrity_s']:.1f} s | "
        f"{f['integrity_s'] / mb * 1000:.2f} ms/MB |",
        f"| full `doctor` (integrity, transcripts, payloads, one asset re-hashed) | {f['doctor_s']:.1f} s | "
        f"{f['doctor_s'] / mb * 1000:.2f} ms/MB |",
        f"| doctor's asset re-hash (one {f['hashed_mb']:.0f} MB file) | {f['rehash_s'] * 1000:.1f} ms | "
        f"{f['rehash_s'] / f['hashed_mb'] * 1000:.2f} ms/MB |",
        f"| asset folder scan for orphans (`collect_assets`; `maintain`: at most hourly), {f['scanned']:,} files | "
        f"{f['scan_s'] * 1000:.1f} ms | {f['scan_s'] / f['scanned'] * 1e6:.1f} µs/file |",
        f"| `VACUUM` | {f['vacuum_s']:.1f} s | {f['vacuum_s'] / mb * 1000:.2f} ms/MB |",
        f"| replay of an uncompacted Session ({f['plain_events']} events) | {f['replay_s'] * 1000:.1f} ms | "
        f"{f['replay_s'] / f['plain_events'] * 1e6:.1f} µs/event |",
        "",
        f"Memory: peak traced Python allocation while replaying a 10 MiB-asset Session, asset bytes read: "
        f"{f['replay_peak_mb']:.1f} MB; while collecting assets over 10 GiB of them: {f['collect_peak_mb']:.1f} MB; "
        f"peak RSS of the whole run: {f['rss_mb']:.0f} MB.",
        "",
    ]
    return "\n".join(lines)


def _replay_plain(side: Side, assets: bool = False) -> None:
    """Replay the uncompacted Session page by page (with `assets`: an asset Session, reading each asset's bytes)."""
    session = side.store.list_sessions(cursor=side.middle, limit=1).sessions[0].id if not assets else None
    if assets:
        with side.store.db.read() as conn:
            session = conn.execute("SELECT s.uuid FROM sessions s JOIN event_assets a ON a.session_id = s.id "
                                   "LIMIT 1").fetchone()[0]
    after = 0
    while True:
        page = side.store.replay(session, after)
        if assets:
            for e in page.events:
                for ref in e.assets:
                    with side.store.open_asset(ref) as reader:
                        while reader.read(1 << 20):
                            pass
        after = page.next_cursor
        if page.done:
            return


if __name__ == "__main__":
    sys.exit(main())
