"""Context notes: the typed contract of what a Session records in front of the model besides the user's words, and
the one owner of every label format a note's quotes use.

A context note is recorded as a transcript event of kind `context` before the round that uses it (the context
sources of a Session's first turn: the workspace map, recalled Knowledge; a turn policy's note of a turn: the files a
request names). Its `text` is what the model sees; its other fields say what it was built from, and a turn policy
reads them (an answer may quote them). Those who write a note and those who read one share these types, and the
strings a quote is made of are built and taken apart here only:

- a quote is "LABEL: text" (`quote`, `split_quote`);
- a line a search found is "path:N: line" (`hit`), whose label "path:N" names the file it is of (`hit_file`);
- the workspace map's quotes are labelled `WORKSPACE_FILES` (every file it lists) and `directory_files(parent)`;
- a recalled note's quote is its `note_line`, the core's (`emelex_memory.search.recall`: it is also what the note
  costs of the recall budget).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Required, TypedDict

__all__ = ["WORKSPACE_FILES", "ContextNote", "NoteFile", "NoteSource", "RecalledNote", "directory_files", "hit",
           "hit_file", "note_files", "quote", "split_quote"]

WORKSPACE_FILES = "workspace files (here, this folder)"  # the label of the map's quote of every file it lists


class NoteFile(TypedDict):
    """A file read for the model: its workspace-relative `path`, its size in `bytes` and the `content` read (the
    first part of it; None for a binary file)."""

    path: str
    bytes: int
    content: str | None


class NoteSource(TypedDict):
    """Where a recalled note came from: the Session, the seq range of its events, their digest and the turn of the
    first one (None when that Session is gone)."""

    session: str
    first_seq: int
    last_seq: int
    digest: str
    turn: int | None


class RecalledNote(TypedDict, total=False):
    """One note recalled into a Session (`MemoryStore.select_recall`; the core shows it as its `note_line`): a
    Knowledge entry (`kind` "knowledge": its key, version, content, confidence, pin, date and source, None for an
    entry remembered by hand) or a transcript turn (`kind` "session": its Session, seq, turn, speaker, the Session's
    title and date, and the turn's content)."""

    kind: str
    key: str
    version: int
    content: str
    confidence: float
    pinned: bool
    date: str | None
    source: NoteSource | None
    session: str
    seq: int
    turn: int
    speaker: str
    title: str | None


class ContextNote(TypedDict, total=False):
    """One context note. `text` is what the model sees and `source` names who made it (the adapter adds it to what
    a source returns); the rest is optional: `quotes` ("LABEL: text" an answer may quote whole), `files` (files read for the model), `hits`
    ("path:N: line" lines a search found), `notes` (recalled Knowledge) and the fields a source records about
    itself (the map's `entries` and `complete`; recall's `terms`, `budget_tokens` and `tokens`)."""

    source: str
    text: Required[str]
    quotes: list[str]
    files: list[NoteFile]
    hits: list[str]
    notes: list[RecalledNote]
    entries: int
    complete: bool
    terms: Any
    budget_tokens: int
    tokens: int


def quote(label: str, text: str) -> str:
    """A quote: "LABEL: text"."""
    return f"{label}: {text}"


def split_quote(quoted: str) -> tuple[str, str]:
    """A quote's label and text (at its first ": "; all label when it has none)."""
    label, _, text = quoted.partition(": ")
    return label, text


def hit(path: str, number: int, line: str) -> str:
    """A line a search found: "path:N: line" (N from 1), a quote labelled "path:N"."""
    return quote(f"{path}:{number}", line)


def hit_file(label: str) -> str:
    """The file a quote labelled `label` is of: the label without the line number of a hit ("notes/a.md:3" ->
    "notes/a.md"); any other label as it is."""
    path, _, number = label.rpartition(":")
    return path if path and number.isdigit() else label


def directory_files(parent: str) -> str:
    """The label of the map's quote of the files of directory `parent`: "files in PARENT/"."""
    return f"files in {parent}/"


def note_files(notes: Iterable[dict]) -> list[str]:
    """The paths of the files context notes hold (their "files")."""
    return [file["path"] for note in notes for file in note.get("files", ())
            if isinstance(file, dict) and isinstance(file.get("path"), str)]
