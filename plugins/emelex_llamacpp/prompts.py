"""Abstractive prompts of the built-in plugin (`summary_mode` / `distill_mode` = "abstractive"), and shared helpers.

The model writes the Summary and the facts in its own words, shown one
worked example each (declared as the plugin's `EXAMPLES`, so the worker's
guards reject copies of it). Prompt plus completion stay inside the model's
context window (a source that cannot fit is `SourceTooLargeError`, a
permanent failure). A Summary is generated with a repetition penalty; one
cut by the token limit is trimmed to its last complete sentence. Facts come
from what was said (user and assistant events: no tool calls, tool results,
failure records or audit events) through JSON-schema constrained output whose
size is bounded, so the output
always fits its token allowance; the model proposes no confidence: it is
measured as 0.5 + 0.4 x the fact's corroboration by the source
(`faithfulness.corroboration`), rounded to two decimals.
"""

from __future__ import annotations

import json
import math

from emelex_memory import KnowledgeCandidate, SourceTooLargeError
from emelex_workers.faithfulness import corroboration, sentences, terminated
from emelex_workers.plugin_api import (
    SAID_KINDS,
    DistillRequest,
    ModelBinding,
    SummaryRequest,
    event_body,
    event_text,
)

from .binding import generate
from .candidates import speaker_names
from .keys import knowledge_key

MAX_SUMMARY_TOKENS = 384  # a Summary never needs more; generating less keeps small CPUs quick
MAX_FACTS = 5
MAX_KEY_CHARS = 32
MAX_FACT_CHARS = 160
# Worst case one token per character of the bounded JSON: keys, contents and punctuation of MAX_FACTS facts.
DISTILL_MAX_TOKENS = 16 + MAX_FACTS * (MAX_KEY_CHARS + MAX_FACT_CHARS + 24)
MESSAGE_OVERHEAD = 16  # chat-template tokens per message, a generous allowance
SUMMARY_REPEAT_PENALTY = 1.15

# One worked example each: a 135M-parameter model follows an example far better than an instruction.
EXAMPLE_CONVERSATION = (
    "user: Where do the logs go?\nassistant: Logs are written to /var/log/app.log.\n"
    "user: What port does the server use?\nassistant: The server listens on port 8080."
)
EXAMPLE_SUMMARY = (
    "The user asked where logs go and which port the server uses. The assistant said logs are written to "
    "/var/log/app.log and the server listens on port 8080."
)
EXAMPLE_FACTS = (
    '{"facts": [{"key": "log file", "content": "Logs are written to /var/log/app.log."}, '
    '{"key": "server port", "content": "The server listens on port 8080."}]}'
)
EXAMPLES = (EXAMPLE_CONVERSATION, EXAMPLE_SUMMARY, "Logs are written to /var/log/app.log.",
            "The server listens on port 8080.")
SUMMARY_SYSTEM = "You summarize conversations between a user and an assistant in a few plain sentences."
DISTILL_SYSTEM = "You list the durable facts stated in a conversation as JSON, skipping facts already known."


def fit(model: ModelBinding, messages: list[dict[str, str]], completion: int, what: str) -> int:
    """Tokens left for the completion (at most `completion`); `SourceTooLargeError` when the prompt leaves none."""
    prompt = sum(model.count_tokens(m["content"]) + MESSAGE_OVERHEAD for m in messages)
    room = model.context_window - prompt
    if room < min(completion, 32):
        raise SourceTooLargeError(
            f"the {what} prompt needs {prompt} tokens of the model's {model.context_window}-token context; use a "
            "model with a larger context, then retry the job"
        )
    return min(completion, room)


def _transcript(events) -> str:
    lines = []
    for e in events:
        text = event_text(e)
        lines.append(f"(earlier) {text}" if e.kind == "summary" else text)
    return "\n".join(lines)


