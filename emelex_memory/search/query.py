"""Turning a person's or an agent's query text into a safe FTS5 MATCH expression.

User text never reaches FTS5's query syntax: the query is cut into words (runs of letters and digits, what the
index's unicode61 tokenizer keeps), and each word is quoted as an FTS5 string, so operators (`AND`, `NEAR`, `*`,
`^`, `:`), quotes, parentheses and NUL are only separators.
"""

from __future__ import annotations

import re

from ..errors import InvalidInputError

MAX_QUERY_BYTES = 4096  # a query longer than this is refused; recall cuts its own query to this first
MAX_TERMS = 32  # distinct words of a query searched for; more are refused (recall keeps the first ones)
MAX_TERM_CHARS = 64  # a longer word is cut to this many characters
WORD = re.compile(r"[^\W_]+")  # a word of a query: a run of letters and digits


def query_terms(query: object, *, cut: bool = False) -> list[str]:
    """The distinct lowercase words of `query` (a str, or UTF-8 bytes), at most `MAX_TERMS`, in order.

    Raises `InvalidInputError` for a query that is not text, not valid UTF-8,
    longer than `MAX_QUERY_BYTES` bytes or with more than `MAX_TERMS` distinct
    words (with `cut`, only its first `MAX_QUERY_BYTES` bytes and first
    `MAX_TERMS` words are used instead), or without a word to search for.
    """
    if isinstance(query, (bytes, bytearray)):
        try:
            query = bytes(query).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError("the search query is not valid UTF-8; pass text") from None
    if not isinstance(query, str):
        raise InvalidInputError(f"a search query is text, not {type(query).__name__}")
    try:
        encoded = query.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError("the search query is not valid UTF-8 (it holds a lone surrogate); pass text") from None
    if len(encoded) > MAX_QUERY_BYTES:
        if not cut:
            raise InvalidInputError(
                f"the search query is {len(encoded)} bytes; a query is at most {MAX_QUERY_BYTES} bytes: search for "
                "a few distinctive words"
            )
        query = encoded[:MAX_QUERY_BYTES].decode("utf-8", errors="ignore")
    terms: dict[str, None] = {}
    for match in WORD.finditer(query):
        term = match.group().lower()[:MAX_TERM_CHARS]
        if term not in terms and len(terms) == MAX_TERMS:
            if cut:
                break
            count = len({m.group().lower()[:MAX_TERM_CHARS] for m in WORD.finditer(query)})
            raise InvalidInputError(
                f"the search query has {count} distinct words; at most {MAX_TERMS} are searched for: keep the few "
                "most distinctive"
            )
        terms.setdefault(term, None)
    if not terms:
        raise InvalidInputError("the search query holds no word to search for (letters or digits); give one")
    return list(terms)
