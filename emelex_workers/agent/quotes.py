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
- each quote a context note offers: its payload's "quotes" (the workspace
  map's file list, whole and by directory) and the quotes of each file a
  `mentions` note holds, as of a result labelled with its path, and each
  line of its hits ("path:N: line").

Before the turn's first tool result the answer is quoted too, when a
quote of the notes has a word of the request; else it is free (a greeting
is answered, not quoted).

The request's words (lowercased, split at punctuation too, a plural "s"
dropped, common words left out) rank the quotes: a quote scores the sum of
`log(1 + n / df)` over the request words it contains (n quotes, df of them
containing the word), and the quotes of the best score are offered (of
them only whole outputs when one is among them; at most `QUOTE_CHOICES`, in
their order): the model chooses among ties only. A pure function of the recorded history, so a resumed turn
offers exactly what the live one would.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from .request import words

QUOTE_CHOICES = 4  # quotes one answer chooses among
QUOTE_CHARS = 300  # of one quote at most: a longer line is cut
WHOLE_CHARS = 240  # a multi-line output this short is offered whole, too
LINES_PER_RESULT = 200  # lines of one output quoted at most
COUNT_WORDS = frozenset({"line", "byte", "size", "long", "big", "large", "many", "count", "length", "much"})
def _cut(text: str) -> str:
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 3].rstrip() + "..."


def result_quotes(label: str, output: str, request: str, size: int | None = None) -> list[tuple[str, bool]]:
    """The quotes of one tool result whose call `label` names (see the module docstring), each with whether it is
    the whole output; its count only when `request` asks for one (it has a word of `COUNT_WORDS`) and `output` is
    all there is (`size`, the bytes it was read from when known, is its own)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()][:LINES_PER_RESULT]
    quotes = [(_cut(f"{label}: {line}"), False) for line in lines] or [(f"{label}: (nothing)", True)]
    whole = f"{label}: " + "; ".join(lines)
    if len(lines) > 1 and len(whole) <= WHOLE_CHARS:
        quotes.append((whole, True))
    elif len(lines) == 1:
        quotes[0] = (quotes[0][0], True)
    if not words(request).isdisjoint(COUNT_WORDS) and size in (None, len(output.encode("utf-8"))):
        count = len(output.splitlines())
        quotes.append((f"{label}: {count} line{'' if count == 1 else 's'}, {len(output.encode('utf-8'))} bytes",
                       False))
    return quotes


def choose(request: str, quotes: Sequence[tuple[str, bool]], choices: int = QUOTE_CHOICES, *,
           relevant_only: bool = False) -> list[str]:
    """The quotes an answer to `request` chooses among, of `quotes` ((quote, whether it is a whole output); each
    once): those of the best score, and of them only the whole outputs when one is among them (a whole output
    holds every line of it that scores as well); at most `choices`, in the order given. When none has a word of
    the request: the first `choices`, or none when `relevant_only`."""
    whole = {quote for quote, is_whole in quotes if is_whole}
    unique = list(dict.fromkeys(quote for quote, _ in quotes))
    wanted = words(request)
    sets = [words(quote) for quote in unique]
    frequency = {word: sum(word in s for s in sets) for word in wanted}
    total = len(unique)
    scores = [sum(math.log(1 + total / frequency[word]) for word in wanted & found) for found in sets]
    best = max(scores, default=0.0)
    if relevant_only and best <= 0:
        return []
    tied = [quote for quote, score in zip(unique, scores) if score >= best - 1e-9]
    return ([quote for quote in tied if quote in whole] or tied)[:choices]


def note_quotes(payloads: Iterable[dict], request: str) -> list[tuple[str, bool]]:
    """The quotes context notes offer: each payload's "quotes" that are strings (each a whole, as `choose` takes
    them), and for each of its "files" (a `mentions` note) the quotes of its content as of a result labelled with
    its path (a binary file: its size); cut to `QUOTE_CHARS`."""
    found: list[tuple[str, bool]] = []
    for payload in payloads:
        found += [(_cut(quote), True) for quote in payload.get("quotes", ()) if isinstance(quote, str)]
        for file in payload.get("files", ()):
            if not isinstance(file, dict) or not isinstance(file.get("path"), str):
                continue
            content, size = file.get("content"), file.get("bytes")
            if isinstance(content, str):
                found += result_quotes(file["path"], content, request, size if isinstance(size, int) else None)
            elif isinstance(size, int):
                found.append((f"{file['path']}: {size} bytes (binary)", True))
        found += [(_cut(hit), False) for hit in payload.get("hits", ()) if isinstance(hit, str)]
    return found
