"""Vector storage for hybrid search, chosen by measurement; the `vectors` section of RESULTS.md.

A workspace of 100,000 and of 1,000,000 embedded rows (384 numbers each, the default embedding model's size; random
unit vectors, as a brute-force search's cost does not depend on them) plus a small second workspace, in a SQLite
file on disk. Three ways to find a query's 50 nearest rows of the workspace (cosine), alternated query by query:
- **plain, Python**: the store's table (schema step m023_search_vectors_rows) scanned in pages by `search/vectors.py:
  nearest`, the similarity computed from Python (`math.dist` over the unpacked numbers: what the store does
  without an extension);
- **plain, sqlite-vec**: the same table, the similarity computed in SQL by sqlite-vec's `vec_distance_cosine`
  (`ORDER BY ... LIMIT 50`): the extension loaded into the searching connection only, nothing else stored;
- **vec0**: sqlite-vec's own `vec0` table (the workspace as its partition key), a second copy of the vectors that
  every writer would have to keep in step (its triggers need the extension loaded in every connection).
Each side's nearest rows are checked to be the same rows. Reported: p50 per search and its ratio to the plain
Python scan, the time to write the vectors, and the file's size. Not installed by `make`:
`pip install sqlite-vec` (the `compare` extra).
Targets: none for storage (a choice, not a promise); the figures say what the choice costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

import apsw
import numpy as np

from emelex_memory.search.ranking import EVENTS, KNOWLEDGE
from emelex_memory.search.vectors import nearest

sys.path.insert(0, str(Path(__file__).parent))
from results import Figures, render_list  # noqa: E402

DIMS, K, MODEL, CHUNK = 384, 50, "bench", 50_000
ABOUT = __doc__.split("\n\n", 1)[1]
SECTIONS = ("vectors",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_memory/search/vectors.py", "emelex_memory/core/schema/m023_search_vectors_rows.sql")
SCHEMA = (Path(__file__).parents[1] / "emelex_memory" / "core" / "schema" / "m023_search_vectors_rows.sql").read_text()
TABLE = SCHEMA[SCHEMA.index("CREATE TABLE"):SCHEMA.index("INSERT INTO")]
INDEX = SCHEMA[SCHEMA.index("CREATE INDEX"):SCHEMA.index("CREATE TRIGGER")]


def render(figures: dict) -> str:
    """The `vectors` section of the recorded `figures`."""
    return render_list("Vector storage (`bench_vectors.py`)", ABOUT, figures)


FIGURES = Figures("vectors", render)


def build(path: Path, rows: int, rng: np.random.Generator) -> tuple[float, float]:
    """Write `rows` vectors of workspace 1 (and 1,000 of workspace 2) into the plain table and a vec0 table; the
    seconds each took."""
    import sqlite_vec

    conn = connect(path, sqlite_vec)
    conn.execute(TABLE)
    conn.execute(INDEX)
    conn.execute(f"CREATE VIRTUAL TABLE vec USING vec0(workspace_id integer partition key, "
                 f"embedding float[{DIMS}] distance_metric=cosine, +item text, +item_id integer)")
    plain = vec0 = 0.0
    for workspace, count in ((2, 1_000), (1, rows)):
        for start in range(0, count, CHUNK):
            blobs = unit(rng.standard_normal((min(CHUNK, count - start), DIMS)))
            items = [("event", workspace * 10_000_000 + start + i, b) for i, b in enumerate(blobs)]
            t0 = time.perf_counter()
            with conn:
                conn.executemany("INSERT INTO search_vectors (item, item_id, model, workspace_id, digest, vector) "
                                 "VALUES (?, ?, ?, ?, ?, ?)",
                                 ((item, i, MODEL, workspace, b"\0" * 32, b) for item, i, b in items))
            t1 = time.perf_counter()
            with conn:
                conn.executemany("INSERT INTO vec (workspace_id, embedding, item, item_id) VALUES (?, ?, ?, ?)",
                                 ((workspace, b, item, i) for item, i, b in items))
            plain, vec0 = plain + t1 - t0, vec0 + time.perf_counter() - t1
    conn.close()
    return plain, vec0


def unit(vectors: np.ndarray) -> list[bytes]:
    """Each row of `vectors` normalized to length 1, as float32 little-endian bytes."""
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype("<f4")
    return [row.tobytes() for row in vectors]


def connect(path: Path, sqlite_vec) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    conn.execute("PRAGMA journal_mode = WAL")
    return conn


def python_scan(conn: apsw.Connection, query: bytes) -> list[int]:
    return [rowid for _, rowid, _ in nearest(conn, 1, MODEL, array("f", query), (EVENTS, KNOWLEDGE), K)]


def sql_scan(conn: apsw.Connection, query: bytes) -> list[int]:
    return [i for (i,) in conn.execute(
        "SELECT item_id FROM search_vectors WHERE workspace_id = 1 AND model = ? "
        "ORDER BY vec_distance_cosine(vector, ?) LIMIT ?", (MODEL, query, K))]


def vec0_knn(conn: apsw.Connection, query: bytes) -> list[int]:
    return [i for (i,) in conn.execute(
        "SELECT item_id FROM vec WHERE embedding MATCH ? AND k = ? AND workspace_id = 1 ORDER BY distance",
        (query, K))]


def measure(rows: int, queries: int, python_queries: int, root: Path) -> None:
    import sqlite_vec

    rng = np.random.default_rng(rows)
    path = root / f"vectors-{rows}.sqlite3"
    plain_s, vec0_s = build(path, rows, rng)
    conn = connect(path, sqlite_vec)
    sides = {"plain, Python": python_scan, "plain, sqlite-vec": sql_scan, "vec0": vec0_knn}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for n, query in enumerate(unit(rng.standard_normal((queries, DIMS)))):
        found = {}
        for name, side in sides.items():
            if name == "plain, Python" and n >= python_queries:
                continue
            t0 = time.perf_counter()
            with conn:  # one read transaction, as a search
                found[name] = side(conn, query)
            times[name].append((time.perf_counter() - t0) * 1000)
        if len({tuple(sorted(ids)) for ids in found.values()}) != 1:
            raise SystemExit(f"the sides found different rows for query {n}")
    conn.close()
    size = path.stat().st_size / 2**20
    base = statistics.median(times["plain, Python"])
    FIGURES.report(f"{rows:,} rows: the plain table scanned in Python, search p50", base, "the store's search today",
                   unit=" ms", format=".0f",
                   detail=f"{len(times['plain, Python'])} searches; writing the vectors: {plain_s:.0f} s")
    for name in ("plain, sqlite-vec", "vec0"):
        p50 = statistics.median(times[name])
        FIGURES.report(f"{rows:,} rows: {name}, search p50", p50, "an alternative", unit=" ms", format=".1f",
                       detail=f"{base / p50:.0f}x faster than the Python scan; p95 "
                    f"{statistics.quantiles(times[name], n=20)[-1]:.1f} ms over {len(times[name])} searches"
                    + (f"; writing the vec0 copy: {vec0_s:.0f} s" if name == "vec0" else ""))
    FIGURES.report(f"{rows:,} rows: database size with both copies", size, "what vec0's second copy costs on disk",
                   unit=" MiB", format=".0f", detail="the plain table and the vec0 copy hold the same vectors")
    path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rows", default="100000,1000000", help="workspace sizes, comma-separated")
    parser.add_argument("--queries", type=int, default=20, help="searches per side and size")
    parser.add_argument("--python-queries", type=int, default=3, help="of which the Python scan runs (it is slow)")
    args = parser.parse_args()
    try:
        import sqlite_vec  # noqa: F401
    except ImportError:
        print("sqlite-vec is not installed (pip install -e '.[compare]'): nothing measured, RESULTS.md unchanged")
        return 0
    with tempfile.TemporaryDirectory(prefix="emelex-bench-vectors-") as tmp:
        for rows in (int(r) for r in args.rows.split(",")):
            measure(rows, args.queries, args.python_queries, Path(tmp))
    return FIGURES.write()


if __name__ == "__main__":
    sys.exit(main())
