"""The cost of claiming and completing no-op jobs against a raw baseline measured in the same run; prints ratios.

Ours: worker processes drain a queue of no-op jobs through the library worker
as `emelex memory work` runs it (`run_one_job`: rescue, claim with one `UPDATE
... RETURNING` skipping live Sessions, run the handler, complete re-checking
the worker lease and the Session, and claim the next job in that same
transaction). Raw baseline: two committed single-row updates per job (claim,
then done) on a plain table at the same pragmas, through the same connection
factory (so the same busy handler). The same worker processes (one, then two)
alternate phases of 100 jobs between the two sides, every process working its
share of each phase concurrently, so machine noise hits both sides alike and
each side contends only with itself; a process's share of a phase starts with
a claim of its own and ends with a completion that claims nothing more. Each
ours phase is paired with the raw phase next to it; the median over all pairs
of the cost ratio (ours / raw time; lower is better, target <= 0.75) is
printed, with the quartiles and the median ratio of each round.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results import Figures, render_list

from emelex_memory import MemoryStore, Settings, register_job_kind, run_one_job
from emelex_memory.core.connection import connect

JOBS_PER_ROUND = 1000
CHUNK = 100  # jobs per phase; phases alternate between the two sides
ROUNDS = 5
COST_RATIO = 0.75  # ours / raw time per job: the retired target, named where the figure is reported
CTX = multiprocessing.get_context("spawn")
ABOUT = """\
The cost of claiming and completing no-op jobs through `run_one_job`, as `emelex memory work` runs it, against
two committed single-row updates per job (what is measured: [docs/queues.md](../docs/queues.md#performance)).
A worker that goes on to its next job claims it in the transaction that completes the last one
(`complete_and_claim`), so it commits once per job where the baseline commits twice; every guarantee stays (the
claim is an ordinary claim under a worker lease, rescued as a counted failure if the worker dies holding it).
Where fsync is cheap, as on this VM (the raw rate above shows what a committed update costs here), fixed
per-transaction costs decide the ratio; where a commit costs a millisecond or more the saved commit counts for
more. What a job still costs beyond one commit:

- **Two WAL frames per transaction instead of one.** The table page holding the completed job and the next
  one (jobs queued together are neighbours), and the first leaf of the partial index `jobs_active (state,
  due_at, id)`, which holds the claimed entries and, right after them ('claimed' sorts before 'pending'), the
  oldest pending ones: the completion removes one entry and the claim moves the next job's entry within that
  page. The claim finds the oldest due job through that index; a second index of the pending jobs alone
  (`jobs_due`, dropped by m016) was a third page every claim rewrote. Rescuing expired claims at every claim
  needs claims indexed. So a job costs about two frames, as the baseline's two updates do, plus the page
  splits of a table filled full at enqueue whose rows grow when claimed (`tests/queue/test_jobs_fastpath.py`
  counts the frames per commit).
- **Richer statements.** The claim's `UPDATE ... RETURNING` finds the oldest due job through the index,
  checks the Session's lease and that no claim has expired, and returns what the `Job` snapshot needs;
  completion re-checks the worker lease and the Session.
- **The Python layer**, kept small: a `JobClaim` with slots, `Job` snapshots built lazily by their
  constructor, stored JSON read with `raw_decode`, one reusable
  write-transaction object per store, the host label looked up once per process, completion without
  `RETURNING`, and lease renewal by one shared thread per process (`renewal.RENEWER`: two dictionary
  updates per job instead of starting and joining a thread per job).
- The job table's CHECKs spell state tests out with `OR`: an `IN` list of three or more constants makes
  SQLite build a temporary b-tree on every execution of an `UPDATE`.

With two workers the write transactions serialize on SQLite's write lock. The connection factory's busy
handler (`connection.BusyWait`) retries after 20 µs, 50 µs, ... growing to 2 ms steps, bounded by
`busy_timeout_ms`, where SQLite's own busy timeout sleeps at least 1 ms, many short transactions long.
"""
SECTIONS = ("jobs",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_memory/queue",
    "emelex_memory/core",
)


def render(figures: dict) -> str:
    """The `jobs` section of the recorded `figures`."""
    return render_list("Work queues (`bench_jobs.py`)", ABOUT, figures)


FIGURES = Figures("jobs", render)

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    lease BLOB,
    updated_at REAL NOT NULL
) STRICT
"""


def _yes() -> bool:
    return True


def _work(db: str, raw_db: str, home: str, raw_ids: list[int], rank: int, barrier, results) -> None:
    register_job_kind("noop")
    store = MemoryStore.open_path(db, Settings(home=home))
    raw = connect(Path(raw_db), busy_timeout_ms=5000)
    share = CHUNK // barrier.parties
    spent: dict[str, list[float]] = {"raw": [], "ours": []}
    ids = iter(raw_ids)

    def raw_side() -> None:
        for _ in range(share):
            job_id = next(ids)
            with raw:
                raw.execute("UPDATE raw_jobs SET state = 'claimed', lease = ?, updated_at = ? WHERE id = ?",
                            (os.urandom(32), time.time(), job_id))
            with raw:
                raw.execute("UPDATE raw_jobs SET state = 'done', lease = NULL, updated_at = ? WHERE id = ?",
                            (time.time(), job_id))

    def our_side() -> None:
        held = None
        for n in range(share):
            go_on = None if n == share - 1 else _yes  # the share's last completion claims nothing more
            outcome = run_one_job(store, lambda claim: None, kinds="noop", claim=held, claim_next=go_on)
            assert outcome.status == "done"
            held = outcome.next_claim

    for chunk in range(JOBS_PER_ROUND // CHUNK):
        for side in ("raw", "ours") if chunk % 2 == 0 else ("ours", "raw"):
            barrier.wait()
            t0 = time.perf_counter()
            (raw_side if side == "raw" else our_side)()
            barrier.wait()  # a phase lasts until every worker has finished its share
            spent[side].append(time.perf_counter() - t0)
    results.put((rank, spent["raw"], spent["ours"]))
    store.close()
    raw.close()


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
    ratios, round_ratios, raw_rates, our_rates = [], [], [], []
    for r in range(ROUNDS):
        with store.db.write():  # one transaction; each enqueue nests as a savepoint
            for i in range(JOBS_PER_ROUND):
                store.enqueue_job("noop", session.id, {"round": r, "n": i})
        with raw:
            ids = [[raw.execute("INSERT INTO raw_jobs (state, updated_at) VALUES ('pending', 0) RETURNING id")
                    .fetchone()[0] for _ in range(JOBS_PER_ROUND // workers)] for _ in range(workers)]
        barrier, results = CTX.Barrier(workers), CTX.Queue()
        procs = [CTX.Process(target=_work, args=(str(db), str(raw_db), str(settings.home), ids[w], w, barrier,
                                                 results)) for w in range(workers)]
        for p in procs:
            p.start()
        done = sorted(results.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        with store.db.read() as conn:
            assert conn.execute("SELECT count(*) FROM jobs WHERE state = 'pending'").fetchone()[0] == 0
        # Every worker waits at the same barriers, so worker 0's phase times are the phases' times.
        pairs = [ours_s / raw_s for raw_s, ours_s in zip(done[0][1], done[0][2])]
        ratios += pairs
        round_ratios.append(statistics.median(pairs))
        raw_rates += [CHUNK / t for t in done[0][1]]
        our_rates += [CHUNK / t for t in done[0][2]]
    store.close()
    raw.close()
    low, median, high = statistics.quantiles(ratios, n=4)
    FIGURES.report(f"claim+complete, {workers} worker process{'es' if workers > 1 else ''}: cost ratio vs two "
                   "committed single-row updates per job", median,
                   f"the target <= {COST_RATIO} was retired (issue 26 met it within noise; no micro-optimisation is "
                   "owed), the figure is kept beside its raw baseline",
                   detail=f"median of {len(ratios)} phase pairs, quartiles {low:.2f}-{high:.2f}; rounds: "
                   f"{', '.join(f'{x:.2f}' for x in round_ratios)}; ours {statistics.median(our_rates):.0f} jobs/s, "
                   f"raw {statistics.median(raw_rates):.0f} jobs/s")
    return median


def main() -> int:
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".bench-") as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        bench(root, 1)
        bench(root, 2)
    return FIGURES.write()


if __name__ == "__main__":
    sys.exit(main())
