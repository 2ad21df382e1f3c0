"""Extractive output: Summaries and Knowledge that can only quote the source (the default modes).

Both start from the source's candidate statements (`candidates.py`), which
are verbatim sentences of its events; a Summary's also include the rule-made
records of tool rounds and failed turns (`faithfulness.machinery_records`),
so a chat Session's Summary says which tools ran on what with what outcome.

*Summary.* The statements that carry the most of what a compacted history
must keep are chosen greedily: each step takes the statement with the most
new key names (identifiers, file names, numbers, code spans; weighted 3) plus new
content words per token, until the Summary reaches its length: half the
source's tokens (at least 48), at most the job's Summary budget. Statements
a later one supersedes (`candidates.supersedes`) are not candidates. An
answer is taken only together with the question it answers (the question's
sentence, verbatim, its last clause when it is longer than 16 words), both
counted against the length: a Summary never holds a question-less answer;
a tool call's record is taken with the question before its round the same
way (the question quoted once however many records and answers follow it).
Each record is new to the Summary until it is taken (`_names`), so every
distinct call counts, even on a tool and a path named before.
*Decisions* (`candidates.decision`: statements naming a value or an
identifier, such as a command, a version or a file, or saying use / keep /
pin / set / ...; and the statement that settles what the other side asked:
the first sentence of a reply to a question, when it states something) go first, and first among them the decisions that change
something (`candidates.change`: "... instead", "switch ... from ... to",
"renamed", "is now"). A step of a long compaction summarizes the
previous Summary and a new slice of the conversation: the previous
Summary's decisions are taken first, within half the length, so a chain
keeps every step's decisions while they fit; then the new slice's decisions
(changes first), then its other statements, then the previous Summary's other lines, each by
the same rule, so a step never just repeats the previous Summary. Ties go
to the earlier statement. They are
written in source order, one line per event (each tool call's record on a
line of its own labelled "tool"), `speaker: sentence ...`,
verbatim but for one thing: a sentence without terminal punctuation (the
end of a line or message) gets a full stop, so that sentences written on one
line stay apart for the guards and for the next step's Summary; a sentence
that would still run into the one before it (it opens with a lowercase
letter, as a listing echoed line by line does) starts a new line under the
same label, and so does a fenced code block, kept whole, line breaks
included, and the sentence after it. No
model call: on the quality benchmark's development set the 135M model's own
choices were no better than chance (see benchmarks/RESULTS.md), so the
Summary's content is chosen by these rules alone.

*Knowledge.* Every fact candidate becomes a Knowledge candidate with its
content (`Candidate.content`: the statement, verbatim, or a fragment answer
with its question as "Q: ... A: ..."). The model labels each with a topic
chosen from the statement's own words: one grammar-constrained call per 24
statements, whose JSON schema gives every statement an `enum` of its key
names and content words, so the label too can only quote the statement.
The key (`knowledge_key`) is 2 to 4 words of the statement (a key name
such as `setup.py` counts as one word), the label first, then the
statement's other topic options in order; the same statement
always gets the key it already has in the workspace's Knowledge, and a key
that already names a different statement (in the workspace's Knowledge as
the distiller is shown it, or earlier in the job) is never reused: the key
grows by a word, up to 4, then takes a number. A statement that supersedes
a workspace entry (`candidates.supersedes`: it changes the entry's value)
takes that entry's key instead, so it is the key's new version. The
confidence is evidence, not chosen (`confidence`, `candidates.Evidence`):
0.45, plus 0.15 if stated as a decision or fact, 0.15 if confirmed by the
other side, 0.1 if repeated (corroboration of 0.5 or more), 0.1 if
uncontested.
"""

from __future__ import annotations

import math
import re

from emelex_memory import KnowledgeCandidate
from emelex_workers.faithfulness import (
    CODE_SPAN,
    content_words,
    corroboration,
    key_names,
    normalize,
    sentences,
    terminated,
    vocatives,
)
from emelex_workers.plugin_api import SAID_KINDS, DistillRequest, SummaryRequest, event_body

from .candidates import (
    RECORD_SPEAKERS,
    Candidate,
    Evidence,
    candidates,
    change,
    decision,
    evidence,
    proper_names,
    questions,
    speaker_names,
    substance,
    supersedes,
)
from .keys import knowledge_key

SUMMARY_SHARE = 1 / 2
MIN_SUMMARY_TOKENS = 48
KEY_NAME_WEIGHT = 3


