"""The source's own statements, for extractive output: sentences split from the events, filtered and bounded.

A candidate is a sentence of one event's text (`faithfulness.sentences`),
verbatim. Only what was *said* is a candidate: events of the kinds in
`SAID_KINDS` ("user", "assistant") and, for a Summary, the lines of an
earlier Summary. Tool calls and their arguments, tool results, turn failures,
audit and context events are the agent's machinery, never a fact candidate (a
fact a tool result established is a candidate in the words the assistant said
it in). For a Summary, each tool round and each failed turn is one statement
of *records* instead (`faithfulness.machinery_records`, made by rule: which
tool ran with which arguments and what came of it; speaker "tool" or
"system", like an earlier Summary's lines so labelled): each record is a
candidate, once, filtered by nothing else; records supersede nothing and are
not superseded, and an answer after a tool round answers the question before
the round.

Dropped always: sentences that open like JSON (`faithfulness.json_shaped`: a
small model's answer that is a tool call, whole or cut off), questions,
sentences with fewer than two content words,
pure conversation (only words like "thanks", "sure", "noted"), sentences
over `MAX_CANDIDATE_CHARS`, and statements *superseded* later in the source
(`superseded`): a later statement that gives the same subject another value,
or retires the value ("from `a` to `b`", "renamed `a` to `b`"), or says it
changes a named place or thing (`renamed_place`), or gives a new weekday,
month or name where the earlier gave one and says all the earlier said
(`renamed_value`); see `supersedes`. Duplicates
(once normalized) are kept once, first occurrence.

For facts (Knowledge) also dropped:

- proposals, suggested or reported ("We could ...", "Maybe ...", "How about
  ...", "Someone proposed ..."): a proposal is never stored, so never
  without its rejection; the rejection itself is a statement like any other;
- the last sentence of an event the other side answers with a rejection
  ("No, ...", "Not now", "Absolutely not");
- episodic state (`episodic`): the state of the moment ("is stuck", "right
  now", "since Monday", "fixed"), debugging steps and hypotheses ("Try ...",
  "I think ...", "Possibly ..."), sentences that lean on the context (they
  open with "It", "This", "That", "They", ..., a greeting before a comma
  aside, with no clause of their own after ", so", ", and", ... that opens
  with "I", "we", "our", ...; or say "for that", "on it", "that time",
  "this error"), and a short plan of the speaker's (at most 6 words)
  that names nothing ("OK, I'll close the ticket.");
- sentences of fewer than two *substantive* words (content words that are
  neither small talk nor negations: "Not yet.", "Right, not 1%.");
- sentences spoken to the other speaker (`exchange`: the second person,
  "you", "your") that name nothing (no key name, value or proper name):
  about the exchange, not a fact a later reader can place ("I can walk you
  through your options.").

A *fragment answer* (the first sentence of a reply to a question that opens
with "yes" / "no", or has at most 8 words, counted as runs of non-space,
and opens with no subject such as "We", "The", "Our") means nothing alone
("In config/server.yaml."), and neither does a first reply sentence that
leans on the question ("It lives in .github/workflows/ci.yml."): each is a
candidate only with the question it answers (`question`, the question's
sentence verbatim), stored as `qa(question, answer)`: "Q: Where do the
timeout settings live? A: In config/server.yaml.". A question that is itself
a proposal or hypothesis ("Maybe the cache is why?") lends its answer
nothing: the answer is judged alone; one without a substantive word ("Can
you help?") makes no entry. Lines of an earlier Summary count as sentences
of the speaker their label names ("user: ...", "assistant: ...", "summary: ..."; a
line without one is the Summary's own, speaker "summary"), the label itself
not part of any sentence. Fact candidates never come from a Summary event: it
is the pipeline's own output, not what the conversation said.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from emelex_memory import Event
from emelex_workers.faithfulness import (
    CODE_SPAN,
    NEGATIONS,
    SPEAKER_LABEL,
    content_words,
    excluded,
    interjection,
    json_shaped,
    key_names,
    machinery_records,
    negated,
    normalize,
    qa,
    qa_parts,
    sentences,
    stem,
    summary_lines,
    vocatives,
    words,
)
from emelex_workers.plugin_api import SAID_KINDS, event_body

MAX_CANDIDATE_CHARS = 240
RECORD_SPEAKERS = frozenset({"tool", "system"})  # the speakers of rule-made records (`faithfulness.records`)
FRAGMENT_WORDS = 8
CHATTER = frozenset(
    "thanks thank ok okay sure good great nice perfect fine right agreed understood noted done yes yeah yep "
    "welcome glad hear happy help cool awesome talk later bye hello hi hey choice sounds plan lot anytime "
    "problem course absolutely exactly true way youre thats enough today yet else anything something "
    "interesting".split()
)
_CHATTER_STEMS = frozenset(stem(w) for w in CHATTER)
_NEGATION_STEMS = frozenset(stem(w) for w in NEGATIONS)
_PROPOSAL = re.compile(
    r"^(?:(?:we|you|i) (?:could|might)\b|maybe\b|perhaps\b|how about\b|what if\b|shall\b|would you\b|"
    r"do you want\b|want to\b|let's consider\b|one option\b)|\b(?:proposed|proposes|suggested|suggests)\b",
    re.IGNORECASE)
_REJECTION = re.compile(r"^(?:no\b|nope\b|not now\b|not yet\b|absolutely not\b|don't\b|do not\b|rather not\b|"
                        r"never\b|let's not\b)", re.IGNORECASE)
_EPISODIC = re.compile(
    r"\b(?:right now|at the moment|currently|just now|a (?:minute|moment|second|while) ago|yesterday|"
    r"since (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|yesterday|this morning)|"
    r"(?:is|are|got) stuck|keeps? (?:failing|crashing)|fails? with|is (?:failing|crashing|down|restarting)|"
    r"already fixed|(?:is|got|was) fixed|fixed (?:it|now)|now it works|works now|try again|pass again)\b|^fixed\b"
    r"|^(?:try|check|look at|see if|restart|rerun|wait|i think|i guess|i suspect|probably|possibly|perhaps)\b"
    r"|\b(?:that|this) (?:time|error|issue|problem|bug|failure)\b|\b(?:on|for|with|at|about) (?:it|this|that|them)\b"
    r"|\b(?:to|around|like|after|before|without) (?:it|this|that|them)[.!]?$",
    re.IGNORECASE)
_LEANS = re.compile(r"^(?:it|its|this|that|these|those|they|there|he|she|his|her|him|them)\b", re.IGNORECASE)
_PLAN = re.compile(r"^(?:\w+, )?(?:i'll|i will|i'm going to|let me)\b", re.IGNORECASE)
PLAN_WORDS = 6
_SUBJECT = re.compile(r"^(?:we|i|you|they|he|she|it|the|a|an|our|your|their|this|that|these|those|there|"
                      r"my|its)\b", re.IGNORECASE)
_YES_NO = re.compile(r"^(?:yes|yeah|yep|no|nope)\b", re.IGNORECASE)
_RETIRED = re.compile(r"\b(?:from|renamed?|replaced?|instead of)\s+`?([^\s`]+?)`?[,.]?\s+(?:to|with|by)\b",
                      re.IGNORECASE)
SUBJECT_OVERLAP = 0.6


@dataclass(frozen=True)
class Candidate:
    """One statement of the source: its verbatim `text`, the index of its event, the speaker ("user", ...), its
    place in the source (`order`, sentences counted in source order; `line`, the event or Summary line it is a
    sentence of) and, for a fact candidate that is an answer, the `question` it answers (verbatim, else None)."""

    text: str
    event: int
    speaker: str
    order: int = 0
    question: str | None = None
    line: int = 0

    @property
    def content(self) -> str:
        """What the statement says on its own: the text, or `qa(question, text)` for an answer."""
        return self.text if self.question is None else qa(self.question, self.text)


def _statements(events: Sequence[Event], *, summaries: bool) -> list[tuple[int, str, list[str]]]:
    """(event index, speaker, sentences) per event said (`SAID_KINDS`), and, with `summaries`, per Summary event
    (an earlier Summary's labelled lines keep their speaker) and per tool round or failed turn (its records,
    `faithfulness.machinery_records`, speaker "tool" or "system"), in source order."""
    out = []
    made = {index: (speaker, texts) for index, speaker, texts in machinery_records(events)} if summaries else {}
    for index, event in enumerate(events):
        body = event_body(event)
        if index in made:
            out.append((index, *made[index]))
        elif event.kind == "summary":
            if not summaries:
                continue
            for line in summary_lines(body):
                match = SPEAKER_LABEL.match(line)
                speaker = match.group(0)[:-2].lower() if match else "summary"
                out.append((index, speaker, sentences(line[match.end():] if match else line)))
        elif event.kind in SAID_KINDS:
            out.append((index, event.kind, sentences(body)))
    return out


def _said_before(statements: Sequence[tuple[int, str, list[str]]], position: int) -> int | None:
    """The position of the statement before `position` that is not a record (`RECORD_SPEAKERS`): what an answer
    after a tool round replies to."""
    return next((p for p in range(position - 1, -1, -1) if statements[p][1] not in RECORD_SPEAKERS), None)


def chatter(sentence: str, names: frozenset[str] = frozenset()) -> bool:
    """True when every content word of `sentence`, its vocatives aside (`faithfulness.vocatives`, with the speakers'
    `names`), is conversation ("Thanks, that's all.", "Good choice.", "Cool, Gina!")."""
    return content_words(sentence) - vocatives(sentence, names) <= _CHATTER_STEMS


def substance(sentence: str, names: frozenset[str] = frozenset()) -> set[str]:
    """The content words of `sentence` that are neither small talk, negations nor vocatives."""
    return content_words(sentence) - _CHATTER_STEMS - _NEGATION_STEMS - vocatives(sentence, names)


REMARK_WORDS = 3


def remark(sentence: str) -> bool:
    """True when `sentence` has at most three words and names nothing: no key name, value or proper name ("Makes
    sense.", "Long time.", "Ha, I know."): a remark, not a statement."""
    return len(sentence.split()) <= REMARK_WORDS and not key_names(sentence) and not proper_names(sentence)


def speaker_names(events: Sequence[Event]) -> frozenset[str]:
    """The names the speakers of `events` address each other by: the vocatives of what was said."""
    return frozenset(n for e in events if e.kind in SAID_KINDS for s in sentences(event_body(e)) for n in vocatives(s))


def addressed(sentence: str, names: frozenset[str] = frozenset()) -> str:
    """`sentence` without what opens it before its first comma when that is a greeting, an interjection or a
    vocative alone (`faithfulness.interjection`; not a yes or no, which answers): "that dinner was the best!" of
    "Hey Sam, that dinner was the best!"; else `sentence`."""
    head, comma, rest = sentence.partition(", ")
    if not comma or not rest or _YES_NO.match(head) or negated(head):
        return sentence
    return rest if interjection(head + "!", names) else sentence


def leans(sentence: str, names: frozenset[str] = frozenset()) -> bool:
    """True when `sentence`, a greeting or interjection before it set aside (`addressed`), opens with a word that
    points into its context ("It", "They", "That", ...) and has no clause of its own after it (`own_clause`)."""
    return bool(_LEANS.match(addressed(sentence, names))) and not own_clause(sentence)


_CLAUSE = re.compile(r"(?:,\s+(?:so|and|but)|;)\s+(?=(?:i|we|you|my|our|your)\b)", re.IGNORECASE)


def own_clause(sentence: str) -> bool:
    """True when `sentence` has a clause after ", so", ", and", ", but" or ";" that opens with a speaker ("I", "we",
    "our", ...) and is no plan of theirs ("I'll ...", `_PLAN`): it says something on its own even when it opens
    leaning on its context ("They closed the pool, so we swim at the Northside Centre now.")."""
    return any(not _PLAN.match(sentence[m.end():]) for m in _CLAUSE.finditer(sentence))


_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself|yourselves)\b", re.IGNORECASE)


