"""Checks for the positions and cursors callers pass back to paged reads.

A position or cursor is valid only if some page could have returned it: its
integers are within what SQLite stores (signed 64 bits) and not negative, its
floats are finite. Anything else is an `InvalidInputError` before any SQL runs,
never an `OverflowError` from the driver or a silently empty page.
"""

from __future__ import annotations

import math
import re

from ..errors import InvalidInputError

MAX_SQL_INT = 2**63 - 1  # the largest integer SQLite stores
_DECIMAL = re.compile(r"[0-9]{1,19}\Z")


def check_position(value: object, what: str) -> int:
    """Return `value` if it is an int (not a bool) in 0..`MAX_SQL_INT`; raise `InvalidInputError` naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SQL_INT:
        raise InvalidInputError(f"{what} must be an integer between 0 and {MAX_SQL_INT}, got {value!r:.80}")
    return value


def cursor_int(text: str) -> int:
    """Parse one decimal integer part of a cursor (0..`MAX_SQL_INT`); raise `ValueError` otherwise."""
    if not _DECIMAL.match(text) or int(text) > MAX_SQL_INT:
        raise ValueError(text)
    return int(text)


def cursor_float(text: str) -> float:
    """Parse one finite float part of a cursor; raise `ValueError` for NaN, an infinity or anything else."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value
