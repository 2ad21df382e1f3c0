"""What every history reader shares: the events it makes, bounded to the store's per-event cap, and times."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from emelex_memory import ImportedEvent, UnreadableSourceError, WorkspaceMissingError

# Room left in an event for everything around a text (keys, the line number, JSON escapes of a cut text are counted).
_ROOM = 4096
CUT_MARK = "\n[cut at import: {n} more bytes]"
MAX_TITLE = 512  # characters of a Session title
FIRST_WORDS = 120  # characters of a user's first line that title a history without a title of its own


@dataclass
class Conversion:
    """The state of one source being read: its conversation's identity, workspace and title as its lines tell them
    (`title_rank`: how much the title's record is to be trusted, see `titled`), what its user said first, the tool
    names of calls seen (results name their call only), the newest time seen, and what was skipped or cut."""

    max_event_bytes: int
    key: str | None = None
    workspace: str | None = None
    title: str | None = None
    title_rank: int = 0
    first_words: str | None = None
    tools: dict[str, str] = field(default_factory=dict)
    last_time: float = 0.0
    first_time: float | None = None
    skipped: int = 0
    cut: int = 0

    def titled(self, title: object, rank: int) -> None:
        """Take `title` from a record of trust `rank` (higher wins; a later record of the same rank replaces an
        earlier one, as an agent retitles a conversation); blank or non-text titles are ignored."""
        if isinstance(title, str) and title.strip() and rank >= self.title_rank:
            self.title, self.title_rank = " ".join(title.split())[:MAX_TITLE], rank

    def display_title(self, fallback: str) -> str:
        """The Session's title: the source's own, else the first line of what its user said first, else
        `fallback`."""
        return self.title or self.first_words or fallback[:MAX_TITLE]

    def text(self, value: str) -> str:
        """`value`, cut (and counted) so an event holding it stays within the per-event cap."""
        cap = max(256, self.max_event_bytes - _ROOM)
        data = value.encode("utf-8", "replace")
        if len(json.dumps(value)) <= cap:
            return value
        self.cut += 1
        kept = data[: cap // 2].decode("utf-8", "ignore")  # JSON escapes can double a text's size
        return kept + CUT_MARK.format(n=len(data) - len(kept.encode("utf-8")))

    def value(self, value: Any) -> Any:
        """A JSON value (tool arguments, a structured output) as is when it fits the cap, else its text, cut."""
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            return self.text(repr(value))
        if len(text.encode("utf-8")) <= self.max_event_bytes - _ROOM:
            return value
        return {"text": self.text(text)}

    def when(self, stamp: Any) -> float:
        """Seconds since the epoch of an ISO 8601 time or a number (seconds, or milliseconds past 10^11); an absent
        or unreadable one is the newest time seen before it (the order of the lines stands)."""
        at = parse_time(stamp)
        if at is None:
            return self.last_time
        if self.first_time is None:
            self.first_time = at
        self.last_time = max(self.last_time, at)
        return at

    def date_undated(self, first_pass: Conversion, path: str) -> None:
        """Before the second read of a file: when no time was seen before its new lines, date the undated lines
        that lead them with the first time `first_pass` (the first read) found in the file, else with the file's
        modification time (when its last line was written; now, if the file cannot be read), never with the
        epoch."""
        if self.first_time is not None:
            return
        if first_pass.first_time is not None:
            self.last_time = first_pass.first_time
            return
        try:
            self.last_time = os.stat(path).st_mtime
        except OSError:
            self.last_time = time.time()

    def event(self, kind: str, payload: dict[str, Any], at: float, line: int, *, new_turn: bool = False) -> ImportedEvent:
        """An imported event whose payload also names the source line it came from."""
        if kind == "user" and self.first_words is None and isinstance(payload.get("text"), str):
            first = next((row.strip() for row in payload["text"].splitlines() if row.strip()), "")
            self.first_words = first[:FIRST_WORDS] or None
        return ImportedEvent(kind, {**payload, "line": line}, at, new_turn)


def parse_time(stamp: Any) -> float | None:
    """Seconds since the epoch of `stamp` (ISO 8601 text, naive meaning UTC, or a number), None if it is none."""
    if isinstance(stamp, bool):
        return None
    if isinstance(stamp, (int, float)) and math.isfinite(stamp) and stamp >= 0:
        return float(stamp) / 1000.0 if stamp > 1e11 else float(stamp)
    if isinstance(stamp, str) and 0 < len(stamp) <= 64:
        try:
            moment = datetime.fromisoformat(stamp.strip().replace("Z", "+00:00").replace(" ", "T", 1))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    return None


def block_text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its text blocks (`text`, `input_text`,
    `output_text`) joined by blank lines; other blocks (images, files) are named in brackets."""
    if isinstance(content, str):
        return content
    parts = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                kind = block.get("type")
                if isinstance(block.get("text"), str) and kind in (None, "text", "input_text", "output_text"):
                    parts.append(block["text"])
                elif kind in ("image", "input_image", "file", "input_file", "document"):
                    parts.append(f"[{kind}]")
    return "\n\n".join(p for p in parts if p)


@dataclass(frozen=True)
class SourceResult:
    """What became of one source: `outcome` is "imported", "unchanged", "skipped" (a file found in a folder that is
    no history) or "refused" (then `message` says why; nothing of it was written); the Session it went into, whether
    it was created, the lines read and events written, lines skipped (kinds not read) and events cut to the size cap,
    and the distillation job queued."""

    path: str
    format: str
    outcome: str
    message: str | None = None
    session_id: str | None = None
    created: bool = False
    first_line: int | None = None
    last_line: int | None = None
    events: int = 0
    skipped: int = 0
    cut: int = 0
    job_id: str | None = None


@dataclass(frozen=True)
class ImportOptions:
    """How to import: the format (`auto`: told by the first line of the source that has a reader's shape), the
    workspace to use instead of the one the source names, and whether a damaged line is skipped (`skip_damaged`)
    rather than refusing its source."""

    format: str = "auto"
    workspace: str | None = None
    skip_damaged: bool = False
    new_workspace: bool = False


def require_workspace(workspace: str | None, path: str, *, named: bool = False) -> str:
    """`workspace` when it is an existing directory; else a typed error saying what to pass. `named`: the directory
    is the one the caller named (`--workspace`), not the one the source records."""
    if workspace is None:
        raise UnreadableSourceError(
            f"{path} does not say which directory it was recorded in; pass --workspace DIR to import it there"
        )
    if not os.path.isdir(workspace):
        if named:
            raise WorkspaceMissingError(f"--workspace {workspace} does not exist (or is no directory); nothing of "
                                        f"{path} was imported: name an existing directory")
        raise WorkspaceMissingError(
            f"{path} was recorded in {workspace}, which does not exist (any more); nothing of it was imported: pass "
            "--workspace DIR to import it into another directory"
        )
    return workspace


def imported_result(path: str, fmt: str, outcome: Any, source: Any) -> SourceResult:
    """The `SourceResult` of a committed run (`store.import_history`'s `ImportOutcome` for `ImportSource` `source`)."""
    record = outcome.record
    written = 0 if record.last_seq is None else record.last_seq - record.first_seq + 1
    job = outcome.distillation.job.id if outcome.distillation is not None else None
    return SourceResult(path, fmt, "imported", None, outcome.session_id, outcome.created, source.first_line,
                        source.last_line, written, source.skipped, source.cut, job)