def exchange(sentence: str) -> bool:
    """True when `sentence` speaks to the other speaker (the second person: "you", "your") and names nothing: no key
    name, value or proper name ("I can walk you through your options.", "Your garden sounds lovely."). It is about
    the exchange, which a later reader cannot place; a sentence that names something says it about that ("You need
    Python 3.11 to build it.")."""
    return bool(_SECOND_PERSON.search(CODE_SPAN.sub(" ", sentence))) and not key_names(sentence) \
        and not proper_names(sentence)


def episodic(sentence: str, *, answers: bool = False, names: frozenset[str] = frozenset()) -> bool:
    """True when `sentence` is state of the moment, a debugging step or hypothesis, a short plan of the speaker's
    that names nothing (at most 6 words), or leans on its context (`leans`: opening with "It", "They", ..., a
    greeting before it aside; not when it `answers` a question it is kept with, which says what "it" is); see the
    module docstring."""
    plan = bool(_PLAN.match(sentence)) and not key_names(sentence) and len(sentence.split()) <= PLAN_WORDS
    return bool(_EPISODIC.search(sentence)) or plan or (not answers and leans(sentence, names))


_VALUE = re.compile(r"\d|v\d|.*:\d", re.IGNORECASE)  # a number, a version ("v2"), a tag or port ("python:3.12")


