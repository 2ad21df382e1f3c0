"""What "faithful" means for a Summary or a Knowledge candidate: the checks the worker's guards apply.

These are plain functions over text, independent of any model or plugin
(docs/knowledge.md, "Faithfulness guards", states them for users):

- *Words* are the casefolded runs of letters and digits; *content words*
  are the words outside `STOP_WORDS`, lightly stemmed (`stem`), so
  "moves" and "moving" count as one word.
- *Sentences* are split after `.`, `!` or `?` followed by white space, and at
  line breaks, except where that would cut code or a name: never inside a
  backtick span (`` `pip install -e .` ``) or a fenced code block (one
  sentence, line breaks included), not before a lowercase letter ("... and
  then", "-e . and"), and not after a token of dots only (".", ".."), an
  abbreviation ("e.g.") or an initial or title: a capital alone or before
  lowercase letters with no vowel ("J.", "Dr.", "Mrs.", "St."; no English
  word is spelt so).
- A candidate is *supported* by its source when its normalized text
  (`normalize`) occurs in the normalized text of one source event (a quote),
  or when every content word of it occurs in one source sentence whose
  polarity (whether it contains a negation such as "not" or "never") is the
  same as the candidate's. Its *support* is the best share of its content
  words found in one such sentence (1.0 for a quote).
- Its *corroboration* is the share of its content words that also occur in
  a source event other than the one supporting it best: a statement the
  conversation comes back to scores higher than one said once in passing.
- A *question-and-answer* entry, `qa(question, answer)`, is "Q: <question>
  A: <answer>", both verbatim: an answer that means nothing without its
  question ("In config/server.yaml.") stored with it. Such a candidate is
  supported when its question and its answer each are (`qa_parts`).
- A *vocative* is a name in address position: a capitalized word (not a
  key name) that closes its sentence or is followed by a comma, "!" or "?",
  and follows a comma or the sentence's one opening word ("Hey Gina!",
  "Wow, Caroline!", "Bye, Priya!"), or opens the sentence right before "!"
  or "?" ("Theo!"; not before a comma: "Wow, ..." opens like "Theo, ...").
  A name is recognised by where it stands, not by a list of names.
- An *interjection* is a sentence that, its vocatives aside, has no content
  word, or has at most two words and ends with "!" and names no key name
  ("Hey Gina!", "Cool!", "Ha!"): a greeting, thanks or exclamation, never
  the answer of a question-and-answer entry.
- A candidate is *vacuous* when it has fewer than two distinct content
  words, vocatives not counted ("Wow, Caroline!" has one).
- A candidate *matches a worked example* when it is not quoted from the
  source and its content words overlap those of one sentence of a
  plugin-declared example with a Jaccard index of at least 0.6.
- A *key name* is a word-like token that is an identifier, a file name or a
  number: it contains a digit, or one of `_ / . : = @ #` between
  characters, or an inner capital letter (abbreviations like "e.g." aside).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

STOP_WORDS = frozenset(
    "a an the and or but so of to in on at by for from with as into onto over under about after before "
    "is are was were be been being am it its this that these those there here then than too very "
    "i you he she we they me him her us them my your our their his mine yours ours theirs "
    "do does did done have has had having will would shall should can could may might must "
    "s t ll re ve d m what which who whom whose when where why how also just now".split()
)
NEGATIONS = frozenset("no not never none nobody nothing nor without cannot n't dont doesnt didnt wont isnt "
                      "arent wasnt werent cant couldnt shouldnt wouldnt".split())
EXAMPLE_JACCARD = 0.6
MIN_CONTENT_WORDS = 2
_WORD = re.compile(r"[^\W_]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]`*]*[ \t]+")
CODE_SPAN = re.compile(r"`([^`\n]+)`")  # an inline code span; group 1 is its text
_DOTTED = re.compile(r"(?:[a-z]\.){2,}\Z", re.IGNORECASE)  # "e.g.", "i.e.": not the end of a sentence
# A capital alone or before lowercase letters that hold no vowel ("J.", "Dr.", "Mrs.", "St."): no English word is
# spelt so, so it is an initial or a title, whatever it abbreviates: not the end of a sentence.
_TITLE = re.compile(r"[A-Z][b-df-hj-np-tv-xz]{0,3}\.\Z")
_FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.DOTALL | re.MULTILINE)
_TERMINATED = re.compile(r"[.!?][\"')\]`*]*\Z")
_KEY_NAME = re.compile(r"[^\s,;()\[\]{}\"'`<>]+")
_KEY_SHAPE = re.compile(r"\d|\w[_/.:=@#]\w|[a-z][A-Z]")
_ABBREVIATION = re.compile(r"(?:[a-z]\.)+[a-z]?\Z", re.IGNORECASE)
SPEAKER_LABEL = re.compile(r"(?:user|assistant|summary|system|tool): ", re.IGNORECASE)


def normalize(text: str) -> str:
    """NFKC, casefolded, white space collapsed, surrounding white space and trailing full stops removed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).rstrip(".").strip()


