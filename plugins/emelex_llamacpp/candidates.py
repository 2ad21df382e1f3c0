"""The source's own statements, for extractive output: sentences split from the events, filtered and bounded.

A candidate is a sentence of one event's text (`faithfulness.sentences`),
verbatim. Dropped: questions, sentences with fewer than two content words,
pure conversation (only words like "thanks", "sure", "noted"), and sentences
over `MAX_CANDIDATE_CHARS`. For facts, also dropped: proposals ("We could
...", "Maybe ...", "How about ...") and the last sentence of an event the
other side answers with a rejection ("No, ...", "Not now", "Absolutely not").
Lines of an earlier Summary count as sentences of the speaker their label
names ("user: ...", "assistant: ...", "summary: ..."; a line without one is
the Summary's own, speaker "summary"), the label itself not part of any
sentence. Fact candidates never come from a Summary event: it is the
pipeline's own output, not what the conversation said. Duplicates (once
normalized) are kept once, first occurrence.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from emelex_memory import Event
from emelex_workers.faithfulness import SPEAKER_LABEL, content_words, normalize, sentences, stem
from emelex_workers.plugin_api import event_body

MAX_CANDIDATE_CHARS = 240
CHATTER = frozenset(
    "thanks thank ok okay sure good great nice perfect fine right agreed understood noted done yes yeah yep "
    "welcome glad hear happy help cool awesome talk later bye hello hi hey choice sounds plan lot anytime "
    "problem course absolutely exactly true way youre thats enough today".split()
)
_CHATTER_STEMS = frozenset(stem(w) for w in CHATTER)
_PROPOSAL = re.compile(
    r"^(?:(?:we|you|i) (?:could|might)\b|maybe\b|perhaps\b|how about\b|what if\b|shall\b|would you\b|"
    r"do you want\b|want to\b|let's consider\b|one option\b)", re.IGNORECASE)
_REJECTION = re.compile(r"^(?:no\b|nope\b|not now\b|not yet\b|absolutely not\b|don't\b|do not\b|rather not\b|"
                        r"never\b|let's not\b)", re.IGNORECASE)


@dataclass(frozen=True)
class Candidate:
    """One statement of the source: its verbatim `text`, the index of its event and the speaker ("user", ...)."""

    text: str
    event: int
    speaker: str


def _statements(events: Sequence[Event], *, summaries: bool) -> list[tuple[int, str, list[str]]]:
    """(event index, speaker, sentences) per event, Summary events only with `summaries`; an earlier Summary's
    labelled lines keep their speaker."""
    out = []
    for index, event in enumerate(events):
        body = event_body(event)
        if event.kind == "summary":
            if not summaries:
                continue
            for line in body.splitlines():
                match = SPEAKER_LABEL.match(line)
                speaker = match.group(0)[:-2].lower() if match else "summary"
                out.append((index, speaker, sentences(line[match.end():] if match else line)))
        else:
            out.append((index, event.kind, sentences(body)))
    return out


def chatter(sentence: str) -> bool:
    """True when every content word of `sentence` is conversation ("Thanks, that's all.", "Good choice.")."""
    return content_words(sentence) <= _CHATTER_STEMS


def candidates(events: Sequence[Event], *, facts: bool) -> list[Candidate]:
    """The candidate statements of `events` in source order (see the module docstring); `facts` leaves Summary
    events out and adds the proposal and rejection filters."""
    statements = _statements(events, summaries=not facts)
    rejected: set[tuple[int, str]] = set()
    if facts:
        for (i, speaker, parts), (_j, other, reply) in zip(statements, statements[1:], strict=False):
            if parts and reply and other != speaker and _REJECTION.match(reply[0]):
                rejected.add((i, parts[-1]))
    seen: set[str] = set()
    found = []
    for index, speaker, parts in statements:
        for sentence in parts:
            norm = normalize(sentence)
            if (sentence.endswith("?") or len(sentence) > MAX_CANDIDATE_CHARS or len(content_words(sentence)) < 2
                    or chatter(sentence) or norm in seen):
                continue
            if facts and (_PROPOSAL.match(sentence) or (index, sentence) in rejected):
                continue
            seen.add(norm)
            found.append(Candidate(sentence, index, speaker))
    return found