def complete_sentences(text: str) -> str:
    """`text` without its last sentence when that one has no terminal punctuation (output cut by a token limit);
    unchanged when it has no complete sentence at all."""
    parts = sentences(text)
    if len(parts) > 1 and not terminated(parts[-1]):
        cut = text.rstrip().rfind(parts[-1])
        return text[:cut].rstrip()
    return text.strip()


def summarize(request: SummaryRequest) -> str:
    """Summarize the job's source in at most `request.budget_tokens` tokens of the model's tokenizer."""
    model = request.model
    budget = max(1, min(request.budget_tokens, MAX_SUMMARY_TOKENS))
    words = max(10, math.floor(budget * 0.6))
    messages = [
        {"role": "system", "content": f"{SUMMARY_SYSTEM} Use at most {words} words."},
        {"role": "user", "content": f"Conversation:\n{EXAMPLE_CONVERSATION}\n\nSummary:"},
        {"role": "assistant", "content": EXAMPLE_SUMMARY},
        {"role": "user", "content": f"Conversation:\n{_transcript(request.events)}\n\nSummary:"},
    ]
    out = generate(model, messages, max_tokens=fit(model, messages, budget, "summary"), attempt=request.attempt,
                   repeat_penalty=SUMMARY_REPEAT_PENALTY)
    text = complete_sentences(out.text) if out.finish_reason in ("length", "unknown") else out.text.strip()
    if not text:
        raise ValueError("the model returned an empty summary")
    while model.count_tokens(text) > request.budget_tokens:  # re-tokenizing may differ slightly from generation
        text = complete_sentences(text[: max(1, math.floor(len(text) * 0.9))])
    return text


def fact_schema(max_items: int) -> dict:
    """The JSON schema the abstractive distiller constrains the model's output to."""
    return {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "maxItems": max_items,
                "items": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS},
                        "content": {"type": "string", "minLength": 1, "maxLength": MAX_FACT_CHARS},
                    },
                    "required": ["key", "content"],
                },
            }
        },
        "required": ["facts"],
    }


def distill(request: DistillRequest) -> list[KnowledgeCandidate]:
    """Ask the model for facts under a JSON schema; key each by its own subject words as the extractive mode does
    (`keys.knowledge_key`: the model's topic is not used), keep the first per key, with a measured confidence."""
    model, data = request.model, request.data
    # What was said: a Summary is the pipeline's output, tool calls, results, failures and audit events machinery.
    said = [e for e in data.events if e.kind in SAID_KINDS]
    known = "\n".join(f"- {e.key}: {e.content}" for e in data.knowledge[:50]) or "(none)"
    limit = max(1, min(MAX_FACTS, request.max_candidates))
    messages = [
        {"role": "system", "content": f"{DISTILL_SYSTEM} Already known:\n{known}"},
        {"role": "user", "content": f"Conversation:\n{EXAMPLE_CONVERSATION}\n\nFacts as JSON:"},
        {"role": "assistant", "content": EXAMPLE_FACTS},
        {"role": "user", "content": f"Conversation:\n{_transcript(said)}\n\nFacts as JSON:"},
    ]
    raw = generate(model, messages, max_tokens=fit(model, messages, DISTILL_MAX_TOKENS, "distillation"),
                   json_schema=fact_schema(limit), attempt=request.attempt).text
    try:
        facts = json.loads(raw)["facts"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"the model's distillation output is not the JSON asked for: {raw[:200]!r}") from None
    sources = [event_body(e) for e in said]
    names = speaker_names(data.events)
    taken = {e.key: e.content for e in data.knowledge if e.content is not None}
    candidates: dict[str, KnowledgeCandidate] = {}
    for fact in facts if isinstance(facts, list) else []:
        if not isinstance(fact, dict):
            continue
        content = fact.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        key = knowledge_key(content.strip(), taken, names)
        taken.setdefault(key, content.strip())
        confidence = round(0.5 + 0.4 * corroboration(content, sources), 2)
        candidates.setdefault(key, KnowledgeCandidate(key, content.strip(), confidence))
    return list(candidates.values())[:limit]
