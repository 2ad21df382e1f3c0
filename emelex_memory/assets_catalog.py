"""Reading the asset catalog: entries, pages, links, totals and bounded verification pages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import apsw

from .assets import AssetRef, check_digest, check_media_kind
from .assets_files import verify_file
from .errors import AssetError, InvalidInputError

_ENTRY_COLUMNS = "digest, size, media_kind, links, created_at, touched_at"


@dataclass(frozen=True)
class AssetInfo:
    """One catalog entry: the reference, how many event links name it, when it was created and last put or linked."""

    ref: AssetRef
    links: int
    created_at: float
    touched_at: float


@dataclass(frozen=True)
class AssetPage:
    """A page of catalog entries in (digest, media kind) order; pass `next_cursor` back, None after the last page."""

    assets: list[AssetInfo]
    next_cursor: str | None


@dataclass(frozen=True)
class AssetLink:
    """One event that links an asset: its Session ID, seq, the asset's ordinal in the event, and the media kind."""

    session_id: str
    seq: int
    ordinal: int
    media_kind: str


@dataclass(frozen=True)
class AssetProblem:
    """Something wrong with one asset file: its digest, the media kinds catalogued for it, and the finding."""

    digest: str
    media_kinds: tuple[str, ...]
    detail: str


@dataclass(frozen=True)
class AssetVerification:
    """One bounded verification page: entries checked, bytes hashed, problems found, and where to continue."""

    checked: int
    hashed_bytes: int
    problems: list[AssetProblem]
    next_cursor: str | None


@dataclass(frozen=True)
class AssetTotals:
    """Catalog size: entries, distinct files (digests) and their bytes."""

    entries: int
    files: int
    bytes: int


def _info(row: tuple) -> AssetInfo:
    return AssetInfo(AssetRef(row[0], row[1], row[2]), row[3], row[4], row[5])


def parse_cursor(cursor: str | None) -> tuple[str, str]:
    """Split a `digest:media_kind` catalog cursor; `("", "")` for the start. Raises `InvalidInputError`."""
    if cursor is None:
        return "", ""
    try:
        digest, media_kind = cursor.split(":", 1)
        return check_digest(digest), check_media_kind(media_kind)
    except (AttributeError, ValueError):
        raise InvalidInputError(f"bad asset cursor {cursor!r}; pass a next_cursor from a previous page") from None


def entries_for(conn: apsw.Connection, digest: str) -> list[AssetInfo]:
    """Every catalog entry of one digest (one per media kind)."""
    check_digest(digest)
    rows = conn.execute(
        f"SELECT {_ENTRY_COLUMNS} FROM assets WHERE digest = ? ORDER BY media_kind", (digest,)
    ).fetchall()
    return [_info(r) for r in rows]


def page_entries(conn: apsw.Connection, cursor: str | None, limit: int, max_bytes: int) -> AssetPage:
    """Up to `limit` entries after `cursor` whose estimated size fits `max_bytes`."""
    after = parse_cursor(cursor)
    rows = conn.execute(
        f"SELECT {_ENTRY_COLUMNS} FROM assets WHERE (digest, media_kind) > (?, ?) ORDER BY digest, media_kind LIMIT ?",
        (*after, limit + 1),
    ).fetchall()
    out: list[AssetInfo] = []
    total = 0
    for row in rows[:limit]:
        total += 160 + len(row[2])  # generous per-entry estimate
        if total > max_bytes:
            break
        out.append(_info(row))
    more = len(out) < len(rows)
    last = out[-1].ref if out and more else None
    return AssetPage(out, f"{last.digest}:{last.media_kind}" if last else None)


def links_of(conn: apsw.Connection, digest: str, limit: int) -> list[AssetLink]:
    """The first `limit` events linking `digest`, in Session and seq order."""
    check_digest(digest)
    rows = conn.execute(
        "SELECT s.uuid, l.seq, l.ordinal, l.media_kind FROM event_assets l JOIN sessions s ON s.id = l.session_id "
        "WHERE l.digest = ? ORDER BY l.session_id, l.seq, l.ordinal LIMIT ?",
        (digest, limit),
    ).fetchall()
    return [AssetLink(*r) for r in rows]


def totals(conn: apsw.Connection) -> AssetTotals:
    """Count catalog entries, distinct files and their bytes."""
    entries, files, size = conn.execute(
        "SELECT (SELECT count(*) FROM assets), count(*), coalesce(sum(size), 0) "
        "FROM (SELECT digest, max(size) AS size FROM assets GROUP BY digest)"
    ).fetchone()
    return AssetTotals(entries, files, size)


def verify_page(
    conn: apsw.Connection, folder: Path, cursor: str | None, limit: int, max_hash_bytes: int
) -> AssetVerification:
    """Re-hash the files of up to `limit` entries after `cursor`, stopping before `max_hash_bytes` (one file at least).

    Entries of one digest share a file, which is hashed once. Entries that
    disappear while being checked (collected concurrently) are not reported.
    """
    after = parse_cursor(cursor)
    rows = conn.execute(
        "SELECT digest, media_kind, size FROM assets WHERE (digest, media_kind) > (?, ?) "
        "ORDER BY digest, media_kind LIMIT ?",
        (*after, limit + 1),
    ).fetchall()
    groups: list[list[tuple]] = []
    for row in rows[:limit]:
        if groups and groups[-1][0][0] == row[0]:
            groups[-1].append(row)
        else:
            groups.append([row])
    if len(rows) > limit and len(groups) > 1 and rows[limit][0] == groups[-1][0][0]:
        groups.pop()  # finish a digest's entries on one page
    checked = hashed = 0
    problems: list[AssetProblem] = []
    last = None
    for group in groups:
        digest, size = group[0][0], group[0][2]
        if checked and hashed + size > max_hash_bytes:
            break
        kinds = tuple(r[1] for r in group)
        problem = _check_group(conn, folder, digest, size, group)
        if problem:
            problems.append(AssetProblem(digest, kinds, problem))
        checked += len(group)
        hashed += size
        last = group[-1]
    done = last is not None and last == rows[-1]
    return AssetVerification(checked, hashed, problems, None if done or last is None else f"{last[0]}:{last[1]}")


def _check_group(conn: apsw.Connection, folder: Path, digest: str, size: int, group: list[tuple]) -> str | None:
    if any(r[2] != size for r in group):
        return f"catalog entries disagree on the size ({sorted({r[2] for r in group})})"
    try:
        verify_file(folder / digest, digest, size)
    except (AssetError, OSError) as exc:
        still = conn.execute("SELECT 1 FROM assets WHERE digest = ?", (digest,)).fetchone()
        return str(exc) if still else None
    return None