def _names(sentence: str) -> tuple[set[str], set[str]]:
    """(subjects, values) of `sentence`, casefolded (see `subjects` and `values`)."""
    subject, value = set(), {m.casefold() for m in CODE_SPAN.findall(sentence)}
    for name in key_names(CODE_SPAN.sub(" ", sentence)):
        for kind, part in _kinds(name.casefold()):
            (subject if kind == "subject" else value).add(part)
    return subject, value


def values(sentence: str) -> set[str]:
    """The values `sentence` states, casefolded: its code spans, and its key names that are numbers, versions or
    tags (starting with a digit or "v" and a digit, or with ":" before a digit: `120`, `3.12.1`, `python:3.12`),
    and what follows `=` in a key name (`DEPLOY_ROLE=release-bot` states "release-bot")."""
    return _names(sentence)[1]


def subjects(sentence: str) -> set[str]:
    """The identifiers `sentence` is about, casefolded: its other key names outside code spans (`IdleTimeout`,
    `server/http.go`, `search-02`), and the left side of `NAME=value`."""
    return _names(sentence)[0]


def _topic(sentence: str) -> set[str]:
    """The content words of `sentence` that are neither values nor small talk: what it is about."""
    said = {w for v in values(sentence) for w in content_words(v)}
    return substance(sentence) - said


