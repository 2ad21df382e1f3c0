"""`emelex memory import`: other agents' histories become Emelex Sessions, one source at a time.

For each source (a JSON Lines file, or one Session of an OpenAI Agents SDK database) the importer reads what the
store last recorded of it (`store.latest_import`), checks that the source still begins with what that run read (its
digest), reads the lines after it once to plan the run (refusing a damaged line before anything is written), then
hands the same lines, read again and converted as they go, to `store.import_history`, which writes them in one
transaction and queues the Session's distillation. So re-importing an unchanged file writes nothing, a grown file
adds only its new lines, and a process killed during an import leaves no part of that run.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from emelex_memory import (
    EmelexError,
    ImportedEvent,
    ImportSource,
    MemoryStore,
    SourceRewrittenError,
    UnreadableSourceError,
)

from . import agents_sdk, claude_code, codex, generic
from .events import Conversion, ImportOptions, SourceResult, imported_result, require_workspace
from .lines import Line, hash_prefix, open_source, read_after

READERS: dict[str, ModuleType] = {m.FORMAT: m for m in (claude_code, codex, generic)}
FORMATS = ("auto", *READERS, agents_sdk.FORMAT)
SQLITE_MAGIC = b"SQLite format 3\x00"
EXPORT_TYPE = "emelex-export"
SNIFF_LINES = 32  # non-blank lines read to tell a JSON Lines source's format


def sources(path: str) -> list[str]:
    """The files an import of `path` reads: the file itself, or every `*.jsonl` file below a directory, in name
    order. Raises `UnreadableSourceError` for a path that is neither."""
    p = Path(path)
    if p.is_dir():
        return sorted(str(f) for f in p.rglob("*.jsonl") if f.is_file() and not f.is_symlink())
    if p.is_file():
        return [str(p)]
    raise UnreadableSourceError(f"{path} is neither a file nor a directory; name a history file or a folder of them")


def sniff(path: str) -> tuple[str, list[dict]]:
    """("sqlite", []) for a SQLite database, else ("jsonl", the objects of its first non-blank lines, at most
    `SNIFF_LINES`). A damaged line among them is left to the reader (it refuses or skips it), unless it is the
    first: then the format cannot be told, and `UnreadableSourceError` names that line."""
    objs: list[dict] = []
    with open_source(path) as handle:
        if handle.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            return "sqlite", objs
        for line in read_after(handle, 0, 1, _NullHash()):
            if line.obj is None and not objs:
                raise UnreadableSourceError(f"{path}:{line.number}: {line.problem}; fix or remove that line")
            if line.obj:
                objs.append(line.obj)
                if len(objs) == SNIFF_LINES:
                    break
    return "jsonl", objs


class UnknownFormatError(UnreadableSourceError):
    """No line among a file's first ones has the shape of a history this importer reads: name its format with
    `--format` if it is one."""


class _NullHash:
    def update(self, data: bytes) -> None:
        pass


def detect(objs: list[dict], path: str) -> str:
    """The format of a JSON Lines source whose first non-blank lines are `objs`: an export by its first line, else
    the first line a reader recognises (agents lead their files with records of their own, whose types come and
    go); `UnreadableSourceError` if none does."""
    if objs and objs[0].get("type") == EXPORT_TYPE:
        return EXPORT_TYPE
    for obj in objs:
        for name, reader in READERS.items():
            if reader.detect(obj):
                return name
    raise UnknownFormatError(
        f"{path}: cannot tell its format from its first lines; name it with --format ({', '.join(FORMATS[1:])})"
    )


def _key(fmt: str, path: str, conv: Conversion) -> str:
    """The source's identity across runs: the file name (Claude Code and Codex name each session's file by its ID),
    the generic header's `session`, else the absolute path."""
    if fmt in (claude_code.FORMAT, codex.FORMAT):
        return Path(path).name
    return conv.key or os.path.abspath(path)


def _damaged(path: str, line: Line) -> UnreadableSourceError:
    return UnreadableSourceError(
        f"{path}:{line.number}: {line.problem}; nothing of this file was imported: fix or remove that line, or pass "
        "--skip-damaged to import the rest"
    )


def _feed(reader: ModuleType, conv: Conversion, line: Line, path: str, skip_damaged: bool) -> list[ImportedEvent]:
    if line.obj is None:
        if not skip_damaged:
            raise _damaged(path, line)
        conv.skipped += 1
        return []
    try:
        events = reader.feed(conv, line.obj, line.number)
    except generic.GenericLineError as exc:
        if not skip_damaged:
            raise _damaged(path, Line(line.number, line.end, None, str(exc))) from None
        events = None
    if events is None:
        conv.skipped += 1
        return []
    return events


