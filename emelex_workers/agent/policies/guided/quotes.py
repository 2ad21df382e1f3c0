"""Quoted answers (protocol "emelex-tools/3"): an answer is one line quoted from what the model has read, chosen
by the model among the lines most relevant to the user's request.

A small model reads the right file and then cannot say what it read: it
copies the worked example's values, echoes the question, or guesses a
number. So from the turn's first tool result on, the answer form's string
is an enum of quotes, and the model chooses one of them:

- each non-empty line of each tool result of the turn, as "LABEL: line",
  where LABEL names the call (its workspace path argument, else its only
  string argument, else the tool's name; "(error)" or "(denied)" added for
  those outcomes);
- for a result of several lines, when it fits, the whole output on one
  line ("LABEL: line; line; ...");
- when the request asks how many or how big (a word of `COUNT_WORDS`),
  "LABEL: N lines, B bytes", what the output is, counted (a file read whole
  is that file);
- each quote a context note recorded with the turn's input offers (notes
  of earlier turns are not quoted): its payload's "quotes" (the workspace
  map's file list, whole and by directory) and the quotes of each file a
  `mentions` note holds, as of a result labelled with its path, and each
  line of its hits ("path:N: line").

Before the turn's first tool result the answer is quoted too, when a
quote of the notes has a word of the request; else it is free (a greeting
is answered, not quoted).

The request's words (lowercased, split at punctuation too, a plural "s"
dropped, common words left out) rank the quotes: a quote scores the sum of
`log(1 + n / df)` over the request words it contains (n things quoted, df of
them containing the word: the quotes of one file, listing or output count
once, its lines the notes hold as "path:N: line" with them), and only the
quotes of the best score are offered,
at most `QUOTE_CHOICES`, in their order: the model chooses among ties only.
When the request names files (`request.mentioned`: "motd.txt", or its name
"db.toml" of "config/db.toml"; and those the caller says it names, as the
files a `mentions` note read), only the quotes labelled with them compete,
when there are any (what motd.txt says, not the listing that names it); a
file named by a plain word only ("database" for database.py) narrows them
only when its quotes hold what the request seeks, or it seeks nothing else.
Among ties, the counts when the request asks how many or how big; else,
when some hold a request word in what they quote (not only in their label,
and not one that every line of their output holds, as "file" in a
listing), the single lines among those are offered (the precise
answer: "config.ini: port = 8421", not the whole file); when none does
(only the label matched), the whole outputs among them are (they hold every
line that ties with them: the command's output, not its exit code alone).
`answers` says whether the quotes already hold the answer, so that the turn's
next round is the answer form alone (`AgentSession.answered`).
All of it is a pure function of the recorded history, so a resumed turn offers exactly
what the live one would.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from emelex_workers.host.notes import hit_file, quote as quoted_text, split_quote

from .request import SEEK_WORDS, mentioned, words

QUOTE_CHOICES = 4  # quotes one answer chooses among
QUOTE_CHARS = 300  # of one quote at most: a longer line is cut
WHOLE_CHARS = 240  # a multi-line output this short is offered whole, too
LINES_PER_RESULT = 200  # lines of one output quoted at most
SOUGHT_CHARS = 4  # a word of the request this long says what is sought (see `answers`)
KIND_WORDS = frozenset({"file"})  # what a request names the kind of its answer by: a quote holding it answers nothing
_HOW_WORDS = KIND_WORDS | SEEK_WORDS  # words of a request that never say what it seeks
COUNT_WORDS = frozenset({"line", "byte", "size", "long", "big", "large", "many", "count", "length", "much"})


class Quote(NamedTuple):
    """One quote an answer may be: its `text` ("LABEL: what it quotes"), its `kind` ("line": one line of an
    output; "whole": a whole output or note; "count": an output's lines and bytes), the `quoted` part (the text
    without its label) and the `label`."""

    text: str
    kind: str
    quoted: str
    label: str


def _quote(label: str, quoted: str, kind: str) -> Quote:
    text = quoted_text(label, quoted)
    return Quote(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 3].rstrip() + "...", kind, quoted,
                 label)


def result_quotes(label: str, output: str, request: str, size: int | None = None) -> list[Quote]:
    """The quotes of one tool result whose call `label` names (see the module docstring); its count only when
    `request` asks for one (it has a word of `COUNT_WORDS`) and `output` is all there is (`size`, the bytes it was
    read from when known, is its own)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()][:LINES_PER_RESULT]
    quotes = [_quote(label, line, "line" if len(lines) > 1 else "whole") for line in lines] or \
        [_quote(label, "(nothing)", "whole")]
    whole = "; ".join(lines)
    if len(lines) > 1 and len(label) + 2 + len(whole) <= WHOLE_CHARS:
        quotes.append(_quote(label, whole, "whole"))
    if not words(request).isdisjoint(COUNT_WORDS) and size in (None, len(output.encode("utf-8"))):
        count = len(output.splitlines())
        quotes.append(_quote(label, f"{count} line{'' if count == 1 else 's'}, {len(output.encode('utf-8'))} bytes",
                             "count"))
    return quotes


