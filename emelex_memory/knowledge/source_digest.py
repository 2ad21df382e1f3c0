"""The Knowledge source digest: what a Knowledge version's provenance says it was distilled from.

Not the compaction source digest (`sessions/prefix_digest.py`), which frames a
Session's replaced prefix for a Summary; this one covers any seq range
`first..last` of a Session's events and is what `KnowledgeSource.digest` holds.
"""

from __future__ import annotations

import hashlib

import apsw

SOURCE_DIGEST_DOMAIN = b"emelex/knowledge-source/v1\n"


def source_digest(conn: apsw.Connection, session_rowid: int, session_id: str, first: int, last: int) -> str | None:
    """The domain-separated SHA-256 of a Session's events `first..last`, or None if any seq is missing.

    Encoding: SHA-256 over `SOURCE_DIGEST_DOMAIN`, the Session UUID and a
    newline, then for each event in seq order the line
    `<seq> <kind> <byte count>\\n` followed by its canonical JSON payload.
    Callers bound the range's bytes before calling.
    """
    h = hashlib.sha256(SOURCE_DIGEST_DOMAIN)
    h.update(session_id.encode("ascii") + b"\n")
    expected = first
    for seq, kind, size, payload in conn.execute(
        "SELECT seq, kind, size, payload FROM events WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
        (session_rowid, first, last),
    ):
        if seq != expected:
            return None
        h.update(f"{seq} {kind} {size}\n".encode("ascii"))
        h.update(payload.encode("utf-8"))
        expected += 1
    return h.hexdigest() if expected == last + 1 else None

