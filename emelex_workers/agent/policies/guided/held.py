"""What a change may replace: the texts a file holds, as far as the turn read it (version 3 of the guided rules).

A small model asked to "change the default port to 8080" writes an `old`
text the file does not hold (the edit is refused), or none (the value is
appended). So an argument a tool declares as "held" (`ToolSpec.request_spans`:
the text a change replaces) is narrowed to texts of the one file the change
goes to, taken from what the Session read of it (`read`: the context notes
recorded with the turn's input, the read-only results of this and earlier
turns, the previous answer's quote of it), never from the workspace itself,
so a resumed turn is offered the same:

- when the request holds values (words with a digit) the file read does not
  hold ("8080", "0.3.2"): the words of the file read of the same shape
  (`shape`: "5174" for "8080", "0.3.1" for "0.3.2"), each found once, and the
  text written ("text" spans) is narrowed to those values;
- else: "" (nothing replaced: the text is appended) and the lines read that hold
  a word of the request other than the file's own name and its verbs ("the
  plumber item" in a to-do list), so an addition is an append and a change of a
  line the request names replaces that line; when no line is named, the text
  written is narrowed to what the request puts in the file (`request.objects`:
  "add buy stamps to my todo list" appends "buy stamps");
- with nothing read of the file: "" alone (a replacement quotes what was read),
  and the text written narrowed as above.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from emelex_memory.agent.journal import REPEATED
from emelex_workers.host.notes import hit_file, split_quote
from emelex_workers.host.policies import TurnState

from .request import objects, tokens, verbs, words

_WORD = re.compile(r"[\w.\-+]+")  # a word of a file's text a value may replace ("0.3.1", "5174", "v20")
MAX_HELD = 12  # texts offered at most


def shape(word: str) -> str:
    """`word` with each run of digits as "9" and of letters as "a" ("0.3.1" -> "9.9.9", "v20" -> "a9")."""
    return re.sub(r"\d+", "9", re.sub(r"[^\W\d_]+", "a", word))


def read(turn: TurnState, path: str) -> list[str]:
    """The texts the turn has read of workspace file `path`: its content in the context notes recorded with the
    turn's input and their hits of it, the output of read-only calls (`approval` "never") of this and earlier
    turns that read it (a declared "file" path argument) or found lines of it ("path:N: line"), and the previous
    answer's quote of it."""
    found: list[str] = []
    for note in turn.notes:
        for file in note.get("files", ()):
            if isinstance(file, dict) and file.get("path") == path and isinstance(file.get("content"), str):
                found.append(file["content"])
        found += _hits(path, (line for line in note.get("hits", ()) if isinstance(line, str)))
    for call, result in (*turn.earlier, *turn.results):
        authority, output = turn.snapshot.tool(call.tool), result.get("output")
        if authority is None or authority.approval != "never" or result.get("outcome") in ("not_executed", REPEATED) \
                or not isinstance(output, str):
            continue
        paths = turn.spec(call.tool).workspace_paths
        if any(kind == "file" and call.arguments.get(name) == path for name, kind in paths.items()):
            found.append(output)
        else:
            found += _hits(path, output.splitlines())
    label, text = split_quote(turn.previous)
    if text and hit_file(label) == path:
        found += text.split("; ")
    return [text for text in found if text]


def _hits(path: str, lines: Iterable[str]) -> list[str]:
    """The texts of the lines of `lines` that are hits ("path:N: line") of `path`."""
    return [text for line in lines for label, text in [split_quote(line)] if label != hit_file(label) == path]


def held(request: str, path: str, texts: list[str]) -> tuple[list[str], list[str]]:
    """The texts a change of `path` the request asks for may replace, and the texts it writes (none: the written
    text is not narrowed), from `texts`, what was read of it (see the module docstring)."""
    if not texts:
        return [""], objects(request)
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    present = {word for line in lines for word in _WORD.findall(line)}
    values = [word.rstrip(".") for word in tokens(request) if any(c.isdigit() for c in word)]
    values = list(dict.fromkeys(v for v in values if v and v not in present))
    if values:
        shapes = {shape(v) for v in values}
        counts: dict[str, int] = {}
        for line in dict.fromkeys(lines):
            for word in _WORD.findall(line):
                counts[word] = counts.get(word, 0) + 1
        same = [w for w, n in counts.items() if n == 1 and shape(w) in shapes]
        if same:
            return same[:MAX_HELD], values
    name = words(path)
    wanted = words(request) - name - set(verbs(request))
    named = [line for line in dict.fromkeys(lines) if words(line) & wanted]
    return ["", *named[:MAX_HELD - 1]], [] if named else objects(request)