def same_subject(earlier: str, later: str) -> bool:
    """True when `earlier` and `later` are about one subject: when both name identifiers (`subjects`), when they
    share one; else when the words they are about (`_topic`) overlap with a Jaccard index of at least 0.6."""
    mine, theirs = subjects(earlier), subjects(later)
    if mine and theirs:
        return bool(mine & theirs)
    a, b = _topic(earlier), _topic(later)
    return bool(a and b) and len(a & b) / len(a | b) >= SUBJECT_OVERLAP


_INSTEAD = re.compile(r"\binstead of\s+`?([^\s`]+?)`?[,.;]?(?=\s|$)", re.IGNORECASE)


def retired(sentence: str) -> set[str]:
    """The values `sentence` retires, casefolded: `a` in "from `a` to `b`", "renamed `a` to `b`", "replaced `a`
    with `b`", "`b` instead of `a`"."""
    return {m.casefold().rstrip(".,") for m in (*_RETIRED.findall(sentence), *_INSTEAD.findall(sentence))}


PAIR_DISTANCE = 4  # a value this many words or fewer after an identifier is that identifier's value


def settings(sentence: str) -> dict[str, set[str]]:
    """The identifiers of `sentence` that it gives a value, with those values, casefolded: each value (`values`)
    belongs to the nearest identifier (`subjects`) at most 4 words before it ("sets IdleTimeout to 5 seconds",
    `DEPLOY_ROLE=release-bot`; a code span is one word)."""
    spans = iter(CODE_SPAN.findall(sentence))
    out: dict[str, set[str]] = {}
    subject, since = None, 0
    for token in CODE_SPAN.sub(" \0 ", sentence).split():
        found = [("value", next(spans).casefold())] if token == "\0" else [
            kind for name in key_names(token) for kind in _kinds(name.casefold())]
        for kind, name in found:
            if kind == "subject":
                subject, since = name, 0
            elif subject is not None and since <= PAIR_DISTANCE:
                out.setdefault(subject, set()).add(name)
        since += 1
    return out


def _kinds(name: str) -> list[tuple[str, str]]:
    if "=" in name:
        left, right = name.split("=", 1)
        return [("subject", left), ("value", right)]
    return [("value" if _VALUE.match(name) else "subject", name)]


