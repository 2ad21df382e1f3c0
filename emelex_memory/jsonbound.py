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

import math
from json.encoder import encode_basestring  # type: ignore[attr-defined]

from .errors import JsonNonFiniteError, JsonTooDeepError, JsonTooLargeError, JsonUnencodableError


class _Writer:
    __slots__ = ("parts", "size", "cap", "what")

    def __init__(self, cap: int, what: str) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.cap = cap
        self.what = what

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.cap:
            raise JsonTooLargeError(f"{self.what} is larger than its cap of {self.cap} bytes")
        self.parts.append(chunk)


def _encode_str(value: str, what: str) -> bytes:
    try:
        return encode_basestring(value).encode("utf-8")
    except UnicodeEncodeError:
        raise JsonUnencodableError(f"{what} contains text that cannot be encoded as UTF-8 (lone surrogate)") from None


def _emit(value: object, out: _Writer, depth: int, max_depth: int) -> None:
    if value is None:
        out.write(b"null")
    elif value is True:
        out.write(b"true")
    elif value is False:
        out.write(b"false")
    elif isinstance(value, str):
        out.write(_encode_str(value, out.what))
    elif isinstance(value, int):
        out.write(int.__repr__(value).encode("ascii"))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise JsonNonFiniteError(f"{out.what} contains {value!r}; JSON has no NaN or Infinity")
        out.write(float.__repr__(value).encode("ascii"))
    elif isinstance(value, (list, tuple, dict)):
        if depth >= max_depth:
            raise JsonTooDeepError(f"{out.what} nests deeper than {max_depth} levels")
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise JsonUnencodableError(f"{out.what} has a non-string object key {key!r}")
            out.write(b"{")
            for i, key in enumerate(sorted(value)):
                if i:
                    out.write(b",")
                out.write(_encode_str(key, out.what))
                out.write(b":")
                _emit(value[key], out, depth + 1, max_depth)
            out.write(b"}")
        else:
            out.write(b"[")
            for i, item in enumerate(value):
                if i:
                    out.write(b",")
                _emit(item, out, depth + 1, max_depth)
            out.write(b"]")
    else:
        raise JsonUnencodableError(f"{out.what} contains a {type(value).__name__}, which is not a JSON value")


def encode_canonical(value: object, *, max_bytes: int, max_depth: int, what: str = "value") -> bytes:
    """Return the canonical JSON bytes of `value`, or raise a typed error.

    Raises `JsonTooLargeError` past `max_bytes`, `JsonTooDeepError` when
    containers nest more than `max_depth` levels, `JsonNonFiniteError` for
    NaN/Infinity and `JsonUnencodableError` for anything else JSON cannot hold.
    `what` names the value in messages (e.g. "event 2 of the turn").
    """
    out = _Writer(max_bytes, what)
    _emit(value, out, 0, max_depth)
    return b"".join(out.parts)
