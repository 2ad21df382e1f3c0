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
oversized value is never fully materialised. Two encoders produce the same
bytes: a plain value (exact built-in types only) whose size bound, computed by
a walk that stops at the cap, fits the cap is encoded in one call of the C
encoder behind Python's `json` module; anything else, and every refusal, goes
through the streaming encoder here, which names what is wrong.
"""

from __future__ import annotations

from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

from ..errors import JsonNonFiniteError, JsonTooDeepError, JsonTooLargeError, JsonUnencodableError

_INF = float("inf")
_NEG_INF = -_INF


class _Refused(Exception):
    """Raised inside the encoder; `encode_canonical_text` turns it into the typed error naming the value."""

    def __init__(self, error: type[Exception], detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


def _refuse_default(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _c_encoder():
    """The C encoder set up for the canonical form, or None where this Python has none or another signature."""
    try:  # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
        return c_make_encoder(None, _refuse_default, encode_basestring, None, ":", ",", True, False, False)
    except TypeError:
        return None


_C_ENCODE = _c_encoder() if c_make_encoder is not None else None
_INT_BOUND = 1 << 63  # integers below this in magnitude print in at most 20 characters


def _room(v: object, depth: int, max_depth: int, room: int) -> int:
    """`room` minus an upper bound of `v`'s canonical UTF-8 size, or a negative number when `v` may not fit.

    Negative also when `v` holds anything but exact built-in JSON types, a
    non-finite float, a large integer or nests past `max_depth`: the streaming
    encoder then decides (and names the problem). A string of n characters
    encodes to at most 6n + 2 bytes (`\\u00XX` escapes, quotes). The walk stops
    once the bound passes the cap, so shared or cyclic structures cost at
    most as much as the cap allows.
    """
    t = type(v)
    if t is str:
        return room - 6 * len(v) - 2  # type: ignore[arg-type]
    if t is dict:
        if depth >= max_depth:
            return -1
        room -= 2 * len(v) + 2  # type: ignore[arg-type]
        for key, item in v.items():  # type: ignore[union-attr]
            if type(key) is not str:
                return -1
            if type(item) is str:
                room -= 6 * (len(key) + len(item)) + 4
            else:
                room = _room(item, depth + 1, max_depth, room - 6 * len(key) - 2)
            if room < 0:
                return -1
        return room
    if t is list or t is tuple:
        if depth >= max_depth:
            return -1
        room -= len(v) + 2  # type: ignore[arg-type]
        for item in v:  # type: ignore[union-attr]
            room = room - 6 * len(item) - 2 if type(item) is str else _room(item, depth + 1, max_depth, room)
            if room < 0:
                return -1
        return room
    if t is int:
        return room - 20 if -_INT_BOUND < v < _INT_BOUND else -1  # type: ignore[operator]
    if t is float:
        return room - 24 if v - v == 0.0 else -1  # type: ignore[operator]  # NaN and infinities fail this
    if v is None or t is bool:
        return room - 5
    return -1


def _too_large() -> _Refused:
    return _Refused(JsonTooLargeError, "is larger than its cap of {cap} bytes")


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
    return encode_bounded(value, max_bytes, max_depth) or encode_streaming(
        value, max_bytes=max_bytes, max_depth=max_depth, what=what
    )


def encode_bounded(value: object, max_bytes: int, max_depth: int) -> tuple[str, int] | None:
    """(canonical text, UTF-8 bytes) in one C encoder call when `value` provably fits the caps, else None.

    None means "ask `encode_streaming`": the value may be too large or too
    deep, holds something other than exact built-in JSON types, a non-finite
    float or a lone surrogate, or this Python has no C encoder. Never raises
    for any input.
    """
    if _C_ENCODE is None or _room(value, 0, max_depth, max_bytes) < 0:
        return None
    text = "".join(_C_ENCODE(value, 0))
    if text.isascii():
        return text, len(text)
    try:
        return text, len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None  # a lone surrogate: the streaming encoder refuses it and says where


def encode_streaming(value: object, *, max_bytes: int, max_depth: int, what: str = "value") -> tuple[str, int]:
    """`encode_canonical_text` through the streaming encoder alone (same result, typed errors, slower)."""
    parts: list[str] = []
    budget = [max_bytes]  # bytes still allowed; a one-item list so the recursion can update it cheaply
    try:
        _emit(value, 0, max_depth, parts.append, budget)
    except _Refused as refused:
        raise refused.error(f"{what} {refused.detail.format(cap=max_bytes)}") from None
    return "".join(parts), max_bytes - budget[0]


def _text(s: str, append, budget: list[int]) -> None:
    if len(s) + 2 > budget[0]:  # the escaped form is never shorter: refuse before copying a huge string
        raise _too_large()
    encoded = encode_basestring(s)
    if encoded.isascii():
        budget[0] -= len(encoded)
    else:
        try:
            budget[0] -= len(encoded.encode("utf-8"))
        except UnicodeEncodeError:
            raise _Refused(JsonUnencodableError, "contains text that is not valid UTF-8 (a lone surrogate)") from None
    if budget[0] < 0:
        raise _too_large()
    append(encoded)


def _emit(v: object, depth: int, max_depth: int, append, budget: list[int]) -> None:
    """Write `v` through `append`, charging every byte to `budget[0]`; exact types first, subclasses after."""
    t = type(v)
    if t is str:
        _text(v, append, budget)  # type: ignore[arg-type]
        return
    if t is dict or (t is not list and t is not tuple and isinstance(v, dict)):
        if depth >= max_depth:
            raise _Refused(JsonTooDeepError, f"nests deeper than {max_depth} levels")
        for key in v:  # type: ignore[union-attr]
            if type(key) is not str and not isinstance(key, str):
                raise _Refused(JsonUnencodableError, f"has a non-string object key {key!r}")
        n = len(v)  # type: ignore[arg-type]
        budget[0] -= 2 * n + 1 if n else 2  # braces, colons and commas
        if budget[0] < 0:
            raise _too_large()
        append("{")
        first = True
        for key in sorted(v):  # type: ignore[type-var]
            if first:
                first = False
            else:
                append(",")
            _text(key, append, budget)
            append(":")
            item = v[key]  # type: ignore[index]
            if type(item) is str:
                _text(item, append, budget)
            else:
                _emit(item, depth + 1, max_depth, append, budget)
        append("}")
        return
    if t is list or t is tuple or isinstance(v, (list, tuple)):
        if depth >= max_depth:
            raise _Refused(JsonTooDeepError, f"nests deeper than {max_depth} levels")
        n = len(v)  # type: ignore[arg-type]
        budget[0] -= n + 1 if n else 2  # brackets and commas
        if budget[0] < 0:
            raise _too_large()
        append("[")
        first = True
        for item in v:  # type: ignore[union-attr]
            if first:
                first = False
            else:
                append(",")
            _emit(item, depth + 1, max_depth, append, budget)
        append("]")
        return
    if v is None:
        token = "null"
    elif v is True:
        token = "true"
    elif v is False:
        token = "false"
    elif isinstance(v, int):
        try:
            token = int.__repr__(v)
        except ValueError:  # more digits than Python will convert (sys.get_int_max_str_digits)
            raise _Refused(JsonTooLargeError, "contains an integer too large to encode; store it as a string") from None
    elif isinstance(v, float):
        if v != v or v == _INF or v == _NEG_INF:
            raise _Refused(JsonNonFiniteError, f"contains {v!r}; JSON has no NaN or Infinity")
        token = float.__repr__(v)
    elif isinstance(v, str):
        _text(v, append, budget)
        return
    else:
        raise _Refused(JsonUnencodableError, f"contains a {type(v).__name__}, which is not a JSON value")
    budget[0] -= len(token)
    if budget[0] < 0:
        raise _too_large()
    append(token)