def _competing(asked: set[str], explicit: list[str], quotes: Sequence[Quote], named: Collection[str]
               ) -> tuple[list[Quote], bool]:
    """The quotes that compete for an answer to a request of the words `asked` naming the paths `explicit`
    (`request.words`, `request.mentioned`), each text once, and whether they are narrowed to the files the request
    names. When it names one by path, only the quotes labelled with those
    files and with `named` compete (the files read for it: a `mentions` note's), if there are any. When it names
    files only by a plain word (`named` alone: "database" for database.py), only theirs compete when one of them
    holds a word of the request that says what is sought (`_sought`) besides the files' names, or the request has
    no such word; else all of them do (what the database password is, not what database.py says). Otherwise all
    of them do."""
    unique = list({quote.text: quote for quote in quotes}.values())

    def of(paths: Collection[str]) -> list[Quote]:
        return [q for q in unique if any(q.label == p or q.label.endswith("/" + p) for p in paths)]

    if explicit:
        narrowed = of([*named, *explicit])
        return (narrowed, True) if narrowed else (unique, False)
    narrowed = of(named)
    other = _sought(asked - _words_of(named))
    if narrowed and (not other or any(not other.isdisjoint(words(quote.text)) for quote in narrowed)):
        return narrowed, True
    return unique, False


def _sought(wanted: set[str]) -> set[str]:
    """The words of `wanted` that say what a request seeks: of `SOUGHT_CHARS` characters or more, not one of
    `KIND_WORDS` nor of `request.SEEK_WORDS`, which say how ("define", "mention")."""
    return {word for word in wanted if len(word) >= SOUGHT_CHARS and word not in _HOW_WORDS}


def _words_of(paths: Iterable[str]) -> set[str]:
    """The words of the paths `paths` ("config", "ini" and "config.ini" of config.ini)."""
    return set().union(*(words(path) for path in paths))


def _uniform(quotes: Sequence[Quote]) -> dict[str, set[str]]:
    """For each label of several line quotes, the words every one of its lines holds (as "file" in a listing)."""
    lines: dict[str, list[set[str]]] = {}
    for quote in quotes:
        if quote.kind == "line":
            lines.setdefault(quote.label, []).append(words(quote.quoted))
    return {label: set.intersection(*found) for label, found in lines.items() if len(found) > 1}


def _precise(quote: Quote, wanted: set[str], uniform: dict[str, set[str]]) -> bool:
    """Whether what `quote` quotes (not its label) holds a word of `wanted` that not every line of its output
    holds (`_uniform`)."""
    return not wanted.isdisjoint(words(quote.quoted) - uniform.get(quote.label, set()))


