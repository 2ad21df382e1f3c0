"""A producer: which plugin wrote a Summary or a Knowledge version, as its provenance records it.

A producer is a small JSON object with string values: `plugin` (the entry-point name), `distribution` and
`version` (the installed package it came from), `kind` ("summarizer" or "distiller"), `name` (the summarizer's or
distiller's) and `mode` (how it worked, e.g. "extractive"; may be absent). The worker builds it; the core checks
its shape (`check_producer`), stores it as canonical JSON and reads it back (`producer_from`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInputError

PRODUCER_FIELDS = ("plugin", "distribution", "version", "kind", "name", "mode")
MAX_FIELD_CHARS = 200


def check_producer(producer: object) -> dict[str, str] | None:
    """`producer` as a plain dict when it is None or a mapping of `PRODUCER_FIELDS` (`plugin`, `kind` and `name`
    required) to strings of 1-200 characters; else `InvalidInputError`."""
    if producer is None:
        return None
    if not isinstance(producer, Mapping):
        raise InvalidInputError(f"a producer is a mapping of {', '.join(PRODUCER_FIELDS)}, got {type(producer).__name__}")
    unknown = sorted(set(producer) - set(PRODUCER_FIELDS), key=str)
    missing = [f for f in ("plugin", "kind", "name") if f not in producer]
    if unknown or missing:
        raise InvalidInputError(f"a producer has the fields {', '.join(PRODUCER_FIELDS)} (plugin, kind and name "
                                f"required); got {'unknown ' + repr(unknown) if unknown else 'no ' + repr(missing)}")
    for key, value in producer.items():
        if not isinstance(value, str) or not 1 <= len(value) <= MAX_FIELD_CHARS:
            raise InvalidInputError(f"a producer's {key} is a string of 1-{MAX_FIELD_CHARS} characters")
    return {k: producer[k] for k in PRODUCER_FIELDS if k in producer}


def producer_json(producer: Mapping[str, str] | None) -> str | None:
    """The stored form of a checked producer: canonical JSON, or None."""
    return None if producer is None else json.dumps(dict(producer), sort_keys=True, separators=(",", ":"))


def producer_from(text: str | None) -> dict[str, str] | None:
    """A stored producer read back (None when none was recorded, or when the stored text is not a JSON object)."""
    if text is None:
        return None
    try:
        value: Any = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def describe_producer(producer: Mapping[str, str] | None) -> str:
    """One phrase for a person: `summarizer 'notes' (extractive) of plugin 'notes' from emelex-notes 0.1.0`, or
    "not recorded"."""
    if not producer:
        return "not recorded"
    mode = f" ({producer['mode']})" if producer.get("mode") else ""
    origin = " ".join(p for p in (producer.get("distribution"), producer.get("version")) if p)
    return (f"{producer.get('kind', 'plugin')} {producer.get('name')!r}{mode} of plugin {producer.get('plugin')!r}"
            + (f" from {origin}" if origin else ""))
