"""Reading a JSON Lines source from where its last import ended: the digest of what was read before, then each
complete line after it, parsed. A last line without its newline is not read yet (the agent may be writing it): the
next import of the grown file reads it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from emelex_memory import UnreadableSourceError

MAX_LINE_BYTES = 64 * 1024 * 1024  # a longer line is damaged, not read into memory whole


@dataclass(frozen=True)
class Line:
    """One complete line: its 1-based number, the byte offset just after it, and its object (None when damaged, with
    `problem` saying why)."""

    number: int
    end: int
    obj: dict[str, Any] | None
    problem: str | None = None


def open_source(path: str) -> BinaryIO:
    """Open `path` for reading without following a symlink at its last component; a typed error if it cannot be."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UnreadableSourceError(f"cannot read {path}: {exc.strerror or exc}; check the path and its permissions") \
            from None
    return os.fdopen(fd, "rb")


def hash_prefix(handle: BinaryIO, end: int, path: str) -> tuple[Any, Iterator[Line]]:
    """Hash the first `end` bytes of `handle` (SHA-256) and yield their lines as `Line`s while doing so (for readers
    that rebuild their state); the hash is complete once the iterator is exhausted. Raises `UnreadableSourceError`
    when the file is shorter than `end`."""
    h = hashlib.sha256()

    def lines() -> Iterator[Line]:
        handle.seek(0)
        offset, number = 0, 0
        while offset < end:
            raw = handle.readline(min(MAX_LINE_BYTES, end - offset))
            if not raw:
                raise _shorter(path, end)
            h.update(raw)
            offset += len(raw)
            number += 1
            yield parse(raw, number, offset)

    return h, lines()


def _shorter(path: str, end: int) -> Exception:
    from emelex_memory import SourceRewrittenError

    return SourceRewrittenError(
        f"{path} is now shorter than the {end} bytes an earlier import read: it was rewritten, not appended to; "
        "delete the imported Session (`emelex memory sessions delete`) to import it anew"
    )


def read_after(handle: BinaryIO, start: int, first_number: int, h: Any, stop: int | None = None) -> Iterator[Line]:
    """Each complete line from byte `start` on (numbered from `first_number`), updating `h` with its bytes; stops
    before an unterminated last line, and at byte `stop` when given."""
    handle.seek(start)
    offset, number = start, first_number - 1
    while stop is None or offset < stop:
        raw = handle.readline(MAX_LINE_BYTES if stop is None else min(MAX_LINE_BYTES, stop - offset))
        if not raw.endswith(b"\n"):
            if len(raw) >= MAX_LINE_BYTES:
                number += 1
                yield Line(number, offset + len(raw), None, f"longer than {MAX_LINE_BYTES} bytes")
            return
        h.update(raw)
        offset += len(raw)
        number += 1
        yield parse(raw, number, offset)


def parse(raw: bytes, number: int, end: int) -> Line:
    """The `Line` of `raw` bytes: an object, or None with the problem (not UTF-8, not JSON, not an object)."""
    text = raw.strip()
    if not text:
        return Line(number, end, {})
    try:
        obj = json.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        return Line(number, end, None, "not UTF-8 text")
    except (ValueError, RecursionError) as exc:
        return Line(number, end, None, f"not JSON ({exc.__class__.__name__}: {str(exc)[:80]})")
    if not isinstance(obj, dict):
        return Line(number, end, None, "not a JSON object")
    return Line(number, end, obj)
