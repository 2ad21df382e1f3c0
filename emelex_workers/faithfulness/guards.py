"""The worker's faithfulness guards around every summarizer and distiller, whichever plugin provides them.

`guard_candidates` checks a distiller's proposals against the job's source
and drops, counting each under its reason in the job's result:

- `rejected_confidence`: a confidence that is not a number in [0, 1];
- `rejected_invalid`: a key or content Knowledge would refuse (empty, too
  long, control characters);
- `rejected_machinery`: content that is the agent's machinery, not what was
  said: JSON (a tool call's arguments, a tool result, a failure record, an
  audit event), whole or cut off, alone or as the answer of a
  question-and-answer entry, or text quoted from an event outside `SAID_KINDS` ("user",
  "assistant") and from no said event, or quoted only from sentences that
  were not said but relayed from a tool or asked of the agent
  (`said.excluded`: an assistant's quoted tool output, a request such as
  "Run `ls`"), or, quoted from nothing, made only of words of the
  machinery's texts. A fact a tool result established is
  kept when the candidate states it in words that add to it (it is then
  supported like any other), with the job's source range, which holds the
  call, as provenance;
- `rejected_vacuous`: content with fewer than two content words, vocatives
  aside, or a question-and-answer entry whose answer is a greeting, thanks or
  an exclamation (`checks.interjection`: "Q: Did you find the right spot? A:
  Hey Gina!");
- `rejected_example`: content matching a worked example the plugin declares
  and not quoted from the source;
- `rejected_unsupported`: content the source does not support;
- `rejected_conflicting`: a second, different proposal for a key already
  proposed (the first one is kept).

Tombstone proposals carry no content and pass unchanged. The checks are
defined in `checks.py`. A candidate is checked against the source's
conversation events only: a Summary event in the range (a compaction landed
inside it) is the pipeline's own output, not something the conversation said,
so it never supports a fact.

`guard_summary` cleans a Summary with `faithfulness.check_summary` (repeated
and looping sentences, worked-example echoes, names absent from the source
and claims it does not support, sentence by sentence, are cut; a line
labelled with a speaker whose words it does not quote is marked a
paraphrase, "user (paraphrase): ..."; an unterminated tail is trimmed). A degenerate Summary is a
`DegenerateOutputError`, a counted, retryable failure whose diagnostic
carries a digest of the output; when a later attempt returns output with a
digest an earlier diagnostic names, it is a `RepeatedOutputError`,
terminal: retrying a summarizer that does not vary its output cannot help.
A summarizer that made no model call on the attempt (rule-based, such as the
built-in extractive mode) computes the same output again, so its degenerate
Summary is a `DeterministicOutputError` at once, terminal, saying what a user
can do: nothing was replaced, so the Session goes on with its full history;
another span (other kept turns) is a new plan, or another summarizer
(`EMELEX_SUMMARIZER`) may do better. It does not point at the abstractive
mode: on the default model that writes worse Summaries, not better.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from itertools import islice

from emelex_memory import (
    DegenerateOutputError,
    DeterministicOutputError,
    DistillationResult,
    Event,
    InvalidKnowledgeError,
    Job,
    KnowledgeCandidate,
    RepeatedOutputError,
)
from emelex_memory.knowledge.distillation import MAX_RAW_CANDIDATES
from emelex_memory.sessions.transcript import SUMMARY_KIND
from emelex_memory.knowledge.values import validate_content, validate_key

from . import checks as fx
from .records import record_texts
from .said import excluded
from ..worker.attempts import attempt_text
from ..host.types import SAID_KINDS, event_body

REASONS = ("confidence", "invalid", "machinery", "vacuous", "example", "unsupported", "conflicting")


def source_texts(events: Iterable[Event]) -> list[str]:
    """The texts the Summary guard checks against: each event's `event_body` (a base Summary included), then the
    records of its tool calls and failed turns (`records.machinery_records`)."""
    events = list(events)
    return [event_body(e) for e in events] + [r for made in record_texts(events).values() for r in made]


def speaker_texts(events: Iterable[Event]) -> dict[str, list[str]]:
    """What each speaker said, by event kind ("user", "assistant", ...): each event's `event_body`; a base
    Summary's labelled lines count as their label's speaker's, its other lines as "summary"'s; the records of
    tool calls count as "tool"'s, those of failed turns as "system"'s (`records.machinery_records`)."""
    events = list(events)
    said: dict[str, list[str]] = {speaker: list(made) for speaker, made in record_texts(events).items()}
    for e in events:
        if e.kind != SUMMARY_KIND:
            said.setdefault(e.kind, []).append(event_body(e))
            continue
        for line in fx.summary_lines(event_body(e)):
            match = fx.SPEAKER_LABEL.match(line)
            name = match.group(0)[:-2].lower() if match else SUMMARY_KIND
            said.setdefault(name, []).append(line[match.end():] if match else line)
    return said


def fact_sources(events: Iterable[Event]) -> list[str]:
    """The texts Knowledge candidates are checked against: the `event_body` of each event that is not a Summary."""
    return [event_body(e) for e in events if e.kind != SUMMARY_KIND]


def machinery(content: str, said: Sequence[str], other: Sequence[str], kept: Sequence[str] | None = None) -> bool:
    """True when `content`, or the question or the answer of a `qa` entry, opens like JSON of an object or a list
    (`checks.json_shaped`: a tool call or result, whole or cut off), or when `content` is quoted from one of `other`
    (texts of events outside `SAID_KINDS`) and from none of `said`. With `kept` (the said texts without their
    relayed, unanswering and request sentences, `said.excluded`), also when its statement (a `qa` entry's answer) is
    quoted from `said` but from none of `kept`, or is quoted from nothing and every content word of it is a word of
    `other`."""
    parts = fx.qa_parts(content)
    if any(fx.json_shaped(part) for part in (content, *(parts or ()))):
        return True
    if fx.quoted(content, other) and not fx.quoted(content, said):
        return True
    if kept is None:
        return False
    statement = parts[1] if parts else content
    if fx.quoted(statement, said):
        return not fx.quoted(statement, kept)
    spoken = fx.content_words(statement)
    return bool(spoken) and not fx.quoted(content, said) and spoken <= fx.content_words(" ".join(other))


def _reason(c: KnowledgeCandidate, sources: Sequence[str], examples: Sequence[str], said: Sequence[str],
            other: Sequence[str], kept: Sequence[str], names: frozenset[str]) -> str | None:
    conf = c.confidence
    if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not math.isfinite(conf) or not 0 <= conf <= 1:
        return "confidence"
    try:
        validate_key(c.key)
        if not c.tombstone:
            validate_content(c.content)
    except InvalidKnowledgeError:
        return "invalid"
    if c.tombstone:
        return None
    if machinery(c.content, said, other, kept):
        return "machinery"
    parts = fx.qa_parts(c.content)
    if fx.vacuous(c.content) or (parts is not None and fx.interjection(parts[1], names)):
        return "vacuous"
    if fx.matches_example(c.content, examples, sources):
        return "example"
    if not fx.supported(c.content, sources):
        return "unsupported"
    return None


def guard_candidates(proposals: object, *, events: Iterable[Event], examples: Sequence[str] = ()) -> object:
    """A `DistillationResult` of the faithful `KnowledgeCandidate`s among `proposals`, with the counts of the
    dropped ones by reason (see the module docstring).

    Anything that is not an iterable of `KnowledgeCandidate`s (or more than
    the 512 proposals a job may read) is returned as it is, for
    `validate_candidates` to refuse with its typed error.
    """
    if isinstance(proposals, (str, bytes)) or not isinstance(proposals, Iterable):
        return proposals
    raw = list(islice(proposals, MAX_RAW_CANDIDATES + 1))
    if len(raw) > MAX_RAW_CANDIDATES or not all(isinstance(c, KnowledgeCandidate) for c in raw):
        return raw
    events = list(events)
    sources = fact_sources(events)
    said = [event_body(e) for e in events if e.kind in SAID_KINDS]
    other = [event_body(e) for e in events if e.kind not in SAID_KINDS and e.kind != SUMMARY_KIND]
    other += [str(e.payload.get("output", "")) for e in events if e.kind == "tool_result" and isinstance(e.payload, dict)]
    unsaid = excluded(events)
    kept_said = [s for i, e in enumerate(events) if e.kind in SAID_KINDS
                 for s in fx.sentences(event_body(e)) if s not in unsaid.get(i, ())]
    names = frozenset(n for text in said for s in fx.sentences(text) for n in fx.vocatives(s))
    counts = dict.fromkeys(REASONS, 0)
    kept: dict[str, KnowledgeCandidate] = {}
    for c in raw:
        reason = _reason(c, sources, examples, said, other, kept_said, names)
        if reason is None and kept.setdefault(c.key, c) != c:
            reason = "conflicting"
        if reason is not None:
            counts[reason] += 1
    return DistillationResult(tuple(kept.values()), {f"rejected_{r}": n for r, n in counts.items()})


def output_digest(text: str) -> str:
    """The first 12 hex digits of the SHA-256 of `text`: how diagnostics name a rejected output."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def guard_summary(text: str, *, job: Job, events: Iterable[Event], examples: Sequence[str] = (),
                  model_called: bool = True) -> str:
    """The cleaned Summary `text` for `job`, or `DegenerateOutputError` / `RepeatedOutputError` when the summarizer
    called the model (`model_called`), `DeterministicOutputError` when it did not (see the module docstring)."""
    return guarded_summary(text, job=job, events=events, examples=examples, model_called=model_called).text


