"""Splitting a distill job whose source is too large for one model call into smaller distill jobs.

A Session's new history can exceed what the model reads at once. Instead of
failing, the distillation handler returns a `DistillationSplit`: consecutive
seq ranges that cover the job's source exactly, each fitting the budget.
Completing the job with it queues one distill job per range (keyed by its own
source digest, so splitting again queues nothing twice) in the completion
transaction, and records `{"split_into": n, "jobs": [...]}` as the job's
result. Ranges are cut at event boundaries: first by bytes (so a huge range is
never read into memory), then by the model's token count of the events. A
single event that alone exceeds the budget cannot be split; its job fails
with `SourceTooLargeError`, and the rest of the history is still distilled.

At most `MAX_SPLIT` ranges come from one split; the last takes the remainder
and is split again when it runs, so every read stays bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

from ..errors import InvalidInputError, SourceChangedError
from .source_digest import source_digest
from ..sessions.transcript import Event

if TYPE_CHECKING:
    from ..queue.jobs import CompletionContext

MAX_SPLIT = 64  # ranges one split queues; the last holds the remainder and splits again when it runs
MAX_BYTES_PER_TOKEN = 8  # a range with more bytes than this many per budget token is split before it is read
SIZE_PAGE = 1000  # event sizes read per query while cutting byte ranges

Range = tuple[int, int]


@dataclass(frozen=True)
class DistillationSplit:
    """A distill handler's result for a source too large for one model call: consecutive inclusive seq ranges
    (at least two) covering the job's source exactly. Completing the job queues one distill job per range."""

    ranges: tuple[Range, ...]


def byte_budget(cap: int, safe_context_tokens: int | None) -> int:
    """Most source bytes a job is read with: `cap` (`knowledge_source_max_bytes`), and with a token budget at most
    `MAX_BYTES_PER_TOKEN` bytes per budget token (more bytes would not fit anyway)."""
    if safe_context_tokens is None:
        return cap
    return min(cap, max(safe_context_tokens, 1) * MAX_BYTES_PER_TOKEN)


def _pack(costs: Iterable[tuple[int, int]], first: int, last: int, budget: int) -> list[Range]:
    """Greedy consecutive ranges of (seq, cost) pairs whose costs sum to at most `budget` (an event costing more is
    alone); after `MAX_SPLIT - 1` ranges the rest of `first..last` is the last one, and `costs` is read no further."""
    ranges: list[Range] = []
    start, total = first, 0
    for seq, cost in costs:
        if seq > start and total + cost > budget:
            ranges.append((start, seq - 1))
            start, total = seq, 0
            if len(ranges) == MAX_SPLIT - 1:
                break
        total += cost
    ranges.append((start, last))
    return ranges


def _sizes(conn: apsw.Connection, session_rowid: int, first: int, last: int) -> Iterator[tuple[int, int]]:
    """(seq, size) of the events `first..last`, read lazily in pages of `SIZE_PAGE`."""
    after = first - 1
    while after < last:
        rows = conn.execute(
            "SELECT seq, size FROM events WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (session_rowid, after, last, SIZE_PAGE),
        ).fetchall()
        if not rows:
            return
        yield from rows
        after = rows[-1][0]


def byte_ranges(conn: apsw.Connection, session_rowid: int, first: int, last: int, budget: int) -> list[Range]:
    """Ranges of `first..last` of at most `budget` event bytes each (see `_pack`), reading only event sizes, no
    further than the ranges need."""
    return _pack(_sizes(conn, session_rowid, first, last), first, last, budget)


def token_ranges(events: Sequence[Event], counts: Sequence[int], budget: int) -> list[Range]:
    """Ranges of at most `budget` tokens each (see `_pack`) for events already read and their token counts."""
    return _pack(zip((e.seq for e in events), counts), events[0].seq, events[-1].seq, budget)


def complete_split(ctx: CompletionContext, split: DistillationSplit, kind: str) -> dict[str, Any]:
    """Inside the completion transaction: check the source is unchanged and the ranges cover it exactly, then queue
    one `kind` job per range. Returns the job's result."""
    source, sid = ctx.job.source, ctx.job.session_id
    first, last = source["first_seq"], source["last_seq"]
    ranges = split.ranges
    ok = (
        2 <= len(ranges) <= MAX_SPLIT
        and all(isinstance(a, int) and isinstance(b, int) and a <= b for a, b in ranges)
        and ranges[0][0] == first and ranges[-1][1] == last
        and all(ranges[i][1] + 1 == ranges[i + 1][0] for i in range(len(ranges) - 1))
    )
    if not ok:
        raise InvalidInputError(f"a split of distill job {ctx.job.id} must cover seqs {first}..{last} exactly, "
                                f"in 2-{MAX_SPLIT} consecutive ranges")
    if source_digest(ctx.conn, ctx.session_rowid, sid, first, last) != source["digest"]:
        raise SourceChangedError(f"the source events of distillation job {ctx.job.id} changed; nothing was queued")
    jobs = []
    for a, b in ranges:
        digest = source_digest(ctx.conn, ctx.session_rowid, sid, a, b)
        part = {"first_seq": a, "last_seq": b, "digest": digest}
        jobs.append(ctx.store.enqueue_job(kind, sid, part, source_key=digest).job.id)
    return {"split_into": len(jobs), "jobs": jobs}