def names(statement: str) -> set[str]:
    """What a Summary must not lose from `statement`: its key names, its code spans (commands) and its capitalized
    words after the first (proper names such as "Celery"; not a vocative: "Priya" of "Hi Priya!"), casefolded."""
    found = {n.casefold() for n in key_names(statement)} | {m.casefold() for m in CODE_SPAN.findall(statement)}
    found |= {w.casefold() for w in re.findall(r"(?<=\s)[A-Z][\w-]*", statement)} - vocatives(statement)
    return found


def _names(c: Candidate) -> set[str]:
    """`names(c.text)`, and for a record (`candidates.RECORD_SPEAKERS`) the record itself: each call said is new,
    even when its tool and its path were each named before."""
    return names(c.text) | ({normalize(c.text)} if c.speaker in RECORD_SPEAKERS else set())


def _gain(c: Candidate, covered: set[str], seen: set[str]) -> int:
    return KEY_NAME_WEIGHT * len(_names(c) - covered) + len(content_words(c.text) - seen)


def _lines(speaker: str, parts: list[str]) -> list[str]:
    """`speaker: sentence ...` for `parts`, each terminated; a sentence the splitter would join to the one before it
    (one that opens with a lowercase letter: "file 40 config.toml") starts a new line under the same label, and a
    fenced code block has a line of its own (`faithfulness.summary_lines` reads it whole)."""
    runs: list[list[str]] = []
    for part in (p if terminated(p) else p + "." for p in parts):
        fenced = part.startswith("```") or (runs and runs[-1][-1].startswith("```"))
        if runs and not fenced and sentences(" ".join([*runs[-1], part])) == [*runs[-1], part]:
            runs[-1].append(part)
        else:
            runs.append([part])
    return [f"{speaker}: " + " ".join(run) for run in runs]


def _render(units: list[list[Candidate]]) -> str:
    """The chosen statements (each unit an answer's question, if any, then the statement) in source order, one line
    per event or earlier Summary line."""
    lines: list[str] = []
    run: list[str] = []
    last: tuple[int, str] | None = None
    chosen = {id(c): c for unit in units for c in unit}.values()
    for c in sorted(chosen, key=lambda c: c.order):
        if last is not None and (c.line, c.speaker) != last:
            lines += _lines(last[1], run)
            run = []
        run.append(c.text)
        last = (c.line, c.speaker)
    if last is not None:
        lines += _lines(last[1], run)
    return "\n".join(lines)


def _pool(request: SummaryRequest) -> list[Candidate]:
    """The summary candidates; for a source with none (only questions or small talk), the text of its first event
    said (`SAID_KINDS`) or, without one, of its first event, as it is (never a context note when something was
    said)."""
    pool = candidates(request.events, facts=False)
    if pool:
        return pool
    texts = [(i, e.kind, event_body(e).strip()) for i, e in enumerate(request.events) if event_body(e).strip()]
    said = [t for t in texts if t[1] in SAID_KINDS]
    return [Candidate(text, i, kind) for i, kind, text in (said or texts)[:1]]


def _settling(pool: list[Candidate], asked: dict[int, Candidate]) -> set[int]:
    """The ids of the statements that settle what the other side asked: the first sentence said in reply to a
    question (`candidates.questions`; not a record) when it states something (two substantive words or more)."""
    first: dict[int, Candidate] = {}
    for c in pool:
        if c.line in asked and c.speaker not in RECORD_SPEAKERS and c.line not in first:
            first[c.line] = c
    return {id(c) for c in first.values() if len(substance(c.text)) >= 2}


PREVIOUS_DECISIONS_SHARE = 1 / 2
NAMED = 2  # proper names that make a statement a decision of the Summary ("booked a site at Pine Hollow")


