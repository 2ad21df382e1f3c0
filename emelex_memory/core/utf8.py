"""Text from callers that SQLite must bind: valid UTF-8 or refused with a typed error, never a `UnicodeEncodeError`.

A command-line argument or a file name that is not valid UTF-8 reaches Python
as a `str` holding lone surrogates (`os.fsdecode`'s "surrogateescape"), and
the driver cannot encode that. No stored ID, kind or path can equal such a
text, so a lookup by it finds nothing, and a workspace directory whose name
is not UTF-8 cannot be stored (workspace paths are TEXT).
"""

from __future__ import annotations

import os

from ..errors import InvalidInputError

SQLITE_NAMES = "SQLite opens files by UTF-8 names only"  # why a database path must be UTF-8 (`utf8_path`)


def is_utf8(value: object) -> bool:
    """False for a `str` that is not valid UTF-8 text (it holds a lone surrogate); True for anything else, which
    the driver binds or the caller's own checks refuse."""
    if type(value) is not str or value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_utf8(value: object, what: str) -> None:
    """Raise `InvalidInputError` naming `what` when `value` is a `str` that is not valid UTF-8 text."""
    if not is_utf8(value):
        raise InvalidInputError(f"{what} {value!r:.120} is not valid UTF-8 text; pass valid text")


def utf8_path(path: str | bytes, what: str = "the workspace path",
              why: str = "Emelex stores workspace paths as UTF-8 text") -> str:
    """A path as text; raise `InvalidInputError` naming `what` (and `why` it must be UTF-8) when it is not valid
    UTF-8: it could not be stored, or SQLite could not open a file by it."""
    text = os.fsdecode(path)
    if not is_utf8(text):
        raise InvalidInputError(
            f"{what} {text!r:.300} is not valid UTF-8, and {why}: rename the directory (or the parent whose name is "
            "not UTF-8) to a UTF-8 name; nothing was written"
        )
    return text
