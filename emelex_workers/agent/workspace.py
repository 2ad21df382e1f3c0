"""What exists in a workspace, read once per turn, and a round's path arguments narrowed to it.

A `WorkspaceWalk` is one reading of a workspace: each directory is read (its
names, and each entry's own status, never following a symlink) at most once,
when something first asks for it, and kept; every directory is opened one
component at a time from the workspace with `O_NOFOLLOW`, so a symlink swapped
in is never read through. A turn makes one walk and everything that looks at
the workspace during the turn asks it: the workspace map (`workspace_map`, on
a Session's first turn), the files a request names (`mentions`) and each
round's narrowed paths, so a turn walks the workspace once, with one list of
directories never walked into (`SKIPPED_DIRS`). A call that may have changed
the workspace makes the turn walk it again (`forget`).

`WorkspaceWalk.entries()` (and `scan(workspace)`, a walk of its own) lists the
workspace breadth-first, nearest entries first, at most `MAX_ENTRIES` of them:
names in sorted order per directory, never following a symlink (symlinks are
not listed: the tools refuse them), and skipping hidden entries (a name
starting with "."; so `.git`, `.venv` and a `.emelex` home), `SKIPPED_DIRS`,
names that are not printable UTF-8, the directories given in `exclude` (the
Emelex Home, by identity) and the contents of a directory with more than
`MAX_DIR_ENTRIES` entries (it is listed itself).

`narrow_path(schema, kind, entries)` is the schema a path argument is
generated under in one round: a restriction of `schema` (the recorded
authority's) to the entries of `kind`, or None when no entry is admissible.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections import deque
from collections.abc import Collection
from pathlib import Path

from emelex_workers.host.policies import WorkspaceEntries

from .schema import validate

MAX_ENTRIES = 200  # entries a round's grammar offers at most, nearest by depth first
MAX_DIR_ENTRIES = 1000  # a directory with more entries is listed itself, its contents not
MAX_DEPTH = 8  # directory levels below the workspace that are listed
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", ".mypy_cache",
                          ".pytest_cache", ".tox"})  # directories no walk reads: version control, caches
NAME_CHARS = 64  # the longest name a new file may get in one round's grammar
NEW_NAME = "[A-Za-z0-9_][A-Za-z0-9_.-]"  # a new file's first character, then the rest: no hidden or ".." names
_SAFE_DIR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\Z")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _usable(name: str) -> bool:
    if name.startswith(".") or name in SKIPPED_DIRS or not name.isprintable():
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # an undecodable name (surrogate escapes): no tool could be given it
        return False
    return True


def open_dir(root: int, rel: str) -> int:
    """A descriptor of directory `rel` (workspace-relative, "/" separators; "" is the workspace) opened from `root`
    (the workspace's descriptor) one component at a time with `O_NOFOLLOW`; OSError when any is not a directory."""
    fd = os.dup(root)
    try:
        for part in rel.split("/") if rel else ():
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


Listing = list[tuple[str, "os.stat_result | None"]]  # a directory's names, sorted, with their own status
TOO_MANY = "too many"  # what `WorkspaceWalk.listing` gives for a directory with more names than asked for


class WorkspaceWalk:
    """One reading of `workspace` (see the module docstring); `exclude` holds the (st_dev, st_ino) of directories
    `entries()` never lists (the Emelex Home). Safe to use from several threads, one at a time or not."""

    def __init__(self, workspace: str | Path, exclude: Collection[tuple[int, int]] = ()) -> None:
        """A walk of `workspace` that has read nothing yet."""
        self.workspace = Path(workspace)
        self.exclude = frozenset(exclude)
        self.reads = 0  # directories read so far
        self._lock = threading.Lock()
        self._listings: dict[str, Listing | str | None] = {}
        self._entries: WorkspaceEntries | None = None

    def forget(self) -> None:
        """Drop what was read (a call may have changed the workspace): the next question reads it again."""
        with self._lock:
            self._listings.clear()
            self._entries = None

    def listing(self, rel: str, limit: int | None = None) -> Listing | str | None:
        """Directory `rel` (workspace-relative, "/" separators; "" is the workspace): its names, sorted, each with
        its own status (None where that could not be read); `TOO_MANY` when it has more than `limit` names; None
        when it cannot be read (or is no directory reached without a symlink). Read once, then kept."""
        with self._lock:
            found = self._listings.get(rel, _UNREAD)
            if found is _UNREAD or (found == TOO_MANY and limit is None):
                found = self._listings[rel] = self._read(rel, limit)
            if isinstance(found, list) and limit is not None and len(found) > limit:
                return TOO_MANY
            return found

    def _read(self, rel: str, limit: int | None) -> Listing | str | None:
        self.reads += 1
        try:
            root = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fd = open_dir(root, rel)
        except OSError:
            return None
        finally:
            os.close(root)
        try:
            names = []
            with os.scandir(fd) as listing:
                for entry in listing:
                    names.append(entry.name)
                    if limit is not None and len(names) > limit:
                        return TOO_MANY
            found: Listing = []
            for name in sorted(names):
                try:
                    found.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
                except OSError:
                    found.append((name, None))
            return found
        except OSError:
            return None
        finally:
            os.close(fd)

    def entries(self) -> WorkspaceEntries:
        """The entries a round may name (see the module docstring); worked out once. An unreadable directory is
        listed without its contents; a missing workspace lists nothing but "." (the tools then report the error)."""
        if self._entries is None:
            self._entries = self._list()
        return self._entries

    def _list(self) -> WorkspaceEntries:
        files: list[str] = []
        directories: list[str] = ["."]
        queue: deque[tuple[str, int]] = deque([("", 0)])
        while queue and len(files) + len(directories) < MAX_ENTRIES:
            rel, depth = queue.popleft()
            listing = self.listing(rel, MAX_DIR_ENTRIES)
            if not isinstance(listing, list):
                continue
            for name, info in listing:
                if not _usable(name) or info is None:
                    continue
                if len(files) + len(directories) >= MAX_ENTRIES:
                    break
                path = f"{rel}/{name}" if rel else name
                if stat.S_ISREG(info.st_mode):
                    files.append(path)
                elif stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) not in self.exclude:
                    directories.append(path)
                    if depth + 1 < MAX_DEPTH:
                        queue.append((path, depth + 1))
        return WorkspaceEntries(tuple(files), tuple(directories))


