"""append_turn and replay against raw apsw baselines measured in the same run; prints ratios.

append_turn (one 4-event turn per transaction, with its capped canonical
encoding and its lease, workspace and cursor re-checks) is compared with a
raw apsw insert of the same four rows (payloads encoded with the C
`json.dumps`) by one multi-row `INSERT`, as append_turn writes them (its
`INSERT` also carries the re-check), into a migrated store, so the search index's triggers write the same index rows on
both sides, at the same pragmas and one commit per turn, alternating turn by
turn and swapping which side goes first every other turn. Replay of a
100,000-event Session (pages of Event objects, assets and Summary provenance
checked) is compared with one raw SELECT of the same rows and columns,
consumed in C without keeping them, alternating page by page. This VM's CPU
speed drifts by 20% within seconds, so only such fine-grained alternation
gives stable figures; the median ratio of the rounds is printed.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections import deque
from itertools import islice
from pathlib import Path

from results import Figures, render_list

from emelex_memory import MemoryStore, NewEvent, Settings
from emelex_memory.core.connection import connect
from emelex_memory.sessions.rows import session_rowid
from emelex_memory.sessions.transcript import encode_turn

TURNS_PER_ROUND = 500
ROUNDS = 7
APPEND_RATIO = 1.05  # the retired target, named where the figure is reported
REPLAY_EVENTS = 100_000
REPLAY_ROUNDS = 7
PAGE = 500  # the default replay page (Settings.page_items)
ABOUT = """\
How the storage figures are reached (the design is in [docs/storage.md](../docs/storage.md)). An append
encodes each payload with one call of the C encoder behind `json` once a bounded walk shows it fits the caps
(cheaper than `json.dumps`, which builds a new encoder per call), and writes only its events: the Session head
is read from the newest event (each event carries `byte_end`, its Session's running byte total) instead of
being updated in the `sessions` row. A turn is one multi-row `INSERT`: the search index's FTS5 triggers write
a new index segment per statement, so a turn inserted event by event cost a segment per event. The raw
baseline runs that same `INSERT` of the same rows into a migrated store, so the triggers index the same events
on both sides (here the question and the answer; this turn's tool call and result use a kind and a field the
index does not read), and both write the same WAL pages per turn. A lease that has appended remembers the head
it left, and its next `INSERT` re-checks lease token and expiry, workspace row and epoch, open agent journal and
that head itself (`INSERT ... SELECT` joined to the one row of the check; the separate check runs only when it
inserted nothing, to raise the right error). Traced, an append runs `BEGIN IMMEDIATE`, that `INSERT`, `COMMIT`,
as the baseline does: what an append costs beyond it is the check inside the `INSERT`, one `stat` of the
workspace path and Python glue.
Replay builds `Event` tuples straight from rows, takes a page's byte total from its first and last
`byte_end`, and asks one statement whether the page has any assets. Every connection enables SQLite's query
planner stability guarantee; without it, statements on tables with a partial index were re-prepared on every
execution. Both storage benchmarks alternate the two sides finely (turn by turn, page by page), because this
VM's CPU speed drifts within seconds; each round's ratio is listed beside the median. Summary-aware replay
adds one indexed lookup per page for a Session without Summaries.
"""
SECTIONS = ("storage",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_memory/sessions",
    "emelex_memory/assets",
    "emelex_memory/core",
)


def render(figures: dict) -> str:
    """The `storage` section of the recorded `figures`."""
    return render_list("Storage (`bench_storage.py`)", ABOUT, figures)


FIGURES = Figures("storage", render)


def _turn(i: int) -> list[NewEvent]:
    return [
        NewEvent("user", {"text": f"question {i} about the parser and its error handling"}),
        NewEvent("tool_call", {"name": "read_file", "args": {"path": f"src/module_{i}.py"}}),
        NewEvent("tool_result", {"ok": True, "content": "def parse(text):\n    return text.split()\n" * 4}),
        NewEvent("assistant", {"text": f"answer {i}: the parser splits on whitespace and never raises."}),
    ]


def _leased_store(root: Path, name: str, settings: Settings):
    """A store at `root/name.sqlite3` with one Session and a replayed lease on it."""
    workspace = root / f"ws-{name}"
    workspace.mkdir()
    store = MemoryStore.open_path(root / f"{name}.sqlite3", settings)
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace, ttl_s=86_400)
    lease.replay()
    return store, session, lease, workspace


def bench_append(root: Path) -> float:
    settings = Settings(home=root / "home")
    store, session, lease, workspace = _leased_store(root, "ours", settings)

    raw_store = MemoryStore.open_path(root / "raw.sqlite3", settings)
    raw_session = raw_store.create_session(workspace)
    raw_store.close()
    raw = connect(root / "raw.sqlite3", busy_timeout_ms=5000)
    rowid = raw.execute("SELECT id FROM sessions WHERE uuid = ?", (raw_session.id,)).fetchone()[0]
    sql = (  # one statement for the turn, as append_turn writes it (FTS5 writes an index segment per statement)
        "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, created_at) VALUES "
        + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?)"] * 4)
    )
    seq = byte_end = 0
    raw_total = ours_total = 0.0
    ratios = []
    for _ in range(ROUNDS):
        raw_round = ours_round = 0.0
        for i in range(TURNS_PER_ROUND):  # alternate turn by turn so noise hits both sides alike
            events = _turn(i)
            if i % 2:  # and swap which side goes first, so neither always follows the other's fsync
                t0 = time.perf_counter()
                lease.append_turn(events)
                ours_round += time.perf_counter() - t0
            t0 = time.perf_counter()
            values = []
            for k, e in enumerate(events):
                payload = json.dumps(e.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                byte_end += len(payload)
                values += (rowid, seq + k + 1, seq // 4 + 1, k, e.kind, payload, len(payload), byte_end, time.time())
            with raw:
                raw.execute(sql, values)
            seq += len(events)
            raw_round += time.perf_counter() - t0
            if not i % 2:
                t0 = time.perf_counter()
                lease.append_turn(events)
                ours_round += time.perf_counter() - t0
        ratios.append(ours_round / raw_round)
        raw_total += raw_round
        ours_total += ours_round
    per_turn_ms = raw_total / (ROUNDS * TURNS_PER_ROUND) * 1000
    FIGURES.report("append_turn (4 events) vs raw insert + commit: ratio", statistics.median(ratios),
                   f"the target <= {APPEND_RATIO} was retired (issue 26 met it within noise; no micro-optimisation is "
                   "owed), the figure is kept beside its raw baseline",
                   detail=f"rounds: {', '.join(f'{r:.2f}' for r in ratios)}; raw {per_turn_ms:.2f} ms/turn")
    lease.release()
    store.close()
    raw.close()
    return statistics.median(ratios)


def bench_replay(root: Path) -> float:
    settings = Settings(home=root / "home")
    store, session, lease, _ = _leased_store(root, "replay", settings)
    with store.db.write() as conn:  # bulk load: 25,000 4-event turns in one transaction
        rowid = session_rowid(conn, session.id)
        rows, byte_end = [], 0
        for t in range(REPLAY_EVENTS // 4):
            for k, e in enumerate(encode_turn(_turn(t), settings)):
                byte_end += e.size
                rows.append((rowid, t * 4 + k + 1, t + 1, k, e.kind, e.payload, e.size, byte_end, 0.0))
        conn.executemany(
            "INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    lease.release()
    raw = connect(root / "replay.sqlite3", busy_timeout_ms=5000)

    sql = (
        "SELECT id, seq, turn, position, kind, payload, size, byte_end, created_at, asset_refs FROM events "
        "WHERE session_id = ? ORDER BY seq"
    )

    def one_round() -> tuple[float, float]:
        """Both sides read all rows, alternating every page so machine noise hits both alike."""
        rows = raw.execute(sql, (rowid,))
        raw_s = ours_s = 0.0
        raw_n = ours_n = after = 0
        done = False
        while not done:
            t0 = time.perf_counter()
            before = raw_n
            deque(islice(rows, PAGE), maxlen=0)  # consume a page of rows in C: the cheapest way Python can
            raw_n += PAGE
            t1 = time.perf_counter()
            page = store.replay(session.id, after)
            t2 = time.perf_counter()
            ours_n += len(page.events)
            after, done = page.next_cursor, page.done
            raw_s += t1 - t0
            ours_s += t2 - t1
            assert before < REPLAY_EVENTS or done
        assert ours_n == REPLAY_EVENTS and next(rows, None) is None
        return raw_s, ours_s

    ratios = []
    raw_total = 0.0
    for _ in range(REPLAY_ROUNDS):
        raw_s, ours_s = one_round()
        raw_total += raw_s
        ratios.append(ours_s / raw_s)
    FIGURES.add(f"replay of {REPLAY_EVENTS:,} events vs raw SELECT: ratio", statistics.median(ratios), "<=", 1.3,
                detail=f"rounds: {', '.join(f'{r:.2f}' for r in ratios)}; raw {raw_total / REPLAY_ROUNDS * 1000:.0f} ms")
    store.close()
    raw.close()
    return statistics.median(ratios)


def main() -> int:
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".bench-") as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        bench_append(root)
        bench_replay(root)
    return FIGURES.write()


if __name__ == "__main__":
    sys.exit(main())
