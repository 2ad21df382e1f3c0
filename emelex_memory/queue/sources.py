"""Shape checks for job source descriptions, shared by the source validators of the built-in job kinds.

A kind registered with a source validator (`register_job_kind(..., validate=)`)
has every source checked before it is queued (nothing is written for a bad
one) and again before a worker runs it or reads it, so handlers and source
readers never meet a malformed source.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from ..errors import InvalidJobSourceError

MAX_SOURCE_INT = 2**63 - 1  # the largest integer SQLite stores
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}\Z")

# Field types: "id" an int >= 1, "id?" an int >= 1 or null, "count" an int >= 0, "digest" 64 lowercase hex digits,
# "flag" true or false.
_CHECKS = {
    "id": lambda v: _is_int(v) and v >= 1,
    "id?": lambda v: v is None or (_is_int(v) and v >= 1),
    "count": lambda v: _is_int(v) and v >= 0,
    "digest": lambda v: isinstance(v, str) and _HEX_DIGEST.match(v) is not None,
    "flag": lambda v: isinstance(v, bool),
}
_MEANING = {"id": "an integer >= 1", "id?": "null or an integer >= 1", "count": "an integer >= 0",
            "digest": "64 lowercase hex digits", "flag": "true or false"}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value <= MAX_SOURCE_INT


def check_fields(
    source: object, kind: str, fields: Mapping[str, str], remedy: str, optional: Collection[str] = ()
) -> None:
    """Raise `InvalidJobSourceError` unless `source` is a mapping with exactly `fields` (name -> type, see `_CHECKS`),
    of which those named in `optional` may be absent (sources recorded before they existed).

    The message names the kind, the first problem and ends with `remedy`.
    """

    def bad(problem: str) -> InvalidJobSourceError:
        return InvalidJobSourceError(f"a {kind} job source {problem}; {remedy}")

    if not isinstance(source, Mapping):
        raise bad("must be a JSON object")
    missing = sorted(set(fields) - set(source) - set(optional))
    if missing:
        raise bad(f"lacks {', '.join(missing)}")
    extra = sorted(str(k) for k in set(source) - set(fields))
    if extra:
        raise bad(f"has unknown fields {', '.join(extra)}")
    for name, kind_of in fields.items():
        if name in source and not _CHECKS[kind_of](source[name]):
            raise bad(f"field {name} must be {_MEANING[kind_of]}, got {source[name]!r:.80}")