def supersedes(later: str, earlier: str) -> bool:
    """True when `later` changes a value `earlier` states: it retires one of them or a word of it ("from `a` to `b`",
    "switched the formatter from black to ruff"); or both give
    one identifier a value (`settings`) and `earlier`'s is not among `later`'s; or, when one of them names no
    identifier, they are about the same subject (`same_subject`) and `later` states a value `earlier` does not (when
    it also repeats `earlier`'s, "25 percent; 30 was too wet", it holds all `earlier` says) or changes a place or
    thing `earlier` names (`renamed_place`), or gives a new weekday, month or name and all `earlier` says
    (`renamed_value`)."""
    old, new = values(earlier), values(later)
    if (old | content_words(earlier)) & retired(later):
        return True
    mine, theirs = settings(earlier), settings(later)
    shared = mine.keys() & theirs.keys()
    if shared:
        return any(mine[name] - theirs[name] for name in shared)
    if subjects(earlier) and subjects(later):
        return False
    return bool(new - old) and same_subject(earlier, later) or renamed_place(later, earlier) \
        or renamed_value(later, earlier)


# The kind of a named value: a weekday or a month (the calendar's own names, singular or plural), else a name.
_CALENDAR = {**{d.casefold(): "weekday" for d in calendar.day_name},
             **{m.casefold(): "month" for m in calendar.month_name if m}}


def named_values(sentence: str) -> dict[str, set[str]]:
    """The names `sentence` states (`proper_names` of each of its sentences; of a "Q: ... A: ..." entry, of its
    question and its answer), by kind: "weekday" ("Thursdays" is "thursday"), "month", or "name" (a place, a
    person, a thing)."""
    out: dict[str, set[str]] = {}
    said = [s for part in (qa_parts(sentence) or (sentence,)) for s in sentences(part)]  # each opens with a capital
    for name in {n for s in said for n in proper_names(s)}:
        single = name.removesuffix("s")
        kind = _CALENDAR.get(name) or _CALENDAR.get(single) or "name"
        out.setdefault(kind, set()).add(name if kind == "name" else single if single in _CALENDAR else name)
    return out


def renamed_value(later: str, earlier: str) -> bool:
    """True when neither names an identifier (`subjects`: those are the settings' rules), `later` gives a value of
    every kind `earlier` names (`named_values`: a weekday, a month, a name), a new one for at least one kind (none of
    `earlier`'s of that kind), and they are about one subject: they name one thing in common and share a word of
    what they are about (their substantive words, names aside), or, naming nothing in common, those words overlap
    with a Jaccard index of at least 0.6: "Choir practice happens on Fridays at the Elm Hall." after "Our choir
    practice is on Wednesdays at the Elm Hall.", whatever verb says so. A later statement that leaves out a kind
    the earlier named changes only part of it, and replaces nothing."""
    if subjects(earlier) or subjects(later):
        return False
    old, new = named_values(earlier), named_values(later)
    if not old or not old.keys() <= new.keys() or all(old[kind] & new[kind] for kind in old):
        return False
    if any(old[kind] & new[kind] for kind in old):  # the same thing named again, with a new value of another kind
        return bool(_about(earlier, old, new) & _about(later, old, new))
    mine, theirs = _about(earlier, old, new), _about(later, old, new)
    return bool(mine and theirs) and len(mine & theirs) / len(mine | theirs) >= SUBJECT_OVERLAP


def _about(sentence: str, *named: dict[str, set[str]]) -> set[str]:
    """The substantive words of `sentence` (of a "Q: ... A: ..." entry, its question's and answer's; not "Q" and
    "A"), the names of `named` aside: what it is about."""
    names = {stem(n) for kinds in named for found in kinds.values() for n in found}
    return substance(" ".join(qa_parts(sentence) or (sentence,))) - names


_NOT_NOW = re.compile(r"\bnot now\b", re.IGNORECASE)


def renamed_place(later: str, earlier: str) -> bool:
    """True when neither names an identifier or states a value (`subjects`, `values`: a file, a number, a code
    span; those are the settings' rules), `earlier` names a place or thing (`proper_names`), and `later` says it
    changes something (`_CHANGE`: "now", "moved", "switched", ...; not "not now"), names a place or thing `earlier`
    does not (a word of it anywhere in `earlier`), and shares a word of what it is about with `earlier` (their
    substantive words, names aside): "We left the library and now meet at Kettle Cafe." after "Our book club meets
    at the Elm Street library."."""
    if any(subjects(s) or values(s) for s in (earlier, later)) or not _CHANGE.search(_NOT_NOW.sub("", later)):
        return False
    old, new = proper_names(earlier), proper_names(later)
    return bool(old) and bool(new - set(words(earlier))) \
        and bool((substance(earlier) - old) & (substance(later) - new))


