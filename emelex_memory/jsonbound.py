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
    return encode_canonical_text(value, max_bytes=max_bytes, max_depth=max_depth, what=what)[0].encode("utf-8")


def encode_canonical_text(value: object, *, max_bytes: int, max_depth: int, what: str = "value") -> tuple[str, int]:
    """Like `encode_canonical`, but return the canonical JSON as text together with its exact UTF-8 byte length."""
    parts: list[str] = []
    append = parts.append
    room = max_bytes  # bytes still allowed; checked whenever it shrinks by a leaf or a container

    def too_large() -> JsonTooLargeError:
        return JsonTooLargeError(f"{what} is larger than its cap of {max_bytes} bytes")

    def text(s: str) -> None:
        nonlocal room
        if len(s) + 2 > room:  # the escaped form is never shorter: refuse before copying a huge string
            raise too_large()
        encoded = encode_basestring(s)
        if encoded.isascii():
            room -= len(encoded)
        else:
            try:
                room -= len(encoded.encode("utf-8"))
            except UnicodeEncodeError:
                raise JsonUnencodableError(f"{what} contains text that is not valid UTF-8 (a lone surrogate)") from None
        if room < 0:
            raise too_large()
        append(encoded)

    def emit(v: object, depth: int) -> None:
        nonlocal room
        if isinstance(v, str):
            text(v)
            return
        if v is None or v is True or v is False:
            token = "null" if v is None else "true" if v else "false"
        elif isinstance(v, int):
            try:
                token = int.__repr__(v)
            except ValueError:  # more digits than Python will convert (sys.get_int_max_str_digits)
                raise JsonTooLargeError(f"{what} contains an integer too large to encode; store it as a string") from None
        elif isinstance(v, float):
            if v != v or v in (_INF, -_INF):
                raise JsonNonFiniteError(f"{what} contains {v!r}; JSON has no NaN or Infinity")
            token = float.__repr__(v)
        elif isinstance(v, dict):
            if depth >= max_depth:
                raise JsonTooDeepError(f"{what} nests deeper than {max_depth} levels")
            for key in v:
                if not isinstance(key, str):
                    raise JsonUnencodableError(f"{what} has a non-string object key {key!r}")
            room -= 2 * len(v) + 1 if v else 2  # braces, colons and commas
            if room < 0:
                raise too_large()
            append("{")
            for i, (key, item) in enumerate(sorted(v.items())):
                if i:
                    append(",")
                text(key)
                append(":")
                if isinstance(item, str):
                    text(item)
                else:
                    emit(item, depth + 1)
            append("}")
            return
        elif isinstance(v, (list, tuple)):
            if depth >= max_depth:
                raise JsonTooDeepError(f"{what} nests deeper than {max_depth} levels")
            room -= len(v) + 1 if v else 2  # brackets and commas
            if room < 0:
                raise too_large()
            append("[")
            for i, item in enumerate(v):
                if i:
                    append(",")
                emit(item, depth + 1)
            append("]")
            return
        else:
            raise JsonUnencodableError(f"{what} contains a {type(v).__name__}, which is not a JSON value")
        room -= len(token)
        if room < 0:
            raise too_large()
        append(token)

    emit(value, 0)
    return "".join(parts), max_bytes - room