def choose(request: str, quotes: Sequence[Quote], choices: int = QUOTE_CHOICES, *,
           relevant_only: bool = False, named: Collection[str] = (), declarations: bool = False) -> list[str]:
    """The quotes (their texts) an answer to `request` chooses among, of `quotes` (each text once): those of the
    best score, narrowed among ties as the module docstring says; at most `choices`, in the order given. When
    none has a word of the request: the first `choices`, or none when `relevant_only`. With `declarations`, among
    the single lines quoted, those that declare a name the request holds (`_declares`: "def normalize_header(",
    "const PORT =", "function slugify(") when any do: where a thing is defined, not where it is used."""
    wanted = words(request)
    unique, _ = _competing(wanted, mentioned(request), quotes, named)
    sets = [words(quote.text) for quote in unique]
    # A word's rarity is counted over what is quoted (a file, a listing, a command's output), not over the quotes:
    # one output gives several (its lines, itself whole, a line of it the notes hold as "path:N").
    sources: dict[str, set[str]] = {}
    for quote, found in zip(unique, sets):
        sources.setdefault(hit_file(quote.label), set()).update(found)
    frequency = {word: sum(word in found for found in sources.values()) for word in wanted}
    scores = [sum(math.log(1 + len(sources) / frequency[word]) for word in wanted & found) for found in sets]
    best = max(scores, default=0.0)
    if relevant_only and best <= 0:
        return []
    tied = [quote for quote, score in zip(unique, scores) if score >= best - 1e-9]
    if not wanted.isdisjoint(COUNT_WORDS) and (counts := [quote for quote in tied if quote.kind == "count"]):
        return [quote.text for quote in counts][:choices]
    uniform = _uniform(unique)
    precise = [quote for quote in tied if _precise(quote, wanted, uniform)]
    if precise:
        narrowed = [quote for quote in precise if quote.kind != "whole"] or precise
    else:
        narrowed = [quote for quote in tied if quote.kind == "whole"]
    offered = narrowed or tied
    if declarations and (declaring := [quote for quote in unique if quote.kind == "line"
                                       and _declares(quote.quoted, request)]):
        offered = declaring
    return [quote.text for quote in offered][:choices]


def _declares(line: str, request: str) -> bool:
    """Whether `line` declares a name the request holds: the name at the start of a statement, after at most two
    keywords, followed by "(", "=", ":" or "{" (a function, a class, a constant, a key), whatever its case."""
    names = {token.lower() for token in re.findall(r"[A-Za-z_$][\w$]*", request) if len(token) >= 3}
    match = _DECLARATION.match(re.sub(r"^[^\s:]+:\d+:\s", "", line))  # a search hit: "path:N: line"
    return match is not None and match.group(1).lower() in names


_DECLARATION = re.compile(r"\s*(?:[A-Za-z_$][\w$]*\s+){0,2}([A-Za-z_$][\w$]*)\s*[(=:{]")


def answers(request: str, quotes: Sequence[Quote], named: Collection[str] = ()) -> bool:
    """Whether `quotes` hold an answer to `request`, among the quotes that compete for it (`_competing`): none
    when the request names a file by path whose quotes are not there. A request that asks how many or how big is
    answered by a count of a file it names, and by nothing else (what else it counts is not known: "how many
    files ..."). Else no while a word of the request that says what is sought (`_sought`), not the name of a file
    it names, is in none of the quotes; then a quote counts when what it quotes holds a word of the request
    other than those (`_precise`). A request with no word but its files' names ("What does motd.txt say?") is
    answered by any quote of them."""
    asked, explicit = words(request), mentioned(request)
    unique, narrowed = _competing(asked, explicit, quotes, named)
    if not unique or (explicit and not narrowed):
        return False
    wanted = asked - KIND_WORDS
    if not wanted.isdisjoint(COUNT_WORDS):  # only the count of a file it names answers how many or how big
        return narrowed and any(quote.kind == "count" for quote in unique)
    wanted -= _words_of([*named, *explicit])
    if not wanted:
        return narrowed
    found = set().union(*(words(quote.text) for quote in unique))
    if not _sought(wanted) <= found:
        return False
    uniform = _uniform(unique)
    return any(_precise(quote, wanted, uniform) for quote in unique if quote.kind != "count")


def note_quotes(payloads: Iterable[dict], request: str) -> list[Quote]:
    """The quotes context notes offer: each payload's "quotes" that are strings ("LABEL: text", each whole), the
    quotes of each of its "files" (a `mentions` note) as of a result labelled with its path (a binary file: its
    size), and each of its "hits" ("path:N: line")."""
    found: list[Quote] = []
    for payload in payloads:
        for quoted in payload.get("quotes", ()):
            if isinstance(quoted, str):
                found.append(_quote(*split_quote(quoted), "whole"))
        for file in payload.get("files", ()):
            if not isinstance(file, dict) or not isinstance(file.get("path"), str):
                continue
            content, size = file.get("content"), file.get("bytes")
            if isinstance(content, str):
                found += result_quotes(file["path"], content, request, size if isinstance(size, int) else None)
            elif isinstance(size, int):
                found.append(_quote(file["path"], f"{size} bytes (binary)", "whole"))
        for line in payload.get("hits", ()):
            if isinstance(line, str):
                found.append(_quote(*split_quote(line), "line"))
    return found
