"""What a user's request says, read by rule for the protocol "emelex-tools/3": its words (to rank quotes), the
verbs its clauses begin with (to see which tools it asks for), its spans (the strings an argument it spells out
can be) and the paths it names. Each is a pure function of the request's text, so a resumed turn reads it
exactly as the live one did.
"""

from __future__ import annotations

import re
from collections.abc import Callable

SPAN_WORDS = 12  # words of the request one span holds at most
MAX_SPANS = 400  # spans offered at most (the longest requests lose their latest starts)
THANKS, FAREWELLS = frozenset({"thank", "thx", "cheer"}), frozenset({"bye", "goodbye"})  # as `words` gives them
SMALL_TALK = THANKS | FAREWELLS | frozenset({"hi", "hello", "hey", "ok", "okay", "cool", "great", "nice", "good",
                                             "morning", "afternoon", "evening", "yes", "yep", "no", "nope", "sure",
                                             "help", "welcome", "awesome", "perfect"})
CLAUSE_WORDS = frozenset({"and", "then"})
LEAD_WORDS = frozenset({"please", "can", "could", "would", "will", "you", "kindly", "now", "just", "also", "go",
                        "ahead", "i", "we", "want", "need", "to", "let", "lets", "let's", "us", "first", "next",
                        "finally", "ok", "okay", "so"})
