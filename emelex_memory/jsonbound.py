"""A capped, streaming JSON serializer producing Emelex's canonical encoding.

Canonical encoding (what is stored, and what digests are computed over):
UTF-8, object keys sorted by code point, no insignificant whitespace
(`,` and `:` separators), non-ASCII characters written as themselves, the
escapes of Python's `json` module for control characters, `"` and `\\`,
integers in decimal, floats as Python's shortest round-trip `repr`, and
`true`/`false`/`null`. NaN and Infinity are refused, as are lone surrogates,
non-string object keys and values other than dict, list, tuple, str, int,
float, bool and None.

Encoding stops as soon as the byte cap or the depth cap is exceeded, so an
oversized value is never fully materialised.
"""

from __future__ import annotations

from json.encoder import encode_basestring  # type: ignore[attr-defined]

from .errors import JsonNonFiniteError, JsonTooDeepError, JsonTooLargeError, JsonUnencodableError

_INF = float("inf")


def encode_canonical(value: object, *, max_bytes: int, max_depth: int, what: str = "value") -> bytes:
    """Return the canonical JSON bytes of `value`, or raise a typed error.

    Raises `JsonTooLargeError` past `max_bytes`, `JsonTooDeepError` when
    containers nest more than `max_depth` levels, `JsonNonFiniteError` for
    NaN/Infinity and `JsonUnencodableError` for anything else JSON cannot hold.
    `what` names the value in messages (e.g. "event 2 of the turn").
    """
    parts: list[str] = []
    append = parts.append
    size = 0

    def grow(n: int) -> None:
        nonlocal size
        size += n
        if size > max_bytes:
            raise JsonTooLargeError(f"{what} is larger than its cap of {max_bytes} bytes")

    def text(s: str) -> None:
        encoded = encode_basestring(s)
        if encoded.isascii():
            grow(len(encoded))
        else:
            try:
                grow(len(encoded.encode("utf-8")))
            except UnicodeEncodeError:
                raise JsonUnencodableError(f"{what} contains text that is not valid UTF-8 (a lone surrogate)") from None
        append(encoded)

    def emit(v: object, depth: int) -> None:
        if isinstance(v, str):
            text(v)
        elif v is None or v is True or v is False:
            token = "null" if v is None else "true" if v else "false"
            grow(len(token))
            append(token)
        elif isinstance(v, int):
            token = int.__repr__(v)
            grow(len(token))
            append(token)
        elif isinstance(v, float):
            if v != v or v in (_INF, -_INF):
                raise JsonNonFiniteError(f"{what} contains {v!r}; JSON has no NaN or Infinity")
            token = float.__repr__(v)
            grow(len(token))
            append(token)
        elif isinstance(v, dict):
            if depth >= max_depth:
                raise JsonTooDeepError(f"{what} nests deeper than {max_depth} levels")
            for key in v:
                if not isinstance(key, str):
                    raise JsonUnencodableError(f"{what} has a non-string object key {key!r}")
            grow(1 + 2 * len(v) if v else 2)  # braces, colons and commas
            append("{")
            first = True
            for key in sorted(v):
                if not first:
                    append(",")
                first = False
                text(key)
                append(":")
                emit(v[key], depth + 1)
            append("}")
        elif isinstance(v, (list, tuple)):
            if depth >= max_depth:
                raise JsonTooDeepError(f"{what} nests deeper than {max_depth} levels")
            grow(1 + len(v) if v else 2)  # brackets and commas
            append("[")
            first = True
            for item in v:
                if not first:
                    append(",")
                first = False
                emit(item, depth + 1)
            append("]")
        else:
            raise JsonUnencodableError(f"{what} contains a {type(v).__name__}, which is not a JSON value")

    emit(value, 0)
    data = "".join(parts).encode("utf-8")
    if len(data) > max_bytes:
        raise JsonTooLargeError(f"{what} is larger than its cap of {max_bytes} bytes")
    return data
