"""Prompts of the built-in plugin: summarizing a compaction source and distilling Knowledge candidates.

Both keep the prompt plus the completion inside the model's context window
(a source that cannot fit is `SourceTooLargeError`, a permanent failure).
The Summary is cut to the job's token budget; distilled candidates come from
JSON-schema constrained output and are validated one by one.
"""

from __future__ import annotations

import json
import math
import re

from emelex_memory import KnowledgeCandidate, SourceTooLargeError
from emelex_workers.plugin_api import DistillRequest, ModelBinding, SummaryRequest, event_text

MAX_SUMMARY_TOKENS = 384  # a Summary never needs more; generating less keeps small CPUs quick
MAX_FACTS = 5
MAX_KEY_CHARS = 32
MAX_FACT_CHARS = 160
DISTILL_MAX_TOKENS = 500  # room for MAX_FACTS facts at their longest, so output is never cut off
MESSAGE_OVERHEAD = 16  # chat-template tokens per message, a generous allowance

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
    '{"facts": [{"key": "log file", "content": "Logs are written to /var/log/app.log.", "confidence": 0.9}, '
    '{"key": "server port", "content": "The server listens on port 8080.", "confidence": 0.9}]}'
)
SUMMARY_SYSTEM = "You summarize conversations between a user and an assistant in a few plain sentences."
DISTILL_SYSTEM = "You list the durable facts stated in a conversation as JSON, skipping facts already known."


def _fit(model: ModelBinding, messages: list[dict[str, str]], completion: int, what: str) -> int:
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
    text = model.chat(messages, max_tokens=_fit(model, messages, budget, "summary")).strip()
    if not text:
        raise ValueError("the model returned an empty summary")
    while model.count_tokens(text) > request.budget_tokens:  # re-tokenizing may differ slightly from generation
        text = text[: max(1, math.floor(len(text) * 0.9))].rstrip()
    return text


def fact_schema(max_items: int) -> dict:
    """The JSON schema the distiller constrains the model's output to."""
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
                        "confidence": {"type": "number"},
                    },
                    "required": ["key", "content", "confidence"],
                },
            }
        },
        "required": ["facts"],
    }


def slug(key: str) -> str:
    """A stable Knowledge key from a model's topic: lowercase words joined by '-', at most 64 characters."""
    return "-".join(re.findall(r"[a-z0-9]+", key.lower()))[:64].strip("-")


def distill(request: DistillRequest) -> list[KnowledgeCandidate]:
    """Ask the model for facts under a JSON schema, then keep the valid ones (first per key, confidence in [0, 1])."""
    model, data = request.model, request.data
    known = "\n".join(f"- {e.key}: {e.content}" for e in data.knowledge[:50]) or "(none)"
    limit = max(1, min(MAX_FACTS, request.max_candidates))
    messages = [
        {"role": "system", "content": f"{DISTILL_SYSTEM} Already known:\n{known}"},
        {"role": "user", "content": f"Conversation:\n{EXAMPLE_CONVERSATION}\n\nFacts as JSON:"},
        {"role": "assistant", "content": EXAMPLE_FACTS},
        {"role": "user", "content": f"Conversation:\n{_transcript(data.events)}\n\nFacts as JSON:"},
    ]
    raw = model.chat(messages, max_tokens=_fit(model, messages, DISTILL_MAX_TOKENS, "distillation"),
                     json_schema=fact_schema(limit))
    try:
        facts = json.loads(raw)["facts"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"the model's distillation output is not the JSON asked for: {raw[:200]!r}") from None
    candidates: dict[str, KnowledgeCandidate] = {}
    for fact in facts if isinstance(facts, list) else []:
        if not isinstance(fact, dict):
            continue
        key, content, confidence = slug(str(fact.get("key", ""))), fact.get("content"), fact.get("confidence")
        if not key or not isinstance(content, str) or not content.strip():
            continue
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence <= 1:
            continue
        candidates.setdefault(key, KnowledgeCandidate(key, content.strip(), float(confidence)))
    return list(candidates.values())[:limit]
