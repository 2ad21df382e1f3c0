"""Resolving an abbreviated public ID, as git resolves an abbreviated commit: a unique prefix names one row.

Session and job IDs are UUIDs, stored lowercase in a UNIQUE column. A full
ID is looked up exactly; anything else is a prefix of at least
`MIN_ID_PREFIX` characters, matched case-insensitively by one range query
over that column's index (`uuid >= prefix AND uuid < successor`), which reads
at most `MAX_ID_CANDIDATES + 1` index entries however large the table is.
"""

from __future__ import annotations


import apsw

from ..errors import AmbiguousIdError, EmelexError, InvalidInputError
from .utf8 import is_utf8


MIN_ID_PREFIX = 4
MAX_ID_CANDIDATES = 10
MAX_ID_CHARS = 64  # longer than any ID: refused before any query


def resolve_id(
    conn: apsw.Connection, table: str, text: object, what: str, missing: type[EmelexError], hint: str
) -> str:
    """The one `uuid` of `table` equal to `text` or starting with it (at least `MIN_ID_PREFIX` characters).

    Raises `missing(...)` naming `what` and `hint` when nothing matches,
    `AmbiguousIdError` for a shorter prefix or one matching several IDs (the
    message lists up to `MAX_ID_CANDIDATES` of them), and
    `InvalidInputError` for a non-string or overlong argument.
    """
    if not isinstance(text, str) or not text or len(text) > MAX_ID_CHARS:
        raise InvalidInputError(f"a {what} ID is a string of 1-{MAX_ID_CHARS} characters, got {text!r:.80}")
    if not is_utf8(text):  # a non-UTF-8 argument (from the command line) names nothing and cannot be bound
        raise missing(f"no {what} {text!r}; {hint}")
    prefix = text.lower()
    if conn.execute(f"SELECT 1 FROM {table} WHERE uuid = ?", (prefix,)).fetchone():
        return prefix
    if len(prefix) < MIN_ID_PREFIX:
        raise AmbiguousIdError(
            f"{what} ID prefix {text!r} is too short: give at least {MIN_ID_PREFIX} characters; {hint}"
        )
    last = ord(prefix[-1])
    found = [] if last >= 0x10FFFF else [r[0] for r in conn.execute(
        f"SELECT uuid FROM {table} WHERE uuid >= ? AND uuid < ? ORDER BY uuid LIMIT ?",
        (prefix, prefix[:-1] + chr(last + 1), MAX_ID_CANDIDATES + 1),
    )]
    if len(found) == 1:
        return found[0]
    if not found:
        raise missing(f"no {what} {text!r}; {hint}")
    more = ", ..." if len(found) > MAX_ID_CANDIDATES else ""
    raise AmbiguousIdError(
        f"{what} ID prefix {text!r} is ambiguous: it matches {', '.join(found[:MAX_ID_CANDIDATES])}{more}; "
        "give more characters"
    )
