"""Knowledge keys a person can read: the entry's subject in its own words, stable across Sessions.

A key names what an entry is *about*, not what it says about it, so that a
later value of the same subject lands on the same key (a new version) and
`emelex memory knowledge list` reads like a page of notes (`default-branch`,
`timeout-settings-live`, `second-shop-maple`):

- Its words are the entry's *subject words*, in the order the entry says
  them: for a question-and-answer entry the question's first (what was asked
  about), then the answer's when the question has fewer than two.
- A subject word is a word of three letters or more that is not a function
  word, small talk, a negation, a vocative or a name the speakers address
  each other by, nor a *value*: a number, a version, a code span, a date
  word (a month or a weekday) or a key name that is one (`120`, `3.12.1`,
  `python:3.12`); values change, subjects stay. An identifier or file name
  is one word (`server/http.go` is `server-http-go`). Subject words end at
  the first "is", "are", "uses", "runs", "lives", ... once there is one:
  what follows says what the subject is or does ("The default branch is
  main." is `default-branch`); a one-word subject takes the first subject
  word after it ("The project uses hatchling." is `project-hatchling`).
  Units of values ("seconds", "percent", "days") are not subject words.
  When a sentence opens
  with a speaker ("I", "We", "Let's", ...), the verb right after it is
  passed over ("We *format* the code with ..." is about the code, "I'm
  *opening* a second shop ..." about the shop), and so are adverbs ("-ly")
  and light words ("just", "still", "going", "get", ...).
- A key is the first three subject words (fewer when there are fewer; "note"
  when there is none), lowercase, joined by "-", at most 64 characters.
- Stability: an entry whose statement, or a near-duplicate of it (content
  words, vocatives aside, in common with a Jaccard index of at least 0.75:
  "Wow, the soup is frozen, Gina!" and "The soup is frozen."), the workspace
  already holds takes that key: a new version or a confirmation, not an
  eleventh key; a key that names a
  *different* statement is never reused: the key grows by the next subject
  word, up to four, then takes a number (`second-shop-maple-2`). A statement
  that supersedes a workspace entry takes that entry's key
  (`extractive.superseded_key`).
"""

from __future__ import annotations

import re

from emelex_workers.faithfulness import (
    CODE_SPAN,
    NEGATIONS,
    STOP_WORDS,
    content_words,
    key_names,
    normalize,
    qa_parts,
    stem,
    vocatives,
)

from .candidates import CHATTER, values

KEY_WORDS, MAX_KEY_WORDS = 3, 4
MAX_KEY_LENGTH = 64
NEAR = 0.75  # content words in common (Jaccard) of a near-duplicate
LIGHT = frozenset("still just really also even already actually finally quite very going gonna get gets got getting "
                  "make makes made let lets want wants like know think thing things way lot lots quick update "
                  "one since because although though while whether".split())
COPULAS = frozenset("is are was were stays remains becomes uses runs lives has keeps sets goes".split())
DATES = frozenset("january february march april may june july august september october november december monday "
                  "tuesday wednesday thursday friday saturday sunday mondays tuesdays wednesdays thursdays fridays "
                  "saturdays sundays today tomorrow yesterday tonight week weekend month year morning mornings "
                  "evening evenings night days hours minutes seconds weeks months years percent instead".split())
_SPEAKER_OPENING = re.compile(r"^\W*(?:i|i'm|im|i've|i'd|i'll|we|we're|we've|we'll|we'd|you|you're|they|they're|"
                              r"he|she|let's|lets)\b\s*", re.IGNORECASE)
_TOKEN = re.compile(r"[^\s,;:!?()\[\]{}\"'`<>]+(?:'[a-z]+)?")


def _slug(text: str) -> str:
    return "-".join(re.findall(r"[a-z0-9]+", text.casefold()))


def subject_words(statement: str, names: frozenset[str] = frozenset()) -> list[str]:
    """The subject words of `statement` (a `qa` entry: its question's, then its answer's when the question has
    fewer than two), in order, each a slug (see the module docstring)."""
    parts = qa_parts(statement)
    if parts is None:
        return _words_of(statement, names)
    asked = _words_of(parts[0], names)
    return asked if len(asked) >= 2 else asked + [w for w in _words_of(parts[1], names) if w not in asked]


def _words_of(sentence: str, names: frozenset[str]) -> list[str]:
    said_values = values(sentence)
    called = vocatives(sentence, names) | {stem(n) for n in names}
    text = CODE_SPAN.sub(" ", sentence)
    opening = _SPEAKER_OPENING.match(text)
    skip_verb = opening is not None
    text = text[opening.end():] if opening else text
    out: list[str] = []
    passed = None  # the verb passed over: the subject when nothing else is ("Let's do 4 *shards*.")
    told = False  # past the "is" of a one-word subject
    for token in _TOKEN.findall(text):
        token = token.rstrip(".")
        folded = token.casefold()
        if not token or folded in said_values or re.search(r"\d", token):
            continue
        if key_names(token):  # an identifier or a file name: one word
            if skip_verb:
                skip_verb = False
            word = _slug(token)
        else:
            word = re.sub(r"['\u2019](?:s|re|m|ll|ve|d|t)$", "", folded).replace("'", "").replace("\u2019", "")
            if word in COPULAS and out:
                if len(out) > 1:
                    break  # what follows "is" / "are" is what the subject is: its value
                told = True  # a one-word subject takes the first word of what it is ("project-hatchling")
                continue
            if not word.isalpha() or word in STOP_WORDS or word in NEGATIONS or len(word) < 3:
                continue
            if word in CHATTER or word in LIGHT or word in DATES or word.endswith("ly"):
                continue
            if skip_verb:
                skip_verb, passed = False, word
                continue
            if stem(word) in called:
                continue
        if word and word not in out:
            out.append(word)
            if told:
                break
    return out or ([passed] if passed else [])


def _near(content: str) -> frozenset[str]:
    return frozenset(content_words(content) - vocatives(content))


def knowledge_key(statement: str, taken: dict[str, str], names: frozenset[str] = frozenset()) -> str:
    """The key for `statement` (see the module docstring). `taken` maps the keys in use (the workspace's Knowledge
    and this job's keys) to their contents; the key of the same statement or a near-duplicate is reused, one naming
    another statement never."""
    norm, near = normalize(statement), _near(statement)
    for key, content in taken.items():
        other = _near(content)
        if normalize(content) == norm or (near and other and len(near & other) / len(near | other) >= NEAR):
            return key
    parts = subject_words(statement, names) or ["note"]
    key = "-".join(parts[:KEY_WORDS])[:MAX_KEY_LENGTH].strip("-")
    for n in range(KEY_WORDS + 1, MAX_KEY_WORDS + 1):
        if key not in taken or n > len(parts):
            break
        key = "-".join(parts[:n])[:MAX_KEY_LENGTH].strip("-")
    base, number = key, 2
    while key in taken and normalize(taken[key]) != norm:
        key, number = f"{base}-{number}", number + 1
    return key
