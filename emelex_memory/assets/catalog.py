"""Reading the asset catalog: entries, pages, links, totals and bounded verification pages."""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from .refs import AssetRef, check_digest, check_media_kind
from .files import check_content, open_checked
from .folder import AssetFolder
from ..core.cursors import cursor_int
from ..core.paging import Items, Page, take
from ..errors import AssetError, AssetMismatchError, AssetNotFoundError, FileSystemError, InvalidInputError

_ENTRY_COLUMNS = "digest, size, media_kind, links, created_at, touched_at"
_ENTRY_BYTES = 160  # generous size estimate of an entry, plus its media kind
_LINK_BYTES = 120  # of a link, plus its Session ID and media kind
_MAX_MEDIA_KIND = 127  # as the assets table's CHECK allows
MAX_ENTRY_BYTES = _ENTRY_BYTES + _MAX_MEDIA_KIND  # the largest entry: every page of entries has room for one
MAX_LINK_BYTES = _LINK_BYTES + 36 + _MAX_MEDIA_KIND  # the largest link (Session IDs are 36-character UUIDs)


@dataclass(frozen=True)
class AssetInfo:
    """One catalog entry: the reference, how many event links name it, when it was created and last put or linked."""

    ref: AssetRef
    links: int
    created_at: float
    touched_at: float


@dataclass(frozen=True)
class AssetPage(Page[AssetInfo]):
    """A page of catalog entries in (digest, media kind) order; pass `next_cursor` back, None after the last page."""

    assets = Items[AssetInfo]()


@dataclass(frozen=True)
class AssetLink:
    """One event that links an asset: its Session ID, seq, the asset's ordinal in the event, and the media kind."""

    session_id: str
    seq: int
    ordinal: int
    media_kind: str


@dataclass(frozen=True)
class AssetLinkPage(Page[AssetLink]):
    """A page of the events linking one asset; pass `next_cursor` back, None after the last page."""

    links = Items[AssetLink]()


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


def check_catalogued(conn: apsw.Connection, ref: AssetRef, consequence: str = "") -> None:
    """Raise `AssetNotFoundError` when `ref` has no catalog entry and `AssetMismatchError` when the entry's size
    is not the reference's; `consequence` (e.g. "; nothing was written") ends either message."""
    row = conn.execute("SELECT size FROM assets WHERE digest = ? AND media_kind = ?", (ref.digest, ref.media_kind))
    row = row.fetchone()
    if row is None:
        raise AssetNotFoundError(
            f"asset {ref.digest} ({ref.media_kind}) is not catalogued; store it with put_asset and use the reference "
            f"it returns{consequence}"
        )
    if row[0] != ref.size:
        raise AssetMismatchError(
            f"asset {ref.digest} ({ref.media_kind}) has {row[0]} bytes in the catalog but the reference says "
            f"{ref.size}; use the reference put_asset returned{consequence}"
        )


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


def page_entries(
    conn: apsw.Connection, cursor: str | None, limit: int, max_bytes: int, digest: str | None = None
) -> AssetPage:
    """Up to `limit` entries after `cursor` (of `digest` only, if given) whose estimated size fits `max_bytes`.

    A page holds at least one entry (callers validate `max_bytes` against
    `MAX_ENTRY_BYTES`, so it always fits) and carries a cursor whenever more
    entries follow.
    """
    after = parse_cursor(cursor)
    where = "(digest, media_kind) > (?, ?)"
    params: tuple = after
    if digest is not None:
        check_digest(digest)
        if cursor is not None and after[0] != digest:
            raise InvalidInputError(f"cursor {cursor!r} belongs to another asset; pass a next_cursor of {digest}")
        where, params = "digest = ? AND media_kind > ?", (digest, after[1])
    rows = conn.execute(
        f"SELECT {_ENTRY_COLUMNS} FROM assets WHERE {where} ORDER BY digest, media_kind LIMIT ?", (*params, limit + 1)
    ).fetchall()
    taken, next_cursor = take(
        rows, limit, max_bytes, lambda row: _ENTRY_BYTES + len(row[2]), lambda row: f"{row[0]}:{row[2]}",
        at_least_one=True,
    )
    return AssetPage([_info(row) for row in taken], next_cursor)


def links_of(conn: apsw.Connection, digest: str, cursor: str | None, limit: int, max_bytes: int) -> AssetLinkPage:
    """Up to `limit` events linking `digest` after `cursor`, in Session and seq order, fitting `max_bytes`.

    Like `page_entries`, a page holds at least one link (callers validate
    `max_bytes` against `MAX_LINK_BYTES`) and carries a cursor whenever more follow.
    """
    check_digest(digest)
    try:
        after = (0, 0, -1) if cursor is None else tuple(cursor_int(part) for part in cursor.split(":"))
        if len(after) != 3:
            raise ValueError(cursor)
    except (AttributeError, ValueError):
        raise InvalidInputError(f"bad asset link cursor {cursor!r}; pass a next_cursor from a previous page") from None
    rows = conn.execute(
        "SELECT s.uuid, l.seq, l.ordinal, l.media_kind, l.session_id FROM event_assets l "
        "JOIN sessions s ON s.id = l.session_id "
        "WHERE l.digest = ? AND (l.session_id, l.seq, l.ordinal) > (?, ?, ?) "
        "ORDER BY l.session_id, l.seq, l.ordinal LIMIT ?",
        (digest, *after, limit + 1),
    ).fetchall()
    taken, next_cursor = take(
        rows, limit, max_bytes, lambda row: _LINK_BYTES + len(row[0]) + len(row[3]),
        lambda row: f"{row[4]}:{row[1]}:{row[2]}", at_least_one=True,
    )
    return AssetLinkPage([AssetLink(*row[:4]) for row in taken], next_cursor)


def totals(conn: apsw.Connection) -> AssetTotals:
    """Count catalog entries, distinct files and their bytes."""
    entries, files, size = conn.execute(
        "SELECT (SELECT count(*) FROM assets), count(*), coalesce(sum(size), 0) "
        "FROM (SELECT digest, max(size) AS size FROM assets GROUP BY digest)"
    ).fetchone()
    return AssetTotals(entries, files, size)


def verify_page(
    conn: apsw.Connection, folder: AssetFolder, cursor: str | None, limit: int, max_hash_bytes: int
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
        problem, read = _check_group(conn, folder, digest, size, group)
        if problem:
            problems.append(AssetProblem(digest, kinds, problem))
        checked += len(group)
        hashed += read
        last = group[-1]
    done = last is not None and last == rows[-1]
    return AssetVerification(checked, hashed, problems, None if done or last is None else f"{last[0]}:{last[1]}")


def _check_group(
    conn: apsw.Connection, folder: AssetFolder, digest: str, size: int, group: list[tuple]
) -> tuple[str | None, int]:
    """(the problem of one digest's entries and file, or None; the bytes hashed: 0 unless its content was read)."""
    if any(r[2] != size for r in group):
        return f"catalog entries disagree on the size ({sorted({r[2] for r in group})})", 0
    read = 0
    try:
        files = folder.require()
        with open_checked(files, digest, size) as file:  # type, owner, mode and size: nothing read yet
            read = size
            check_content(file, digest, size, files.path / digest)
    except (AssetError, FileSystemError) as exc:
        still = conn.execute("SELECT 1 FROM assets WHERE digest = ?", (digest,)).fetchone()
        return (str(exc) if still else None), read
    return None, read