_UNREAD = object()


def scan(workspace: Path, exclude: Collection[tuple[int, int]] = ()) -> WorkspaceEntries:
    """The entries of `workspace` (see the module docstring), from a walk of its own; `exclude` holds the
    (st_dev, st_ino) of directories never listed."""
    return WorkspaceWalk(workspace, exclude).entries()


def _new_file(schema: dict, directories: Collection[str]) -> dict | None:
    """A pattern for a new file's path: an existing directory's prefix (of safe characters) and a name of
    `NEW_NAME` characters, its length bounded so that every match fits `schema`'s bounds; None when none fits."""
    top = min(NAME_CHARS, schema["maxLength"])
    if schema.get("minLength", 0) > 1:
        return None  # a lower bound the prefixes cannot all meet: leave the name out
    prefixes = [d + "/" for d in directories
                if d != "." and _SAFE_DIR.match(d) and len(d) + 1 + top <= schema["maxLength"]]
    name = f"{NEW_NAME}{{0,{top - 1}}}"
    if not prefixes:
        return {"type": "string", "pattern": f"^{name}$"}
    alternatives = "|".join(p.replace(".", "[.]") for p in prefixes)
    return {"type": "string", "pattern": f"^({alternatives})?{name}$"}


def narrow_path(schema: dict, kind: str, entries: WorkspaceEntries) -> dict | None:
    """`schema` (a string schema of the recorded authority) narrowed to the entries of `kind` ("file",
    "directory", "existing" or "new"): an `enum` of those that satisfy `schema`, and for "new" (unless `schema`
    is itself an enum) also a pattern of new names under existing directories. Every value the result admits
    satisfies `schema`; None when it would admit none."""
    candidates = {"file": entries.files, "directory": entries.directories,
                  "existing": entries.directories + entries.files, "new": entries.files}[kind]
    admitted = [path for path in candidates if validate(path, schema) is None]
    options = [{"type": "string", "enum": admitted}] if admitted else []
    if kind == "new" and "enum" not in schema and (pattern := _new_file(schema, entries.directories)):
        options.append(pattern)
    if not options:
        return None
    return options[0] if len(options) == 1 else {"anyOf": options}