def superseded(statements: Sequence[str]) -> set[int]:
    """The indexes of `statements` (in source order) that a later one supersedes (`supersedes`)."""
    return {i for i, earlier in enumerate(statements)
            if any(supersedes(later, earlier) for later in statements[i + 1:])}


def _question(previous: tuple[int, str, list[str]] | None, speaker: str) -> str | None:
    """The question the event after `previous` answers: `previous`'s last sentence when the other side asked it."""
    if previous is None or previous[1] == speaker or not previous[2] or not previous[2][-1].endswith("?"):
        return None
    return previous[2][-1]


def fragment(answer: str) -> bool:
    """True when `answer`, the first sentence of a reply to a question, needs the question to mean anything: it
    opens with yes or no, or it has at most 8 words (runs of non-space, a code span one) and does not
    open with a subject ("We", "The", "Our", "It", ...): "In config/server.yaml.", "INFO by default."."""
    short = len(CODE_SPAN.sub("code", answer).split()) <= FRAGMENT_WORDS and not _SUBJECT.match(answer)
    return short or bool(_YES_NO.match(answer))


def candidates(events: Sequence[Event], *, facts: bool) -> list[Candidate]:
    """The candidate statements of `events` in source order (see the module docstring); `facts` leaves Summary
    events out and adds the filters for Knowledge (proposals, rejections, episodic state, fragment answers)."""
    statements = _statements(events, summaries=not facts)
    rejected: set[tuple[int, str]] = set()
    names = speaker_names(events)
    unsaid = excluded(events) if facts else {}
    if facts:
        for (i, speaker, parts), (_j, other, reply) in zip(statements, statements[1:], strict=False):
            if parts and reply and other != speaker and _REJECTION.match(reply[0]) \
                    and not interjection(reply[0], names):  # "No way!" is surprise, not a rejection
                rejected.add((i, parts[-1]))
    seen: set[str] = set()
    found: list[Candidate] = []
    order = 0
    records: set[int] = set()  # indexes in `found` of records, which no statement supersedes nor is superseded by
    for position, (index, speaker, parts) in enumerate(statements):
        before = _said_before(statements, position)
        asked = None if speaker in RECORD_SPEAKERS or before is None else _question(statements[before], speaker)
        for number, sentence in enumerate(parts):
            order += 1
            norm = normalize(sentence)
            if speaker in RECORD_SPEAKERS:
                if norm not in seen:
                    seen.add(norm)
                    records.add(len(found))
                    found.append(Candidate(sentence, index, speaker, order, None, position))
                continue
            if sentence.endswith("?") or len(sentence) > MAX_CANDIDATE_CHARS or norm in seen or json_shaped(sentence):
                continue
            if interjection(sentence, names) or (facts and sentence in unsaid.get(index, ())):
                continue  # a greeting or an exclamation; relayed, unanswering or a request (`faithfulness.said`)
            question = None
            if facts and number == 0 and asked is not None and not _PROPOSAL.search(asked) and (
                    fragment(sentence) or _LEANS.match(sentence)):
                question = asked
            if facts and question is not None:
                told = {w for w in substance(sentence, names) if not w.endswith("ly")}  # "Definitely." tells nothing
                if not substance(question, names) or (not told and not _YES_NO.match(sentence)):
                    continue
            elif len(content_words(sentence) - vocatives(sentence, names)) < 2 or chatter(sentence, names):
                continue
            if facts and (_PROPOSAL.search(sentence) or (index, sentence) in rejected
                          or episodic(sentence, answers=question is not None, names=names)
                          or (question is None and exchange(sentence))
                          or (question is None and (len(substance(sentence, names)) < 2 or remark(sentence)))):
                continue
            seen.add(norm)
            found.append(Candidate(sentence, index, speaker, order, question, position))
    said = [i for i in range(len(found)) if i not in records]
    dropped = {said[i] for i in superseded([found[i].text for i in said])}
    return [c for i, c in enumerate(found) if i not in dropped]


