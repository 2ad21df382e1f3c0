"""Vectors of the searched text, from an optional embedder, kept in step with the store and fused with the
full-text ranking.

Storage: a plain table (schema steps m019_search_vectors, m023_search_vectors_rows), one float32 vector per indexed
row and embedder model, normalized to length 1, scanned in bounded pages of the searched workspace's rows
(`SCAN_PAGE`): no extension to load into every connection; `bench_vectors.py` measures it against sqlite-vec and
`bench_search.py --embedder` the fused search's cost (docs/knowledge.md, "Hybrid search").

In step: a vector is written by `put_embeddings` only while its row still holds exactly the text that was embedded
(the text's SHA-256 is compared inside the writing transaction), and triggers delete it in the transaction that
changes or deletes its row (an event's payload, a Knowledge entry's new version, key or tombstone, a deleted or
moved Session, retention). So a vector never outlives its text: a search reads only current vectors, and a row not
yet embedded is found by full text alone until the embedder catches up (`pending_embeddings`). Vectors are never
computed inside an append's transaction: the worker embeds what is pending after its jobs.

Fusion: the rows most similar to the query's vector (cosine, at most `VECTOR_CANDIDATES`) and the full-text
matches holding at least `RELEVANCE` of the query's weight (what the recall selection asks of a note) make one pool;
each row of the pool has a score on each side (a row full text did not put in scores 0, as BM25 scores a row without
the query's words; a row not among the nearest, the lowest similarity among them), each side's scores are
standardised over the pool (distance from their mean in standard deviations) and the two summed at equal weights.
The full-text candidates are every row holding a query word, most of them a weak word or two, and the nearest rows
of a conversation hold some query word too: by rank alone (reciprocal-rank fusion), rows both sides found weakly
outranked the nearest row and the best full-text match (`bench_search.py --embedder`: fused recall@10 fell below
the vectors' own). The weaker full-text rows follow the pool, in their order.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import statistics
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import apsw

from ..core.database import Database
from ..errors import InvalidInputError
from .ranking import EVENTS, KNOWLEDGE, Ranked
from .recall import RELEVANCE

ITEMS = {"event": EVENTS, "knowledge": KNOWLEDGE}
TABLE_ITEMS = {table: item for item, table in ITEMS.items()}
MAX_DIMS = 16_384
MAX_BATCH = 512  # items `pending_embeddings` returns and `put_embeddings` takes at most
SCAN_PAGE = 2_000  # vectors read per page of a search's scan
VECTOR_CANDIDATES = 50
_TEXT = {
    EVENTS: "SELECT body FROM event_search WHERE rowid = ?",
    KNOWLEDGE: "SELECT key || ' ' || content FROM knowledge_search WHERE rowid = ?",
}
_PENDING = {
    EVENTS: "SELECT f.rowid, f.ws, f.body FROM event_search f WHERE NOT EXISTS (SELECT 1 FROM search_vectors v "
            "WHERE v.model = ? AND v.item = 'event' AND v.item_id = f.rowid) ORDER BY f.rowid LIMIT ?",
    KNOWLEDGE: "SELECT f.rowid, f.ws, f.key || ' ' || f.content FROM knowledge_search f WHERE NOT EXISTS "
               "(SELECT 1 FROM search_vectors v WHERE v.model = ? AND v.item = 'knowledge' AND v.item_id = f.rowid) "
               "ORDER BY f.rowid LIMIT ?",
}


@dataclass(frozen=True)
class EmbeddingItem:
    """A row to embed: `item` ("event" or "knowledge"), its `item_id`, and the `text` to embed (pass the item back
    to `put_embeddings` with its vector)."""

    item: str
    item_id: int
    text: str

    @property
    def digest(self) -> bytes:
        """The SHA-256 of `text`."""
        return text_digest(self.text)


def text_digest(text: str) -> bytes:
    """The SHA-256 of `text`'s UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def check_model(model: object) -> str:
    """`model` if it is an embedder model name (1..200 characters), else `InvalidInputError`."""
    if not isinstance(model, str) or not 1 <= len(model) <= 200:
        raise InvalidInputError(f"an embedding model name is 1 to 200 characters, got {model!r}")
    return model


def unit_vector(vector: object) -> array:
    """`vector` (a sequence of 1..16,384 finite numbers, not all zero) as float32 of length 1, or
    `InvalidInputError`."""
    try:
        values = [float(x) for x in vector]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise InvalidInputError("a vector is a sequence of numbers") from None
    norm = math.sqrt(sum(x * x for x in values))
    if not 1 <= len(values) <= MAX_DIMS or not math.isfinite(norm) or norm == 0:
        raise InvalidInputError(f"a vector has 1 to {MAX_DIMS} finite numbers, not all zero")
    return array("f", [x / norm for x in values])


def _to_bytes(vector: array) -> bytes:
    return struct.pack(f"<{len(vector)}f", *vector)


