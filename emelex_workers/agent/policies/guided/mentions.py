"""Files a turn's input names, read for the model before its first round (protocol "emelex-tools/3").

A small model asked "What is the name in package.json?" reads some other
file, or none. So under "emelex-tools/3" the adapter itself reads the
workspace files the user's input names and records them, as one `context`
note (source `SOURCE`) in the transaction of that input, before it: the
model sees their text without a tool call, and an answer may quote it
(`quotes.note_quotes`). A resumed Session replays the note and never reads
the files again.

A word of the input names a file when it has a "." or "/" in it
(`request.mentioned`) and is the workspace-relative path of a regular file
the round's grammar could offer (`WorkspaceWalk.entries`: no hidden or skipped
directory, no symlink, not in the Emelex Home), or that file's name when
exactly one listed file has it, or a word that is a listed file's name
whatever its case or without its suffixes ("readme", see `named_files`),
or a hidden file at the top (".env") named exactly. At most `MAX_FILES` files are read, each
opened one component at a time with `O_NOFOLLOW` (a symlink swapped in is
not followed), at most `FILE_BYTES` of each and `NOTE_CHARS` in all; a
binary file (a NUL byte in what was read) is named with its size only.

When the input looks for something (it has a word of `SEEK_WORDS`:
"which", "where", "file", "mention", "define", ...), the note also holds
the lines of the workspace's other text files (the first `SEARCH_FILES`
listed, the first `SEARCH_BYTES` of each) that hold a rare word of the
input: a word of at least `HIT_WORD_CHARS` characters, neither a common one
(`request.words`) nor one of `SEEK_WORDS`, found in at most `HIT_FILES`
files; at most `MAX_HITS` lines, so "Which file mentions pineapple?" comes
with its answer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path

from emelex_workers.host.notes import ContextNote, hit

from .request import COMMON_WORDS, SEEK_WORDS, mentioned, tokens, words
from ...workspace import WorkspaceWalk, open_dir

SOURCE = "mentions"  # the `source` of the note
MAX_FILES = 3  # files one note holds at most
FILE_BYTES = 4096  # read of one file at most
NOTE_CHARS = 4000  # the note's text at most
HEADER = "Files the next message names, as they are now (read for you; no tool call needed):"
HITS = "Lines of the workspace's files with rare words of the next message (path:line: text):"
HIT_WORD_CHARS = 4  # a word searched for has at least these characters
HIT_FILES = 3  # a word found in more files is not rare: its lines are left out
MAX_HITS = 8  # lines of hits at most
HIT_CHARS = 200  # of one line
SEARCH_FILES = 200  # files searched at most (those the grammar lists, nearest first)
SEARCH_BYTES = 65536  # of each file searched


def named_files(files: Collection[str], message: str) -> list[str]:
    """The paths of `files` (workspace-relative) that `message` names, in its order, each once, at most
    `MAX_FILES`: a word with a "." or "/" that is a path of `files` or the name of exactly one of them, or
    another word (of 3 or more characters, not a common one) that is, whatever its case, the name of exactly
    one of them or that name without its suffixes ("readme" names README.md, "makefile" Makefile) or, for a
    dotfile, without its leading dot ("gitignore" names .gitignore)."""
    files = set(files)
    by_name: dict[str, list[str]] = {}
    for path in files:
        name = path.rsplit("/", 1)[-1]
        by_name.setdefault(name, []).append(path)
        for key in {name.lower(), name.split(".", 1)[0].lower(), name.lstrip(".").lower()} - {name, ""}:
            by_name.setdefault(key, []).append(path)
    found: list[str] = []
    plain = [w.lower() for w in tokens(message) if len(w) >= 3 and "." not in w and "/" not in w
             and w.lower() not in COMMON_WORDS]
    for word in [*mentioned(message), *plain]:
        path = word if word in files else by_name[word][0] if len(by_name.get(word, ())) == 1 else None
        if path is not None and path not in found:
            found.append(path)
    return found[:MAX_FILES]


def _is_file(root: int, name: str) -> bool:
    """Whether `name` is a regular file at the top of the workspace open as `root` (no symlink followed)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=root, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _read(root: int, path: str, limit: int = FILE_BYTES) -> tuple[bytes, int] | None:
    """The first `limit` bytes of workspace file `path` (from `root`, the workspace's descriptor) and its size;
    None when it is not a regular file reached without a symlink (or cannot be read)."""
    parent, _, name = path.rpartition("/")
    try:
        directory = open_dir(root, parent)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        finally:
            os.close(directory)
        try:
            info = os.fstat(fd)
            return (os.read(fd, limit), info.st_size) if stat.S_ISREG(info.st_mode) else None
        finally:
            os.close(fd)
    except OSError:
        return None