def questions(events: Sequence[Event]) -> dict[int, Candidate]:
    """For each `Candidate.line` (of the Summary candidates) that answers a question of the other side, that
    question, shortened (`shorten`), as a `Candidate` of its own line: what a Summary quotes before the answer.
    A tool round's records answer the question before the round, as the answer after it does (one `Candidate`
    for both: the Summary quotes it once)."""
    statements = _statements(events, summaries=True)
    out: dict[int, Candidate] = {}
    by_line: dict[int, Candidate] = {}
    ends = list(accumulate(len(parts) for _index, _speaker, parts in statements))  # each line's last sentence's order
    for position, (_index, speaker, _parts) in enumerate(statements):
        before = _said_before(statements, position)
        asked = None if before is None else _question(statements[before], speaker)
        if before is not None and asked is not None:
            index, asker, _ = statements[before]
            out[position] = by_line.setdefault(before, Candidate(shorten(asked), index, asker, ends[before],
                                                                 line=before))
    return out


MAX_QUESTION_WORDS = 16


def shorten(question: str) -> str:
    """`question` itself when it has at most 16 words, else its last clause (after the last ", ", "; " or ": ")
    when that has three words or more: still a verbatim part of it."""
    if len(words(question)) <= MAX_QUESTION_WORDS:
        return question
    clause = re.split(r"[,;:]\s+", question)[-1]
    return clause if len(words(clause)) >= 3 else question


def contested(statement: str, later: Sequence[str]) -> bool:
    """True when a later statement about the same subject (`same_subject`) has the opposite polarity."""
    return any(negated(s) != negated(statement) and same_subject(statement, s) for s in later)


_DECISION = re.compile(r"\b(?:use|uses|using|keep|keeps|kept|pin|pins|pinned|set|sets|decided|chose|chosen|switch|"
                       r"switched|always|never|must|only|stays|renamed|raise|raised|lower|lowered)\b", re.IGNORECASE)
_AGREEMENT = re.compile(r"^(?:yes|yeah|yep|ok|okay|agreed|right|exactly|correct|understood|noted|done|good|great|"
                        r"perfect|sounds good|confirmed)\b", re.IGNORECASE)
REPEATED = 0.5


def decision(statement: str) -> bool:
    """True when `statement` is stated as a decision or a fact: it names a value or an identifier (`values`,
    `subjects`: a command in backticks, a version, a file), or says use / keep / pin / set / always / never / ..."""
    subject, value = _names(statement)
    return bool(subject or value or _DECISION.search(statement))


def proper_names(statement: str) -> set[str]:
    """The capitalized words of `statement` after its first word, casefolded, its vocatives and "I" aside: the named
    places, people and things it states something about ("Lisbon" of "I signed up for the Lisbon half marathon.")."""
    tokens = [t.strip(".,;:!?()\"'") for t in CODE_SPAN.sub(" ", statement).split()[1:]]
    found = {t.casefold() for t in tokens if len(t) > 1 and t[0].isupper() and t[1:].islower() and t != "I"}
    return found - vocatives(statement)


_CHANGE = re.compile(r"\b(?:instead|rather than|switch|switched|renamed?|replaced?|moved|changes? to|changed to|now|"
                     r"raise[sd]?|lower(?:s|ed)?|from \S+ to)\b", re.IGNORECASE)


def change(statement: str) -> bool:
    """True when `statement` is a decision (`decision`) that changes something: it says "instead", "switch",
    "renamed", "now", "from ... to", ... ("Use `pip install --no-build-isolation -e .` instead.")."""
    return decision(statement) and bool(_CHANGE.search(statement))


@dataclass(frozen=True)
class Evidence:
    """What a reader can check about a fact candidate in its source: it is `stated` as a decision or a fact
    (`decision`), `confirmed` by the other side (their next
    words open with agreement or restate two of its substantive words), `repeated` (its corroboration is at least
    0.5), and `uncontested` (no later statement about the same subject has the opposite polarity)."""

    stated: bool
    confirmed: bool
    repeated: bool
    uncontested: bool


def evidence(c: Candidate, events: Sequence[Event], corroboration: float) -> Evidence:
    """The `Evidence` for the fact candidate `c` of `events`, given its measured `corroboration`."""
    said = [(i, e.kind, event_body(e)) for i, e in enumerate(events) if e.kind in SAID_KINDS]
    reply = next((text for i, kind, text in said if i > c.event and kind != c.speaker), "")
    first = (sentences(reply) or [""])[0]
    confirmed = bool(_AGREEMENT.match(first)) or len(substance(reply) & substance(c.text)) >= 2
    later = [s for i, _kind, text in said if i > c.event for s in sentences(text)]
    return Evidence(decision(c.text), confirmed, corroboration >= REPEATED,
                    not contested(c.text, later))