class Vectors:
    """The embedder's side of the store: what is pending, and writing vectors (`MemoryStore.pending_embeddings`,
    `MemoryStore.put_embeddings`, `MemoryStore.embedding_counts`)."""

    def __init__(self, db: Database) -> None:
        """Serve `db`."""
        self._db = db

    def pending_embeddings(self, model: str, *, limit: int = 64) -> list[EmbeddingItem]:
        """At most `limit` (1..512) indexed rows without a vector for `model`, events first, oldest first."""
        check_model(model)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
            raise InvalidInputError(f"limit must be between 1 and {MAX_BATCH}, got {limit!r}")
        items: list[EmbeddingItem] = []
        with self._db.read() as conn:
            for table in (EVENTS, KNOWLEDGE):
                rows = conn.execute(_PENDING[table], (model, limit - len(items))).fetchall()
                items += [EmbeddingItem(TABLE_ITEMS[table], rowid, text) for rowid, _, text in rows]
                if len(items) >= limit:
                    break
        return items

    def put_embeddings(self, model: str, embedded: Sequence[tuple[EmbeddingItem, Sequence[float]]]) -> int:
        """Store each item's vector for `model`, in one transaction; return how many were stored.

        An item whose row was deleted or no longer holds the embedded text is
        skipped (embed it again when `pending_embeddings` offers it). Raises
        `InvalidInputError` (nothing written) for a bad model name, more than
        512 items, a vector that is not 1..16,384 finite numbers, or vectors
        of another length than this model's stored ones.
        """
        check_model(model)
        if len(embedded) > MAX_BATCH:
            raise InvalidInputError(f"at most {MAX_BATCH} vectors are stored at once, got {len(embedded)}")
        rows = [(item, unit_vector(vector)) for item, vector in embedded]
        if len({len(v) for _, v in rows}) > 1:
            raise InvalidInputError("the vectors of one model all have the same length")
        written = 0
        with self._db.write() as conn:
            stored = conn.execute("SELECT length(vector) / 4 FROM search_vectors WHERE model = ? LIMIT 1",
                                  (model,)).fetchone()
            if stored and rows and stored[0] != len(rows[0][1]):
                raise InvalidInputError(f"model {model!r} has vectors of {stored[0]} numbers, not {len(rows[0][1])}")
            for item, vector in rows:
                table = ITEMS.get(item.item)
                current = conn.execute(_TEXT[table], (item.item_id,)).fetchone() if table else None
                if current is None or text_digest(current[0]) != item.digest:
                    continue
                (ws,) = conn.execute(f"SELECT ws FROM {table} WHERE rowid = ?", (item.item_id,)).fetchone()
                conn.execute("INSERT OR REPLACE INTO search_vectors (item, item_id, model, workspace_id, digest, "
                             "vector) VALUES (?, ?, ?, ?, ?, ?)",
                             (item.item, item.item_id, model, int(ws[1:]), item.digest, _to_bytes(vector)))
                written += 1
        return written

    def embedding_counts(self, model: str) -> tuple[int, int]:
        """(rows with a vector for `model`, indexed rows without one)."""
        check_model(model)
        with self._db.read() as conn:
            done = conn.execute("SELECT count(*) FROM search_vectors WHERE model = ?", (model,)).fetchone()[0]
            rows = sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in (EVENTS, KNOWLEDGE))
        return done, rows - done


def nearest(conn: apsw.Connection, scope: int, model: str, query: array, tables: tuple[str, ...],
            limit: int = VECTOR_CANDIDATES) -> list[tuple[str, int, float]]:
    """The (table, rowid, cosine similarity) of workspace `scope`'s rows of `tables` most similar to the unit vector
    `query`, best first, at most `limit`; the vectors are read in pages of `SCAN_PAGE`.

    Both are unit vectors, so the cosine is 1 - d^2 / 2 for their Euclidean distance d, which `math.dist` computes
    in C over the vector's numbers as `struct` reads them (the stored little-endian float32), without a Python
    operation per number."""
    wanted = {TABLE_ITEMS[t] for t in tables}
    numbers = struct.Struct(f"<{len(query)}f")
    point = tuple(query)
    best: list[tuple[float, str, int]] = []
    after = 0
    while True:
        page = conn.execute(
            "SELECT id, item, item_id, vector FROM search_vectors WHERE workspace_id = ? AND model = ? AND id > ? "
            "ORDER BY id LIMIT ?", (scope, model, after, SCAN_PAGE)).fetchall()
        best += [(1.0 - math.dist(point, numbers.unpack(blob)) ** 2 / 2, item, item_id)
                 for _, item, item_id, blob in page if item in wanted and len(blob) == numbers.size]
        best = heapq.nlargest(limit, best)
        if len(page) < SCAN_PAGE:
            break
        after = page[-1][0]
    return [(ITEMS[item], item_id, similarity) for similarity, item, item_id in best]


def standard_scores(scores: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """Each of `scores` as its distance from their mean in standard deviations (all 0 when they do not vary)."""
    if not scores:
        return {}
    mean, spread = statistics.fmean(scores.values()), statistics.pstdev(scores.values())
    return {row: (score - mean) / spread if spread else 0.0 for row, score in scores.items()}


def fuse(ranked: list[Ranked], near: list[tuple[str, int, float]]) -> list[Ranked]:
    """The full-text ranking `ranked` and the vector neighbours `near` merged by summed standard scores over one pool
    of rows (see the module; ties: the better full-text score, then the newer row), then the full-text rows holding
    less than `RELEVANCE` of the query's weight that no vector found, in their order; a row keeps its full-text
    relevance (0 when only its vector found it)."""
    words = {(r.table, r.rowid): r for r in ranked if r.relevance >= RELEVANCE}
    vectors = {(table, rowid): similarity for table, rowid, similarity in near}
    pool = list(words.keys() | vectors.keys())
    lowest = min(vectors.values(), default=0.0)
    relevance = {(r.table, r.rowid): r.relevance for r in ranked}
    by_words = standard_scores({row: words[row].score if row in words else 0.0 for row in pool})
    by_vectors = standard_scores({row: vectors.get(row, lowest) for row in pool})
    fused = [Ranked(t, r, by_words[(t, r)] + by_vectors[(t, r)], relevance.get((t, r), 0.0)) for t, r in pool]
    fused.sort(key=lambda r: (-r.score, -(words[(r.table, r.rowid)].score if (r.table, r.rowid) in words else 0.0),
                              -r.rowid))
    return fused + [r for r in ranked if (r.table, r.rowid) not in words and (r.table, r.rowid) not in vectors]