def summarize(request: SummaryRequest) -> str:
    """An extractive Summary of the job's source (see the module docstring), within `request.budget_tokens`."""
    model = request.model
    source_tokens = sum(model.count_tokens(event_body(e)) for e in request.events)
    target = min(request.budget_tokens, max(MIN_SUMMARY_TOKENS, math.ceil(SUMMARY_SHARE * source_tokens)))
    pool = _pool(request)
    asked = questions(request.events)
    fresh = {id(c): request.events[c.event].kind != "summary" for c in pool}
    settling = _settling(pool, asked)
    decisive = {id(c): decision(c.text) or len(proper_names(c.text)) >= NAMED or id(c) in settling for c in pool}
    changes = {id(c): change(c.text) for c in pool}
    order = {id(c): -c.order for c in pool}
    tokens = {c.text: model.count_tokens(c.text) + 2 for c in [*pool, *asked.values()]}
    units: list[list[Candidate]] = []
    covered: set[str] = set()
    seen: set[str] = set()
    picked: set[int] = set()  # the lines of the questions already in the Summary
    used = 0

    def unit(c: Candidate) -> list[Candidate]:
        question = asked.get(c.line)
        return [c] if question is None or question.line in picked else [question, c]

    def cost(c: Candidate) -> int:
        return sum(tokens[u.text] for u in unit(c))

    def tier(c: Candidate) -> int:
        if not fresh[id(c)]:
            return 0
        return 3 if changes[id(c)] else 2 if decisive[id(c)] else 1

    def take(remaining: list[Candidate], limit: float, rank) -> None:
        nonlocal used
        while remaining:
            best = max(remaining, key=lambda c: (_gain(c, covered, seen) > 0, rank(c),
                                                 _gain(c, covered, seen) / cost(c), order[id(c)]))
            remaining.remove(best)
            if _gain(best, covered, seen) == 0:
                break
            if used + cost(best) > limit:
                continue
            used += cost(best)
            units.append(unit(best))
            picked.update(u.line for u in unit(best)[:-1])
            covered.update(_names(best))
            seen.update(content_words(best.text))

    # The previous Summary's decisions first, within half the target: a chain keeps every step's decisions.
    take([c for c in pool if decisive[id(c)] and not fresh[id(c)]], PREVIOUS_DECISIONS_SHARE * target, tier)
    take([c for c in pool if not any(c is u for unit_ in units for u in unit_)], target, tier)
    units = units or [unit(pool[0])]
    text = _render(units)
    while len(units) > 1 and model.count_tokens(text) > request.budget_tokens:
        units.pop()
        text = _render(units)
    return text


CONFIDENCE_BASE = 0.45
CONFIDENCE_WEIGHTS = {"stated": 0.15, "confirmed": 0.15, "repeated": 0.1, "uncontested": 0.1}


def confidence(found: Evidence) -> float:
    """0.45 plus 0.15 if stated as a decision or fact, 0.15 if confirmed by the other side, 0.1 if repeated, 0.1 if
    uncontested (see `candidates.Evidence`): from 0.45 to 0.95."""
    return round(CONFIDENCE_BASE + sum(w for name, w in CONFIDENCE_WEIGHTS.items() if getattr(found, name)), 2)


def superseded_key(statement: str, knowledge, claimed: set[str]) -> str | None:
    """The key of the workspace entry whose value `statement` changes (`candidates.supersedes`), unless this job
    already gave that key to another statement."""
    for entry in knowledge:
        if entry.content is not None and entry.key not in claimed and supersedes(statement, entry.content):
            return entry.key
    return None


def distill(request: DistillRequest) -> list[KnowledgeCandidate]:
    """Every fact candidate of the source as Knowledge, with a readable key (`keys.knowledge_key`), its evidence as
    confidence and the time of its event as `said_at`; within the density bound (`densest`). No model call."""
    events = request.data.events
    found = candidates(events, facts=True)
    names = speaker_names(events)
    sources = [event_body(e) for e in events if e.kind in SAID_KINDS]  # a Summary or a tool result supports nothing
    scored = [(c, confidence(evidence(c, events, corroboration(c.content, sources)))) for c in found]
    said_tokens = sum(request.model.count_tokens(text) for text in sources)
    taken = {e.key: e.content for e in request.data.knowledge if e.content is not None}
    claimed: set[str] = set()
    out: list[KnowledgeCandidate] = []
    for c, conf in densest(scored, said_tokens)[: request.max_candidates]:
        key = superseded_key(c.content, request.data.knowledge, claimed) or knowledge_key(c.content, taken, names)
        taken[key] = c.content
        claimed.add(key)
        out.append(KnowledgeCandidate(key, c.content, conf, said_at=events[c.event].created_at))
    return out


PER_KILOTOKEN, MIN_KEPT = 100, 8


def densest(scored: list[tuple[Candidate, float]], said_tokens: int) -> list[tuple[Candidate, float]]:
    """At most 100 of `scored` (candidate, confidence) per 1,000 tokens said (`said_tokens`; at least 8): the richest,
    by how many key names, proper names and substantive words each states, then by confidence, in source order."""
    bound = max(MIN_KEPT, PER_KILOTOKEN * said_tokens // 1000)
    if len(scored) <= bound:
        return scored

    def richness(c: Candidate) -> int:
        return len(key_names(c.content)) + len(proper_names(c.content)) + len(substance(c.content))

    richest = sorted(scored, key=lambda pair: (-richness(pair[0]), -pair[1], pair[0].order))[:bound]
    chosen = {id(c) for c, _conf in richest}
    return [pair for pair in scored if id(pair[0]) in chosen]