PLACE_WORDS = frozenset({"in", "inside", "within", "into", "on", "for", "from"})  # "in utils.py, change x"
_TRIM = "\"'`.,;:!?()[]{}<>"
_LEAD = "\"'`([{<"
_WORD = re.compile(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*")
_PART = re.compile(r"[._/-]")
COMMON_WORDS = frozenset("""
a about after again all also am an and any are as at be been before being both but by can could did do does doing
done each either few for from had has have having he her him his how i if in into is it its itself just me
more most my no nor not now of off on once only or other our out over own please same she should show so some such
tell than that the their them then there these they this those through to too under until up very want was we
were what when where which while who whom why will with would you your give say said let know find see look
""".split())

# Words that say how a request looks for something ("which file mentions ..."), not what it looks for.
SEEK_WORDS = frozenset({"file", "where", "which", "mention", "contain", "define", "defined", "find", "search", "grep",
                        "locate", "declare", "declared", "use", "used", "refer", "reference", "appear"})

def stem(word: str) -> str:
    """`word` without a plural "s" ("files" -> "file"; "ss", "us" and "is" endings and short words kept)."""
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def words(text: str) -> set[str]:
    """The words of `text` a quote is ranked by: lowercase runs of letters and digits (a dotted or slashed name
    such as "config.ini" or "src/app.py" kept whole and also split in parts), stemmed, common words and single
    letters left out."""
    found = set()
    for token in _WORD.findall(text.lower()):  # a common word is left out before it is stemmed too ("does")
        found.update(stem(part) for part in (token, *_PART.split(token)) if part and part not in COMMON_WORDS)
    return {word for word in found if len(word) > 1 or word.isdigit()} - COMMON_WORDS


_QUOTED = r"`([^`]+)`|\"([^\"]+)\""  # a part in backquotes or double quotes
_SET_OFF = re.compile(_QUOTED + r"|(?:^|(?<=\s))'([^']+)'(?=$|[\s.,;:!?])")  # or in single quotes
_TEXT_CUE = re.compile(r"\b(?:that|which)\s+(?:says|reads)\s+(.+)$|\b(?:saying|containing|contains)\s+(?:the\s+"
                       r"(?:text|line|words?)\s+)?(.+)$|\bwith\s+the\s+(?:text|line|content|contents|words?)\s+(.+)$",
                       re.IGNORECASE)


def _quoted(pattern: str | re.Pattern, request: str) -> list[str]:
    """The parts of `request` that `pattern`'s groups catch (each stripped, the empty left out), in order."""
    return [part.strip() for groups in re.findall(pattern, request) for part in groups if part.strip()]


def tokens(request: str) -> list[str]:
    """The request's whitespace-separated words, each without the quotes and punctuation around it."""
    return [_strip(token) for token in request.split() if _strip(token)]


def _strip(token: str) -> str:
    """`token` without the quotes, brackets and punctuation around it (a leading "." kept: ".env" is a name)."""
    return token.lstrip(_LEAD).rstrip(_TRIM)


def _clauses(request: str) -> list[list[str]]:
    """The request's words in clauses: a clause ends after a word followed by ",", ";", ":", ".", "!" or "?"
    and before "and" or "then"."""
    clauses: list[list[str]] = [[]]
    for raw in request.split():
        token = _strip(raw)
        if token.lower() in CLAUSE_WORDS:
            clauses.append([])
            continue
        if token:
            clauses[-1].append(token)
        if raw.rstrip("\"'`)]}").endswith((",", ";", ":", ".", "!", "?")):
            clauses.append([])
    return [clause for clause in clauses if clause]


def spans(request: str, starts: Callable[[str], bool] = lambda word: True,
          script: Callable[[str], str | None] = lambda word: None) -> list[str]:
    """The strings an argument the request spells out (a command to run) can be: the text inside each pair of
    backquotes or double quotes when there is any (the user set the command off); else, when the request names
    a script that `script` gives the interpreter of ("stats.py" -> "python3"), the interpreter and each such
    script ("python3 stats.py"); else the rest of each clause (see `_clauses`; at most `SPAN_WORDS` words, the
    punctuation around each dropped, one space between them) from each word `starts` accepts (a program's name;
    from every word when it accepts none): "Run wc -l words.txt and tell me" offers "wc -l words.txt". In
    order, each once, at most `MAX_SPANS`."""
    found = _quoted(_QUOTED, request)
    clauses = _clauses(request)
    if not found:
        found = [f"{interpreter} {word}" for clause in clauses for word in clause
                 if (interpreter := script(word)) is not None]
    if not found:
        if not any(starts(word) for clause in clauses for word in clause):
            starts = lambda word: True  # noqa: E731 - no word starts a command: any may
        found = [" ".join(clause[start:start + SPAN_WORDS]) for clause in clauses for start in range(len(clause))
                 if starts(clause[start])]
    return list(dict.fromkeys(found))[:MAX_SPANS]


def command_spans(request: str, starts: Callable[[str], bool], script: Callable[[str], str | None],
                  wanted: frozenset[str], tests: list[str]) -> list[str]:
    """The commands a request to run something spells out, most explicit first: the parts it sets off in quotes;
    else the scripts it names with their interpreters (see `spans`); else, in each clause whose verb asks for the
    tool (`wanted`, see `asks_for`), the rest of the clause when the word after the verb is a program ("can you run
    npm test" runs "npm test", never "test"); else, when the request speaks of tests, the project's own test
    commands (`tests`, found from its files); else `spans`."""
    quoted = _quoted(_QUOTED, request)
    if quoted:
        return list(dict.fromkeys(quoted))[:MAX_SPANS]
    scripted = [f"{interpreter} {word}" for clause in _clauses(request) for word in clause
                if (interpreter := script(word)) is not None]
    if scripted:
        return list(dict.fromkeys(scripted))[:MAX_SPANS]
    objects = []
    for clause in _clauses(request):
        lead = list(clause)
        while lead and lead[0].lower() in LEAD_WORDS:
            lead.pop(0)
        if len(lead) > 1 and asks_for([stem(lead[0].lower())], wanted) and starts(lead[1]):
            objects.append(" ".join(lead[1:1 + SPAN_WORDS]))
    if objects:
        return list(dict.fromkeys(objects))
    if tests and "test" in {stem(word.lower()) for word in tokens(request)}:
        return list(tests)
    return spans(request, starts, script)


def _verb_clauses(request: str) -> list[list[str]]:
    """Each clause of the request from its verb on (see `verbs`: the lead and place words before it skipped), as
    written (case kept), the empty left out."""
    found = []
    for clause in _clauses(request):
        lead = list(clause)
        while lead and lead[0].lower() in LEAD_WORDS:
            lead.pop(0)
        if len(lead) > 2 and lead[0].lower() in PLACE_WORDS and ("." in lead[1] or "/" in lead[1]):
            lead = lead[2:]  # "in utils.py change x": the place first, then the verb
        if lead:
            found.append(lead)
    return found


def objects(request: str) -> list[str]:
    """What a clause of the request puts somewhere: the words between its verb and its last "to", "into" or
    "onto" ("add buy stamps to my todo list" -> "buy stamps", "add .DS_Store to the gitignore" -> ".DS_Store"),
    in order, each once."""
    found = []
    for clause in _verb_clauses(request):
        rest = clause[1:]
        ends = [i for i, word in enumerate(rest) if word.lower() in ("to", "into", "onto")]
        if ends and ends[-1] > 0:
            found.append(" ".join(rest[:ends[-1]]))
    return list(dict.fromkeys(found))


def verbs(request: str) -> list[str]:
    """The verbs the request's clauses (see `_clauses`) begin with, in order: each clause's first word once the
    polite and framing words before it (`LEAD_WORDS`: "please", "can you", "I want to", ...) are skipped,
    lowercase and stemmed ("Please create x" and "Can you run ls?" ask to "create" and "run"; a question such
    as "How do I install it?" asks to do nothing); a clause that begins with where (`PLACE_WORDS` and a path: "in
    utils.py change x") begins with the verb after it."""
    return [stem(clause[0].lower()) for clause in _verb_clauses(request)]


def small_talk(request: str) -> bool:
    """Whether the request is only talk (a greeting, thanks, "what can you do?"): none of its words is other than
    common words and `SMALL_TALK` (an empty request is none)."""
    return bool(request.strip()) and not words(request) - SMALL_TALK


GREETING = "Hello! I can read, list and search the files in this workspace, create a file, or run a command you name."


def small_talk_answer(request: str) -> str:
    """The reply to a request that is only talk: "You're welcome." to thanks, "Goodbye." to a farewell, else
    `GREETING` (what the chat can do)."""
    said = words(request)
    if said & THANKS:
        return "You're welcome."
    return "Goodbye." if said & FAREWELLS else GREETING


def asks_for(request_verbs: list[str], wanted: frozenset[str]) -> bool:
    """Whether one of `request_verbs` (see `verbs`) is one of `wanted`, or, 4 letters or longer, one edit (a letter
    added, dropped or changed) from one ("creat" asks to "create")."""
    return any(verb in wanted or len(verb) >= 4 and any(_one_edit(verb, word) for word in wanted)
               for verb in request_verbs)


def _one_edit(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def set_off(request: str) -> list[str]:
    """The text the request sets off, which a write is to write: each part in backquotes, double quotes or single
    quotes (a single quote opening after a space or the start and closing before one, punctuation or the end, so
    "what's" is no quote), and what follows its last colon (stripped); with neither, what follows a cue such as
    "that says", "saying", "containing" or "with the text" (`_TEXT_CUE`), a final "." dropped; in order, each
    once."""
    found = _quoted(_SET_OFF, request)
    if ":" in request and (after := request.rsplit(":", 1)[1].strip().strip("\"'`")):
        found.append(after)
    elif not found and (cue := _TEXT_CUE.search(request)) and \
            (after := next(g for g in cue.groups() if g).strip().rstrip(".")):
        found.append(after)
    return list(dict.fromkeys(found))


def mentioned(request: str) -> list[str]:
    """The words of the request that may be paths, in order, each once: a word with a "." or "/" in it (its
    punctuation around dropped, a leading "./" too)."""
    found = [token.removeprefix("./") for token in tokens(request) if "." in token or "/" in token]
    return list(dict.fromkeys(token for token in found if token))