def summary_cuts(check: fx.SummaryCheck) -> dict[str, int]:
    """What the guards took out of a usable Summary, for the job's result: the sentences cut by reason
    (`cut_repeated`, `cut_echoed`, `cut_invented`, `cut_unsupported`), the lines marked paraphrases
    (`relabelled`) and a trimmed unfinished tail (`cut_tail`); only the nonzero ones."""
    counts = {"cut_repeated": check.repeated, "cut_echoed": check.echoed, "cut_invented": check.invented,
              "cut_unsupported": check.unsupported, "relabelled": check.relabelled, "cut_tail": int(check.trimmed)}
    return {k: v for k, v in counts.items() if v}


def guarded_summary(text: str, *, job: Job, events: Iterable[Event], examples: Sequence[str] = (),
                    model_called: bool = True) -> fx.SummaryCheck:
    """`guard_summary`, returning the whole check of a usable Summary (its cleaned `text` and what was cut, see
    `summary_cuts`) rather than its text alone; the same errors for a degenerate one."""
    events = list(events)
    check = fx.check_summary(text, sources=source_texts(events), examples=examples, speakers=speaker_texts(events))
    if check.problem is None:
        return check
    digest = output_digest(text)
    marker = f"output {digest}"
    if not model_called:
        kept = job.source.get("preserve_turns")
        other = f" with N other than {kept}" if kept is not None else ""
        raise DeterministicOutputError(
            f"degenerate Summary ({marker}): {check.problem}; the summarizer made no model call, so a retry would "
            "compute the same output and none is made; nothing was replaced: the Session keeps its full history and "
            f"can go on as it is; to compact it, plan another span with `emelex memory compact {job.session_id} "
            f"--force --preserve-turns N`{other}, or choose another summarizer (EMELEX_SUMMARIZER)"
        )
    if any(marker in d.message for d in job.diagnostics):
        raise RepeatedOutputError(
            f"{attempt_text(job.attempts + 1)} returned the same degenerate Summary ({marker}) as an earlier attempt: "
            f"{check.problem}; the summarizer does not vary its output on retry, so use a larger model "
            "(emelex models install PATH) or another summarizer, then retry the job"
        )
    raise DegenerateOutputError(f"degenerate Summary ({marker}): {check.problem}; a retry asks the summarizer to vary "
                                "its sampling")