def import_jsonl(store: MemoryStore, path: str, fmt: str, options: ImportOptions) -> SourceResult:
    """Import what is new in the JSON Lines history `path` of format `fmt` (not "auto")."""
    reader = READERS[fmt]
    path = os.path.abspath(path)
    conv = Conversion(store.settings.max_event_bytes)
    with open_source(path) as handle:
        first_line = next(read_after(handle, 0, 1, _NullHash()), None)
        if fmt == generic.FORMAT and first_line is not None and first_line.obj and "emelex_history" in first_line.obj:
            conv.key = first_line.obj.get("session") if isinstance(first_line.obj.get("session"), str) else None
        key = _key(fmt, path, conv)
        latest = store.latest_import(fmt, key)
        start, number = (0, 1) if latest is None else (latest.byte_end, latest.last_line + 1)
        h, before = hash_prefix(handle, start, path)
        for line in before:  # rebuild the reader's state (tool names, workspace, title) from what was imported
            _feed(reader, conv, line, path, True)
        if latest is not None and h.hexdigest() != latest.prefix_digest:
            raise SourceRewrittenError(
                f"{path} changed in lines 1-{latest.last_line}, which an earlier import read (Session "
                f"{latest.session_id}): it was rewritten, not appended to; delete that Session (`emelex memory sessions "
                "delete`) to import the file anew"
            )
        at_start = copy.deepcopy(conv)
        events, end, last, known = 0, start, number - 1, False
        for line in read_after(handle, start, number, h):
            events += len(_feed(reader, conv, line, path, options.skip_damaged))
            end, last = line.end, line.number
            known = known or bool(line.obj) and reader.detect(line.obj)
        digest = h.hexdigest()
    if last < number:
        return SourceResult(path, fmt, "unchanged", session_id=latest and latest.session_id)
    if latest is None and events == 0:
        if not known:  # a --format that names another format than the file's
            raise UnknownFormatError(f"{path}: no line of it is a {fmt} history line; name its format with --format "
                                     "(auto tells it from its lines)")
        return SourceResult(path, fmt, "unchanged", "no conversation in it yet", skipped=conv.skipped)
    workspace = require_workspace(options.workspace or conv.workspace, path, named=options.workspace is not None)
    at_start.date_undated(conv, path)
    source = ImportSource(fmt, key, path, number, last, end, digest, conv.skipped - at_start.skipped,
                          conv.cut - at_start.cut)

    def convert() -> Iterator[ImportedEvent]:  # the second read, inside the import's transaction
        with open_source(path) as again:
            prefix, lines = hash_prefix(again, start, path)
            for _ in lines:
                pass
            for line in read_after(again, start, number, prefix, stop=end):
                yield from _feed(reader, at_start, line, path, options.skip_damaged)
            if prefix.hexdigest() != digest:
                raise SourceRewrittenError(f"{path} changed while it was being imported; nothing was imported: "
                                           "import it again")

    outcome = store.import_history(workspace, source, convert(), planned_from=latest,
                                   title=conv.display_title(Path(path).stem),
                                   new_workspace=options.new_workspace)
    return imported_result(path, fmt, outcome, source)


def import_source(store: MemoryStore, path: str, options: ImportOptions,
                  restore_export: Callable[[MemoryStore, str], list[SourceResult]] | None = None, *,
                  walked: bool = False) -> list[SourceResult]:
    """Import one file (all of an Agents SDK database's Sessions, or one history file); a refusal is a "refused"
    result naming its reason, never an exception (other files go on). A file found by walking a folder (`walked`)
    whose format cannot be told is no history but another tool's file kept beside them: it is "skipped"."""
    fmt = options.format
    try:
        kind, leading = sniff(path)
        if kind == "sqlite" or fmt == agents_sdk.FORMAT:
            return agents_sdk.import_database(store, path, options)
        if fmt == "auto":
            fmt = detect(leading, path)
        if fmt == EXPORT_TYPE:
            if restore_export is None:
                raise UnreadableSourceError(f"{path} is an Emelex export; import it on its own")
            return restore_export(store, path)
        return [import_jsonl(store, path, fmt, options)]
    except EmelexError as exc:
        if walked and isinstance(exc, UnknownFormatError):
            return [SourceResult(os.path.abspath(path), fmt, "skipped", "no line of it has the shape of a history")]
        return [SourceResult(os.path.abspath(path), fmt, "refused", str(exc))]