def words(text: str) -> list[str]:
    """The casefolded runs of letters and digits of `text`, apostrophes dropped ("don't" is "dont")."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold().replace("'", "").replace("\u2019", ""))


def stem(word: str) -> str:
    """A light suffix strip ("ing", "ed", "es", "s") that keeps at least three letters; digits are kept whole."""
    if word.isdigit():
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    """The stemmed words of `text` outside `STOP_WORDS` (negations included: they change meaning)."""
    return {stem(w) for w in words(text) if w not in STOP_WORDS}


def negated(text: str) -> bool:
    """True when `text` contains a negation word ("not", "never", "don't", ...)."""
    return any(w in NEGATIONS for w in words(text)) or "n't" in text.casefold()


def _line_sentences(line: str) -> list[str]:
    masked = CODE_SPAN.sub(lambda m: "\0" * len(m.group()), line)  # a code span never ends a sentence
    out, start = [], 0
    for end in _SENTENCE_END.finditer(masked):
        following = masked[end.end():end.end() + 1]
        token = masked[:end.start()].rsplit(None, 1)[-1] if masked[:end.start()].strip() else ""
        token = token.rstrip("\"')]`*")
        if following.islower() or not token.strip(".") or _DOTTED.match(token.lstrip("(\"'")) \
                or _TITLE.match(token.lstrip("(\"'")):
            continue
        out.append(line[start:end.start()])
        start = end.end()
    out.append(line[start:])
    return out


def sentences(text: str) -> list[str]:
    """`text` split into sentences (see the module docstring: after `.`, `!` or `?` and white space, and at line
    breaks, never inside code); stripped, empty pieces dropped. A fenced code block is one sentence."""
    pieces: list[str] = []
    start = 0
    for fence in _FENCE.finditer(text):
        pieces += [s for line in text[start:fence.start()].splitlines() for s in _line_sentences(line)]
        pieces.append(fence.group())
        start = fence.end()
    pieces += [s for line in text[start:].splitlines() for s in _line_sentences(line)]
    return [s.strip() for s in pieces if s.strip()]


def terminated(sentence: str) -> bool:
    """True when `sentence` ends with `.`, `!` or `?` (closing quotes, brackets or backticks allowed after it), or
    is a fenced code block, which ends with its closing fence."""
    return bool(_TERMINATED.search(sentence.rstrip()) or _FENCE.fullmatch(sentence.strip()))


_OPENING_FENCE = re.compile(r"```[^`\n]*\Z")
_CLOSING_FENCE = re.compile(r"```[ \t]*\Z")


def summary_lines(text: str) -> list[str]:
    """The lines of a Summary, a fenced code block kept whole: a line whose text after its speaker label opens a
    fence (```` ``` ```` and an optional info string) runs on, line breaks included, to the line that closes it;
    without a closing line, lines are lines."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        body = lines[i][m.end():] if (m := SPEAKER_LABEL.match(lines[i])) else lines[i]
        end = None
        if _OPENING_FENCE.match(body):
            end = next((j for j in range(i + 1, len(lines)) if _CLOSING_FENCE.match(lines[j])), None)
        if end is not None:
            out.append("\n".join(lines[i:end + 1]))
            i = end + 1
        else:
            out.append(lines[i])
            i += 1
    return out


def support(candidate: str, sources: Sequence[str]) -> float:
    """How well `sources` (source texts, one per event) support `candidate`: 1.0 for a quote, else the best share
    of its content words found in one source sentence of the same polarity (0.0 without content words)."""
    if quoted(candidate, sources):
        return 1.0
    wanted = content_words(candidate)
    if not wanted:
        return 0.0
    polarity = negated(candidate)
    best = 0.0
    for source in sources:
        for sentence in sentences(source):
            if negated(sentence) == polarity:
                best = max(best, len(wanted & content_words(sentence)) / len(wanted))
    return best


def corroboration(candidate: str, sources: Sequence[str]) -> float:
    """The share of `candidate`'s content words found in `sources` other than the one supporting it best (the one
    quoting it, else the one with the sentence sharing most of its content words); 0.0 without content words."""
    wanted = content_words(candidate)
    if not wanted or not sources:
        return 0.0
    needle = normalize(candidate)
    shares = [2.0 if needle and needle in normalize(source) else
              max((len(wanted & content_words(s)) / len(wanted) for s in sentences(source)), default=0.0)
              for source in sources]
    best = shares.index(max(shares))
    others: set[str] = set()
    for index, source in enumerate(sources):
        if index != best:
            others |= content_words(source)
    return len(wanted & others) / len(wanted)


def quoted(candidate: str, sources: Iterable[str]) -> bool:
    """True when the normalized `candidate` occurs in the normalized text of one of `sources`."""
    needle = normalize(candidate)
    return bool(needle) and any(needle in normalize(source) for source in sources)


def supported(candidate: str, sources: Sequence[str]) -> bool:
    """True when `candidate` is quoted from `sources` or all its content words occur in one source sentence of the
    same polarity (see the module docstring); a `qa` entry when its question and its answer each are."""
    parts = qa_parts(candidate)
    if parts is not None:
        return all(support(part, sources) >= 1.0 for part in parts)
    return support(candidate, sources) >= 1.0


_QA = re.compile(r"Q: (?P<q>.+?\?) A: (?P<a>.+)\Z", re.DOTALL)


def qa(question: str, answer: str) -> str:
    """The entry that keeps `answer` with the `question` it answers: "Q: <question> A: <answer>"."""
    return f"Q: {question} A: {answer}"


def qa_parts(text: str) -> tuple[str, str] | None:
    """(question, answer) of a `qa` entry; None for any other text."""
    match = _QA.match(text)
    return (match.group("q"), match.group("a")) if match else None


_VOCATIVE = re.compile(r"^([A-Z][a-z]+)(?=\s*[!?])|(?:,\s+|^[^\W\d_]+\s+)([A-Z][a-z]+)(?=\s*(?:[,!?]|\.?\s*$))")
_NAME_BEFORE_PUNCTUATION = re.compile(r"\b([A-Z][a-z]+)(?=\s*(?:[,!?]|\.?\s*$))")


def vocatives(sentence: str, names: Iterable[str] = ()) -> set[str]:
    """The content words of `sentence` that are names in address position (see the module docstring): "gina" of
    "Hey Gina!" and of "Cool, Gina!", nothing of "We moved to Berlin last year.". `names` (casefolded, e.g. the
    `vocatives` of the rest of the conversation: its speakers) are also vocatives wherever they stand before a
    comma, "!", "?" or the sentence's end ("Whoa, congrats Priya!")."""
    text = sentence.strip()
    found = {stem(m.casefold()) for pair in _VOCATIVE.findall(text) for m in pair if m and not _KEY_SHAPE.search(m)}
    known = {stem(n) for n in names}
    return found | {stem(m.casefold()) for m in _NAME_BEFORE_PUNCTUATION.findall(text) if stem(m.casefold()) in known}


def interjection(sentence: str, names: Iterable[str] = ()) -> bool:
    """True when `sentence`, its vocatives aside (`vocatives`, with `names`), has no content word, or has at most two
    words, ends with "!" and names no key name ("Hey Gina!", "Cool, Gina!", "Ha!")."""
    called = vocatives(sentence, names)
    if not content_words(sentence) - called:
        return True
    rest = [w for w in words(sentence) if stem(w) not in called]
    return len(rest) <= 2 and sentence.rstrip().rstrip("\"')").endswith("!") and not key_names(sentence)


def vacuous(candidate: str) -> bool:
    """True when `candidate` has fewer than two distinct content words, vocatives aside ("The feature is a
    feature.", "Wow, Caroline!")."""
    return len(content_words(candidate) - vocatives(candidate)) < MIN_CONTENT_WORDS


def matches_example(candidate: str, examples: Iterable[str], sources: Sequence[str]) -> bool:
    """True when `candidate` is not quoted from `sources` and its content words overlap those of one sentence of
    `examples` with a Jaccard index of at least 0.6 (or it equals that sentence once normalized)."""
    if quoted(candidate, sources):
        return False
    mine = content_words(candidate)
    for example in examples:
        for sentence in sentences(example):
            theirs = content_words(sentence)
            if normalize(sentence) == normalize(candidate):
                return True
            if mine and theirs and len(mine & theirs) / len(mine | theirs) >= EXAMPLE_JACCARD:
                return True
    return False


_JSON_OPENING = re.compile(r"\s*(?:\{\s*(?:\"|\})|\[\s*(?:[\"{\[\]\d-]|true|false|null))")


def json_shaped(text: str) -> bool:
    """True when `text` opens like JSON of an object or a list (`{"`, `{}`, `["`, `[{`, `[1`, `[]`, ...; white
    space allowed): a tool call or a tool result, whole or cut off. "[server]" or "{braces} in prose" is not."""
    return bool(_JSON_OPENING.match(text))


def key_names(text: str) -> list[str]:
    """The identifiers, file names and numbers in `text` (see the module docstring), in order, without trailing
    sentence punctuation."""
    found = []
    for token in _KEY_NAME.findall(text):
        token = token.rstrip(".:!?")
        if token and _KEY_SHAPE.search(token) and not _ABBREVIATION.match(token):
            found.append(token)
    return found


def looping(sentence: str, n: int = 3) -> bool:
    """True when `sentence` repeats itself: some run of `n` words occurs three times or more, or its word n-grams
    are more than half duplicates."""
    ws = words(sentence)
    grams = [tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)]
    if len(grams) < 3:
        return False
    counts: dict[tuple[str, ...], int] = {}
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    return max(counts.values()) >= 3 or len(counts) < math.ceil(len(grams) / 2)


def is_invented(name: str, source_text: str) -> bool:
    """True when the key name `name` does not occur in `source_text` (casefolded); numbers of one or two digits are
    never invented (a Summary may count: "3 turns")."""
    return not (name.isdigit() and len(name) <= 2) and name.casefold() not in source_text


@dataclass(frozen=True)
class SummaryCheck:
    """What `check_summary` made of a Summary: the kept `text`, how many sentences the raw output had and how many
    were cut as repeats, worked-example echoes, names absent from the source or claims the source does not support
    (`unsupported`), how many labelled lines were marked paraphrases (`relabelled`), whether an unterminated tail
    was trimmed, and `problem`: why the output is degenerate (None when `text` is usable)."""

    text: str
    sentences: int
    repeated: int
    echoed: int
    invented: int
    trimmed: bool
    problem: str | None
    unsupported: int = 0
    relabelled: int = 0


# Words a Summary uses about the conversation rather than from it ("The user asked ..."): not part of a claim.
SUMMARY_META = frozenset(stem(w) for w in (
    "user users assistant asked asks ask said says say told tells tell explained explains explain mentioned "
    "mentions mention discussed discuss suggested suggests suggest agreed agree conversation summary wanted wants "
    "want noted note confirmed confirm decided decide event events turn turns starting start").split())
PARAPHRASE = " (paraphrase): "


def claim_supported(sentence: str, sources: Sequence[str]) -> bool:
    """True when the Summary sentence `sentence` is quoted from `sources`, or when its content words, the words
    about the conversation (`SUMMARY_META`: "user", "asked", "said", ...) aside, all occur in one source sentence of
    the same polarity; a sentence of only such words claims nothing and is not supported."""
    if quoted(sentence, sources):
        return True
    wanted = content_words(sentence) - SUMMARY_META
    polarity = negated(sentence)
    return bool(wanted) and any(wanted <= content_words(s) for source in sources for s in sentences(source)
                                if negated(s) == polarity)


def _labelled(line: str) -> tuple[str, str]:
    """A Summary line split into its speaker label ("assistant: ", or "" without one) and the text after it."""
    match = SPEAKER_LABEL.match(line)
    return (match.group(0), line[match.end():]) if match else ("", line)


def check_summary(text: str, *, sources: Sequence[str], examples: Iterable[str] = (),
                  speakers: Mapping[str, Sequence[str]] | None = None) -> SummaryCheck:
    """Clean a Summary and judge it, line by line.

    Each line (`summary_lines`: a fenced code block is part of the line it
    opens in) keeps its speaker label ("user: ", "assistant: ", "summary: ",
    ...); its sentences are checked apart and the ones kept are joined again
    with a space, so the Summary keeps its line structure. Sentences are cut
    when they repeat an earlier one (once normalized), when they loop
    (`looping`; not a sentence quoted from the source, which is what it is),
    when they match a worked example (`matches_example`), when they name a
    key name (`key_names`) that no source contains (`is_invented`), or when
    the source does not support their claim (`claim_supported`: the check is
    per sentence). A line left with no sentence is dropped, label and all.
    With `speakers` (the texts each speaker said, by lowercase label name), a
    labelled line is kept under its label only when every sentence it keeps
    is a quote of that speaker; otherwise its label is marked a paraphrase
    ("user (paraphrase): ..."), so a replay never shows invented words as a
    quote. A final sentence without terminal punctuation (output cut off by a
    token limit) is trimmed when a complete sentence precedes it. The result
    is degenerate when nothing is left, or when the cuts removed half of the
    sentences or more.
    """
    examples = tuple(examples)
    source_text = "\n".join(sources).casefold()
    lines = [(label, sentences(body)) for label, body in map(_labelled, summary_lines(text))]
    count_all = sum(len(parts) for _, parts in lines)
    kept: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    total = repeated = echoed = invented = unsupported = relabelled = 0
    last_kept = False  # whether the last sentence of all was kept
    for label, parts in lines:
        keep: list[str] = []
        for sentence in parts:
            total += 1
            last_kept = False
            norm = normalize(sentence)
            if norm in seen or (looping(sentence) and not quoted(sentence, sources)):
                repeated += 1
            elif matches_example(sentence, examples, sources):
                echoed += 1
            elif any(is_invented(name, source_text) for name in key_names(sentence)):
                invented += 1
            elif not claim_supported(sentence, sources) and not (total == count_all and not terminated(sentence)):
                unsupported += 1  # (a cut-off tail is trimmed below instead)
            else:
                keep.append(sentence)
                last_kept = True
            seen.add(norm)
        if keep and label and speakers is not None:
            said = speakers.get(label[:-2].lower(), ())
            if not all(quoted(sentence, said) for sentence in keep):
                label = label[:-2] + PARAPHRASE
                relabelled += 1
        if keep:
            kept.append((label, keep))
    count = sum(len(keep) for _, keep in kept)
    trimmed = count > 1 and last_kept and not terminated(kept[-1][1][-1])
    if trimmed:
        kept[-1][1].pop()
        if not kept[-1][1]:
            kept.pop()
    cut = repeated + echoed + invented + unsupported
    problem = None
    if not kept:
        problem = "nothing is left once repeats, worked-example echoes, invented names and unsupported claims are cut"
    elif total and 2 * cut >= total:
        problem = (f"{cut} of its {total} sentences were cut ({repeated} repeated, {echoed} echoing the worked "
                   f"example, {invented} naming what the source does not, {unsupported} not supported by the "
                   "source)")
    cleaned = "\n".join(label + " ".join(keep) for label, keep in kept)
    return SummaryCheck(cleaned, total, repeated, echoed, invented, trimmed, problem, unsupported, relabelled)
