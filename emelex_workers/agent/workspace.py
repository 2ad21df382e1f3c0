"""What exists in a workspace, and a round's path arguments narrowed to it.

`scan(workspace)` lists the workspace breadth-first, nearest entries first,
at most `MAX_ENTRIES` of them: names in sorted order per directory, never
following a symlink (symlinks are not listed: the tools refuse them), and
skipping hidden entries (a name starting with "."; so `.git`, `.venv` and a
`.emelex` home), `SKIPPED_DIRS`, names that are not printable UTF-8, the
directories given in `exclude` (the Emelex Home, by identity) and the
contents of a directory with more than `MAX_DIR_ENTRIES` entries (it is
listed itself). Every directory is opened one component at a time from the
workspace with `O_NOFOLLOW`, so a symlink swapped in is never listed through.

`narrow_path(schema, kind, entries)` is the schema a path argument is
generated under in one round: a restriction of `schema` (the recorded
authority's) to the entries of `kind`, or None when no entry is admissible.
"""

from __future__ import annotations

import os
import re
import stat
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from .schema import validate

MAX_ENTRIES = 200  # entries a round's grammar offers at most, nearest by depth first
MAX_DIR_ENTRIES = 1000  # a directory with more entries is listed itself, its contents not
MAX_DEPTH = 8  # directory levels below the workspace that are listed
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})
NAME_CHARS = 64  # the longest name a new file may get in one round's grammar
NEW_NAME = "[A-Za-z0-9_][A-Za-z0-9_.-]"  # a new file's first character, then the rest: no hidden or ".." names
_SAFE_DIR = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*\Z")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class WorkspaceEntries:
    """The listed entries as workspace-relative paths ("/" separators), nearest first: regular `files` and
    `directories` ("." is the workspace itself, always first)."""

    files: tuple[str, ...] = ()
    directories: tuple[str, ...] = (".",)


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


def scan(workspace: Path, exclude: Collection[tuple[int, int]] = ()) -> WorkspaceEntries:
    """The entries of `workspace` (see the module docstring); `exclude` holds the (st_dev, st_ino) of directories
    never listed. An unreadable directory is listed without its contents; a missing workspace lists nothing but
    "." (the tools then report the error)."""
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return WorkspaceEntries()
    files: list[str] = []
    directories: list[str] = ["."]
    queue: deque[tuple[str, int]] = deque([("", 0)])
    try:
        while queue and len(files) + len(directories) < MAX_ENTRIES:
            rel, depth = queue.popleft()
            try:
                fd = open_dir(root, rel)
            except OSError:
                continue
            try:
                names = []
                with os.scandir(fd) as listing:
                    for entry in listing:
                        names.append(entry.name)
                        if len(names) > MAX_DIR_ENTRIES:
                            break
                if len(names) > MAX_DIR_ENTRIES:
                    continue
                for name in sorted(filter(_usable, names)):
                    if len(files) + len(directories) >= MAX_ENTRIES:
                        break
                    try:
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        continue
                    path = f"{rel}/{name}" if rel else name
                    if stat.S_ISREG(info.st_mode):
                        files.append(path)
                    elif stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) not in exclude:
                        directories.append(path)
                        if depth + 1 < MAX_DEPTH:
                            queue.append((path, depth + 1))
            finally:
                os.close(fd)
    finally:
        os.close(root)
    return WorkspaceEntries(tuple(files), tuple(directories))


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
