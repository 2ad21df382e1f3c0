"""The workspace map: a bounded listing of what a workspace holds, recorded once before a chat Session's first
round so that the model knows which files exist without calling `list_dir`.

`workspace_map` reads the tree breadth-first (every top-level entry before
any entry one level down, and so on, to `MAX_DEPTH` levels) through the
turn's `WorkspaceWalk`, never follows a symlink, skips version-control and
cache directories (`workspace.SKIPPED_DIRS`), reads at most `MAX_DIRS` directories, and keeps what fits in a budget of
characters; the kept entries are then printed in path order, one per line,
each with its path relative to the workspace (so the model can copy it into
a tool's arguments) and a file's size. It is a pure function of the tree it
reads; the context source records its text, and a resumed Session replays
that record instead of reading the tree again.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path

from emelex_workers.host.notes import WORKSPACE_FILES, ContextNote, directory_files, quote

from .context import ContextRequest
from .workspace import SKIPPED_DIRS, WorkspaceWalk

SOURCE = "workspace_map"  # the context source's name in a snapshot's `context`
MAP_CHARS = 1600  # the map's text at most (about 400 tokens of the default model)
MAX_DEPTH = 3  # levels listed: the top level is 1
MAX_DIRS = 200  # directories read at most
HEADER = "Workspace map (what the workspace holds; paths relative to it, file sizes in bytes):"
EMPTY = "The workspace is empty."
MORE = "(the map stops here: list_dir shows any directory in full)"


def _name(raw: str) -> str:
    """A file name as text: bytes that are not UTF-8 read as U+FFFD."""
    return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _line(path: str, info: os.stat_result, note: str = "") -> str:
    if stat.S_ISDIR(info.st_mode):
        return f"{path}/" + (f" ({note})" if note else "")
    if stat.S_ISLNK(info.st_mode):
        return f"{path} (symlink)"
    if stat.S_ISREG(info.st_mode):
        return f"{path} ({info.st_size} bytes)"
    return f"{path} (special file)"


def _entries(walk: WorkspaceWalk, parts: tuple[str, ...]) -> list[tuple[str, os.stat_result]] | None:
    """The entries of directory `parts` (its path's components) as `walk` read them, sorted by name, with their own
    (not followed) status; None when it or an entry's status could not be read."""
    listing = walk.listing("/".join(parts))
    if not isinstance(listing, list) or any(info is None for _, info in listing):
        return None
    return listing
def workspace_map(root: str | Path, *, budget_chars: int = MAP_CHARS, walk: WorkspaceWalk | None = None) -> dict:
    """The map of the workspace at `root`, read through `walk` (the turn's; a walk of its own when None):
    `{"text", "entries", "complete"}`.

    `text` is `HEADER` then one line per kept entry, in path order ("src/",
    "src/app.py (120 bytes)", "link (symlink)", "logs/ (empty)", a directory
    deeper than `MAX_DEPTH` or past `MAX_DIRS` as "a/b/c/ (not listed)"),
    ending with `MORE` when anything was left out, at most `budget_chars`
    characters in all; `EMPTY` for an
    empty workspace. `entries` counts the kept lines, `complete` says
    nothing was left out. A directory that cannot be read is listed as such;
    the function itself never raises for the tree's content (`OSError` only
    when `root` itself cannot be read).
    """
    root = Path(root)
    walk = WorkspaceWalk(root) if walk is None else walk
    top = _entries(walk, ())
    if top is None:
        raise OSError(f"the workspace {root} cannot be read")
    room = budget_chars - len(HEADER) - len(MORE) - 2  # the newlines after the header and before MORE
    kept: list[tuple[tuple[str, ...], str]] = []
    complete = True
    queue: deque[tuple[tuple[str, ...], list[tuple[str, os.stat_result]]]] = deque([((), top)])
    read = 1
    while queue:
        parts, listing = queue.popleft()
        for raw, info in listing:
            if stat.S_ISDIR(info.st_mode) and raw in SKIPPED_DIRS:
                continue
            path = (*parts, _name(raw))
            children, note = None, ""
            if stat.S_ISDIR(info.st_mode):
                if len(path) >= MAX_DEPTH or read >= MAX_DIRS:
                    complete, note = False, "not listed"
                else:
                    children = _entries(walk, (*parts, raw))
                    read += 1
                    note = "could not be read" if children is None else "" if children else "empty"
            line = _line("/".join(path), info, note)
            if len(line) + 1 > room:
                complete = False
                queue.clear()
                break
            room -= len(line) + 1
            kept.append((path, line))
            if children:
                queue.append((path, children))
    if not kept:
        return {"text": EMPTY if complete else f"{HEADER}\n{MORE}", "entries": 0, "complete": complete}
    lines = [line for _, line in sorted(kept)]
    text = "\n".join([HEADER, *lines, *([] if complete else [MORE])])
    files = [path for path, line in sorted(kept) if line.endswith(" bytes)")]
    return {"text": text, "entries": len(lines), "complete": complete, "quotes": _quotes(files, complete)}


def _quotes(files: list[tuple[str, ...]], complete: bool) -> list[str]:
    """The map's quotes (an answer may quote them, `quotes`): every file it lists, then each directory's files."""
    if not files:
        return []
    more = "" if complete else ", ..."
    quotes = [quote(WORKSPACE_FILES, ", ".join("/".join(path) for path in files) + more)]
    directories: dict[tuple[str, ...], list[str]] = {}
    for path in files:
        directories.setdefault(path[:-1], []).append(path[-1])
    quotes += [quote(directory_files("/".join(parent)), ", ".join(names) + more)
               for parent, names in directories.items() if parent]
    return quotes


def workspace_map_source(request: ContextRequest) -> ContextNote | None:
    """The "workspace_map" context source: `workspace_map` of the Session's workspace (read through the turn's
    walk, `request.walk`), recorded before its first round; None (nothing recorded) when the workspace itself cannot
    be read."""
    try:
        return workspace_map(request.workspace, walk=request.walk)
    except OSError:
        return None
