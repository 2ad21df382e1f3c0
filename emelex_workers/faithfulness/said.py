"""What a Session's speakers said, told apart from what the assistant relayed and what the user asked the agent to do.

Knowledge is what was said. Two kinds of sentences in `user` and `assistant`
events are not, and are recognised from the transcript itself, not from their
wording:

- *Relayed* (an assistant sentence): three quarters or more of its content
  words, vocatives and an opening word set off by ":" or "," ("Noted: ...")
  aside (words compared by their first five letters), were already in the
  agent's machinery before it (the arguments of a tool call, a tool
  result's output, a context note such as the files read for a request or
  the recalled notes) or in the user's words it replies to.
  It repeats what a tool printed or what the user just said ("config.toml:
  port = 5174", "run_command echo hi: hi", "wrote 8 bytes to notes.txt"),
  under any turn policy: a quoted answer and a paraphrase of a tool result
  alike. A fact a tool established is Knowledge only in words that add to it.
- *Unanswering* (an assistant sentence of an agent Session, one with tool
  calls, tool results or context notes): it shares no content word with the
  user's message it replies to, so it answers something else ("I can read,
  list and search the files ..." in reply to "We format with ruff.").
- *A request* (a user sentence of an agent Session): a sentence that is not a
  question, does not open with a subject ("We", "The", "Our", ...), and
  holds what its own turn then acted on: a tool call's argument in that turn
  (a path, a command) or the path of a file read for it, whole, as a token
  of its own ("Run ls and tell me the output.", "Run `echo
  hi`", "Create notes.txt with the text: hi", "Explain in detail what app.py
  does."; not "We water the beds ..." because the turn read water.py).

`excluded(events)` gives the sentences of each event that are relayed,
unanswering or requests; the extractive distiller leaves them out and the
worker's guard (`guards.guard_candidates`) rejects a candidate quoting only such
sentences, whichever distiller proposed it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from emelex_memory import Event

from .checks import content_words, sentences, vocatives, words

SAID = ("user", "assistant")
_SUBJECT_OPENERS = frozenset("we i you they he she it the a an our your their this that these those there my its "
                             "his her".split())


def _body(event: Event) -> str:
    payload = event.payload
    return payload["text"] if isinstance(payload, dict) and isinstance(payload.get("text"), str) else \
        json.dumps(payload, sort_keys=True)


def agent_session(events: Sequence[Event]) -> bool:
    """True when `events` hold the agent's machinery: tool calls, tool results or context notes."""
    return any(e.kind in ("tool_calls", "tool_result", "context") for e in events)


def _arguments(event: Event) -> list[str]:
    """The argument values of a tool_calls event, and the paths of the files a context note read for a request."""
    payload = event.payload if isinstance(event.payload, dict) else {}
    if event.kind == "tool_calls":
        return [str(v) for call in payload.get("calls", []) if isinstance(call, dict)
                for v in (call.get("arguments") or {}).values()]
    if event.kind == "context":
        return [str(f.get("path", "")) for f in payload.get("files", []) if isinstance(f, dict)]
    return []


_ACKNOWLEDGED = re.compile(r"^\W*\w+[:,]\s+")  # "Noted: ...", "OK, ...": an opening word set off
ECHO = 0.75  # the share of an assistant sentence's words that repeats the machinery and the user: relayed
ROOT = 5  # letters of a word compared: "created" and "create", "reads" and "reading" are one word here


def _roots(text: str) -> set[str]:
    """The content words of `text` cut to their first five letters (a cruder stem than `checks.stem`, for telling
    whether a sentence adds a word: "I created hello.txt." adds nothing to "Create hello.txt")."""
    return {w[:ROOT] for w in content_words(text)}


def _opens_with_subject(sentence: str) -> bool:
    first = words(sentence)[:1]
    return bool(first) and first[0] in _SUBJECT_OPENERS


def excluded(events: Sequence[Event]) -> dict[int, set[str]]:
    """For each index of a `user` or `assistant` event of `events`, the sentences of its text (`checks.sentences`,
    verbatim) that are relayed, unanswering or requests (see the module docstring)."""
    agent = agent_session(events)
    seen: set[str] = set()  # content words of the machinery so far
    out: dict[int, set[str]] = {}
    user_words: set[str] = set()
    for index, event in enumerate(events):
        if event.kind == "user":
            user_words = _roots(_body(event))
            if agent:
                acted = _acted_on(events, index)
                asked = {s for s in sentences(_body(event)) if not s.endswith("?") and not _opens_with_subject(s)
                         and any(re.search(rf"(?<![\w./-]){re.escape(a)}(?![\w/-])", s.casefold()) for a in acted)}
                if asked:
                    out[index] = asked
        elif event.kind == "assistant":
            gone = set()
            for s in sentences(_body(event)):
                spoken = {w[:ROOT] for w in content_words(_ACKNOWLEDGED.sub("", s)) - vocatives(s)}
                if spoken and len(spoken & (seen | user_words)) >= ECHO * len(spoken):
                    gone.add(s)
                elif agent and spoken and not spoken & user_words:
                    gone.add(s)
            if gone:
                out[index] = gone
        if event.kind not in SAID and event.kind != "summary":
            seen |= _roots(_body(event))
            if event.kind == "tool_result" and isinstance(event.payload, dict):
                seen |= _roots(str(event.payload.get("output", "")))
    return out


def _acted_on(events: Sequence[Event], index: int) -> set[str]:
    """What the turn of the user event `index` acted on, casefolded: its tool calls' arguments (up to the next user
    event) and the paths of the files a context note right before it read for it; those with a letter or digit."""
    acted: list[str] = []
    before = index - 1
    while before >= 0 and events[before].kind == "context":
        acted += _arguments(events[before])
        before -= 1
    for event in events[index + 1:]:
        if event.kind == "user":
            break
        acted += _arguments(event)
    return {a.strip().casefold() for a in acted if any(ch.isalnum() for ch in a)}