def _hits(root: int, files: Collection[str], message: str, skip: Collection[str], always: bool = False) -> list[str]:
    """Lines of the workspace's text files holding a rare word of `message` (see the module docstring), as
    "path:N: line", at most `MAX_HITS`; the files of `skip` (read whole already) are not searched. Only for a
    message that looks for something (a word of `SEEK_WORDS`), unless `always`."""
    asked = words(message)
    wanted = [w for w in asked if len(w) >= HIT_WORD_CHARS and not any(c in w for c in "./") and w not in SEEK_WORDS]
    if asked.isdisjoint(SEEK_WORDS) and not always or not wanted:
        return []
    found: dict[str, list[str]] = {word: [] for word in wanted}
    owners: dict[str, set[str]] = {word: set() for word in wanted}
    for path in [f for f in files if f not in skip][:SEARCH_FILES]:
        read = _read(root, path, SEARCH_BYTES)
        if read is None or b"\0" in read[0]:
            continue
        for number, line in enumerate(read[0].decode("utf-8", "replace").splitlines(), 1):
            low = line.lower()
            if not any(word in low for word in wanted):  # a word of the line is a lowercase part of it
                continue
            present = words(line)
            for word in wanted:
                if word in present and len(found[word]) < MAX_HITS:
                    found[word].append(hit(path, number, line.strip()[:HIT_CHARS]))
                    owners[word].add(path)
    hits = [hit for word in wanted if 0 < len(owners[word]) <= HIT_FILES for hit in found[word]]
    return list(dict.fromkeys(hits))[:MAX_HITS]


def mentions_note(workspace: str | Path, message: str, exclude: Collection[tuple[int, int]] = (),
                  walk: WorkspaceWalk | None = None, finds: bool = False) -> ContextNote | None:
    """The note of the files `message` names in `workspace` and of the lines that hold its rare words (see the
    module docstring): `{"text", "files", "hits"}`, each file `{"path", "bytes", "content"}` (`content` None for
    a binary file, else the text read, cut to the room left), each hit "path:N: line"; None when there is
    neither. The files are those `walk` (the turn's walk of `workspace`; one of its own when None) lists, and a
    top-level dotfile named with its dot (".env"). With `finds` (the guided rules of version 2) also a dotfile
    named without its dot ("gitignore"), and the lines of rare words for any message, not only one that looks for
    something. Never raises for the workspace's content."""
    workspace = Path(workspace)
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _note(root, (walk or WorkspaceWalk(workspace, exclude)).entries().files, message, finds)
    finally:
        os.close(root)


def _note(root: int, listed: Collection[str], message: str, finds: bool = False) -> dict | None:
    """`mentions_note` of the workspace open as `root`, whose files the turn's walk lists as `listed`."""
    hidden = [word for word in mentioned(message) if word.startswith(".") and "/" not in word]  # ".env", named
    if finds:  # "gitignore": .gitignore, when there is one
        hidden += [name for word in tokens(message) if len(word) >= 3 and word.isalnum()
                   and _is_file(root, name := f".{word.lower()}")]
    paths = named_files([*listed, *hidden], message)
    files, parts, room = [], [HEADER], NOTE_CHARS - len(HEADER)
    for path in paths:
        read = _read(root, path)
        if read is None:
            continue
        data, size = read
        binary = b"\0" in data
        text = None if binary else data.decode("utf-8", "replace")
        head = f"== {path} ({size} bytes{', binary' if binary else ''}{', first part' if size > len(data) else ''}) =="
        room -= len(head) + 1
        if room <= 0:
            break
        if text is not None:
            text = text[:room]
            room -= len(text) + 1
        files.append({"path": path, "bytes": size, "content": text})
        parts += [head] + ([text.rstrip("\n")] if text else [])
    hits = _hits(root, listed, message, [f["path"] for f in files], always=finds)
    hits = [hit for hit in hits if (room := room - len(hit) - 1) > 0]
    if not files and not hits:
        return None
    if hits:
        parts += [HITS, *hits]
    return {"text": "\n".join(parts if files else parts[1:]), "files": files, "hits": hits}
