"""Claim-and-complete throughput of no-op jobs against a raw baseline measured in the same run; prints ratios.

Ours: worker processes drain a queue of no-op jobs through the library worker
(`run_one_job`: rescue, claim with one `UPDATE ... RETURNING` skipping live
Sessions, run the handler, complete re-checking the worker lease and the
Session). Raw baseline: the same number of processes performing two committed
single-row updates per job (claim, then done) on a plain table at the same
pragmas. Both are measured with one and with two worker processes, alternating
round by round so machine noise hits both sides; the median ratio of
throughputs (ours / raw; higher is better, target >= 0.7) is printed.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from emelex_memory import MemoryStore, Settings, register_job_kind, run_one_job
from emelex_memory.connection import connect

JOBS_PER_ROUND = 1000
ROUNDS = 5
CTX = multiprocessing.get_context("spawn")

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    lease BLOB,
    updated_at REAL NOT NULL
) STRICT
"""


def _ours(db: str, home: str, start, results) -> None:
    register_job_kind("noop")
    store = MemoryStore.open_path(db, Settings(home=home))
    start.wait()
    t0, n = time.perf_counter(), 0
    while run_one_job(store, lambda claim: None, kinds="noop") is not None:
        n += 1
    results.put((n, t0, time.perf_counter()))
    store.close()


def _raw(db: str, ids: list[int], start, results) -> None:
    conn = connect(Path(db), busy_timeout_ms=5000)
    start.wait()
    t0 = time.perf_counter()
    for job_id in ids:
        with conn:
            conn.execute("UPDATE raw_jobs SET state = 'claimed', lease = ?, updated_at = ? WHERE id = ?",
                         (os.urandom(32), time.time(), job_id))
        with conn:
            conn.execute("UPDATE raw_jobs SET state = 'done', lease = NULL, updated_at = ? WHERE id = ?",
                         (time.time(), job_id))
    results.put((len(ids), t0, time.perf_counter()))
    conn.close()


def _throughput(procs: list, results, n: int) -> float:
    for p in procs:
        p.start()
    done = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    assert sum(d[0] for d in done) == n, done
    return n / (max(d[2] for d in done) - min(d[1] for d in done))


def bench(root: Path, workers: int) -> float:
    settings = Settings(home=root / "home")
    workspace = root / "ws"
    workspace.mkdir(exist_ok=True)
    db = root / f"jobs-{workers}.sqlite3"
    raw_db = root / f"raw-{workers}.sqlite3"
    register_job_kind("noop")
    store = MemoryStore.open_path(db, settings)
    session = store.create_session(workspace)
    MemoryStore.open_path(raw_db, settings).close()
    raw = connect(raw_db, busy_timeout_ms=5000)
    with raw:
        raw.execute(RAW_TABLE)
    ratios, raw_rates, our_rates = [], [], []
    for r in range(ROUNDS):
        with store._write():  # one transaction; each enqueue nests as a savepoint
            for i in range(JOBS_PER_ROUND):
                store.enqueue_job("noop", session.id, {"round": r, "n": i})
        with raw:
            ids = [raw.execute("INSERT INTO raw_jobs (state, updated_at) VALUES ('pending', 0) RETURNING id")
                   .fetchone()[0] for _ in range(JOBS_PER_ROUND)]
        rates = {}
        for side in ("raw", "ours") if r % 2 == 0 else ("ours", "raw"):  # alternate which side goes first
            start, results = CTX.Barrier(workers), CTX.Queue()
            if side == "raw":
                procs = [CTX.Process(target=_raw, args=(str(raw_db), ids[w::workers], start, results))
                         for w in range(workers)]
            else:
                procs = [CTX.Process(target=_ours, args=(str(db), str(settings.home), start, results))
                         for _ in range(workers)]
            rates[side] = _throughput(procs, results, JOBS_PER_ROUND)
        raw_rate, our_rate = rates["raw"], rates["ours"]
        raw_rates.append(raw_rate)
        our_rates.append(our_rate)
        ratios.append(our_rate / raw_rate)
    store.close()
    raw.close()
    print(f"claim+complete, {workers} worker process{'es' if workers > 1 else ''}: ratio "
          f"{statistics.median(ratios):.3f} vs two committed single-row updates per job "
          f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}; ours {statistics.median(our_rates):.0f} jobs/s, "
          f"raw {statistics.median(raw_rates):.0f} jobs/s)")
    return statistics.median(ratios)


def main() -> int:
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".bench-") as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        bench(root, 1)
        bench(root, 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
