"""The types plugins exchange with the worker: model bindings, summarizers, distillers and their requests.

A third-party plugin imports these and `hookimpl` from `emelex_workers.hookspecs`;
see docs/plugins.md for a complete example.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

from emelex_memory import DistillationInput, Event, InstalledModel, Job, KnowledgeCandidate

from ..settings import WorkerSettings

__all__ = [
    "DEFAULT_SEED", "RETRY_TEMPERATURE", "SAID_KINDS", "AgentBinding", "Completion", "DistillRequest", "Distiller",
    "Embedder", "GenerationInterrupted", "GenerationProgress", "ModelBinding", "ModelCheck", "ProposedCall",
    "Summarizer", "SummaryRequest", "ToolCalling",
    "event_body", "event_text",
]


# A binding's `complete(..., attempt=N)`: greedy on attempt 0, sampled at this temperature with seed DEFAULT_SEED + N
# on retries (docs/plugins.md).
DEFAULT_SEED = 42
RETRY_TEMPERATURE = 0.7


@dataclass(frozen=True)
class Completion:
    """A model's answer: its text and why it stopped: "stop", "length" (the token limit) or "unknown"."""

    text: str
    finish_reason: str


@dataclass(frozen=True)
class ProposedCall:
    """One call a model round proposed: the tool's name and its arguments (not yet checked by the gate)."""

    tool: str
    arguments: dict


@dataclass(frozen=True)
class ToolCalling:
    """Whether a binding calls tools natively (`native`: it sends them in the OpenAI `tools` field and reads the
    `tool_calls` a reply streams; `AgentBinding.stream_tool_round`), and what it found out, in words (`detail`:
    "the server streamed a tool call for the probe", "the server refused tools (HTTP 500: tools param requires
    --jinja flag)")."""

    native: bool
    detail: str


@dataclass(frozen=True)
class ModelCheck:
    """What a plugin found when it tried a model on this machine (the `check_model` hook): `name` labels the check
    as `emelex memory doctor` prints it (e.g. "llama.cpp"), `ok` says whether the model runs here, and `detail` is
    one line: what ran, or what to do."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class GenerationProgress:
    """Where one `chat` call stands: the prompt's tokens (as the model counts them, chat template included), the
    tokens sampled so far, and the text generated since the previous report (may be empty).

    While the prompt is still being evaluated (before the first token is sampled), `evaluated_tokens` is how many
    of its `prompt_tokens` have been evaluated so far (`generated_tokens` is 0); None once generation runs, and
    always for a binding that does not report prompt evaluation. `estimated` is True
    when the counts are the binding's estimate rather than the model's exact count (a served model whose server
    does not report them); the job's cost then says so. `waiting_s`, in a report a binding makes while its model
    server is silent, is how long it has waited (since the request was sent, or since the last piece came); the
    worker and the chat show "waiting for the model server: 12 s". None in every other report."""

    prompt_tokens: int
    generated_tokens: int
    text: str = ""
    _: KW_ONLY  # the optional reports are named, so a binding never passes one for the other
    evaluated_tokens: int | None = None
    estimated: bool = False
    waiting_s: float | None = None


class ModelBinding(Protocol):
    """A model ready to run for one worker run. Load weights lazily, on the first call that needs them.

    `model` is the validated `InstalledModel`; `context_window` is the
    allocated context in tokens (prompt plus completion); `count_tokens(text)`
    counts with the model's own tokenizer (the counter compaction budgets
    use); `chat(messages, max_tokens=..., json_schema=...)` returns the
    assistant text for OpenAI-style `{"role", "content"}` messages, constrained
    to `json_schema` when given; `close()` frees the model and is idempotent.

    Progress is optional: a `chat` that accepts an `on_token` keyword calls
    `on_token(GenerationProgress(...))` as it generates (at least once, at the
    end, with the final counts), and may report the prompt's evaluation before
    that (`GenerationProgress.evaluated_tokens`); the worker shows it live and
    records the final counts as the job's cost. A binding without `on_token` works unchanged;
    its cost is then counted from the messages and the reply.
    """

    model: InstalledModel

    @property
    def context_window(self) -> int:
        """Allocated context size in tokens."""

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` under the model's tokenizer."""

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None) -> str:
        """One completion of at most `max_tokens` tokens; the assistant message text. May also accept
        `on_token: Callable[[GenerationProgress], None] | None = None` (see the class docstring)."""

    def close(self) -> None:
        """Free the model; idempotent."""


class GenerationInterrupted(Exception):
    """Raised by a binding once a stop event was set (the `stop` of the `model_binding` hook, or of
    `AgentBinding.stream_chat`): its work stopped where the binding checks it (the built-in llama.cpp binding:
    while loading the model, between the steps of a prompt's evaluation, between tokens) and the binding is ready
    for the next call. Its message says where it stopped ("while evaluating the prompt (512 of 1204 tokens)"), or
    is empty. Not an error to show: the caller decides what an interruption means (the worker releases the job
    without consuming an attempt; the agent closes the turn with a failure record)."""


class AgentBinding(ModelBinding, Protocol):
    """A `ModelBinding` that an agent can drive: grammar-constrained, interruptible streaming generation.

    `template_digest` is the SHA-256 (hex) of the chat template the binding
    renders messages with (a Session snapshot records it, so a resume on a
    model that renders differently is refused). `stream_chat` runs one
    completion constrained to `json_schema` (a grammar built from it for
    this call; a schema the binding cannot enforce raises ValueError, never
    falling back to free text), sampling with `temperature` and `seed`,
    passing each piece of text to `on_text` as it is generated. It checks
    `stop` between tokens (and, where it can, while it evaluates the prompt)
    and raises `GenerationInterrupted` once it is set. Calls must not
    overlap: the caller runs them on one thread at a time.

    Progress is optional, as for `chat`: a `stream_chat` that accepts an
    `on_progress` keyword calls `on_progress(GenerationProgress(...))` as it
    generates (at least once, at the end, with the final counts, and may
    report the prompt's evaluation first); `emelex chat` shows it while a
    round is generated and sums the counts of a turn's rounds.

    A binding may also offer `model_identity`: a JSON object describing the
    model as a server reports it (a served model); the Session snapshot
    records it, so a resume against a server reporting another model is
    refused naming the field that differs.

    Native tool calling is optional too: a binding whose `tool_calling()`
    says `native` has `stream_tool_round(messages, *, tools, tool_choice,
    calls_per_batch, max_tokens, stop, on_text=None, temperature=0.0,
    seed=42, on_progress=None)`: it sends `tools` (OpenAI function tools; none
    for an answer-only round) with `tool_choice` ("auto", or "required" for a
    round that must call one) and returns the round in the union form
    (`{"answer": ...}` or `{"tool_calls": [{"name", "arguments"}, ...]}`),
    streaming that text to `on_text` as it learns it. `remote_constraint`
    (optional, default False) says a server, not this process, applies a
    round's grammar: the agent then checks every call against the round.
    """

    @property
    def template_digest(self) -> str:
        """SHA-256 hex of the chat template."""

    def stream_chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict,
                    stop: threading.Event, on_text: Callable[[str], None] | None = None,
                    temperature: float = 0.0, seed: int = 42) -> str:
        """The assistant text of one constrained completion; `GenerationInterrupted` when `stop` was set."""


@dataclass(frozen=True)
class SummaryRequest:
    """What a summarizer gets: the compaction job, its source events in replay order (a previous Summary
    first, when there is one), the most tokens the Summary may have, and the bound model.

    `attempt` is the job's count of failed attempts so far (0 on the first
    try): a retry must not repeat a rejected output, so vary the sampling
    (seed, temperature) or the input with it. `settings` are the worker's
    (None: the defaults).
    """

    job: Job
    events: tuple[Event, ...]
    budget_tokens: int
    model: ModelBinding
    attempt: int = 0
    settings: WorkerSettings | None = None


@dataclass(frozen=True)
class DistillRequest:
    """What a distiller gets: the distill job, the distillation input (Session, workspace, provenance, source
    events, live Knowledge), the most candidates one job may apply, and the bound model; `attempt` and
    `settings` as for `SummaryRequest`."""

    job: Job
    data: DistillationInput
    max_candidates: int
    model: ModelBinding
    attempt: int = 0
    settings: WorkerSettings | None = None


@dataclass(frozen=True)
class Summarizer:
    """A named summarizer: `summarize(request)` returns the Summary text, at most `request.budget_tokens` tokens.

    Raise `TransientJobError` for a passing failure, `PermanentJobError` (or
    `SourceTooLargeError`) for one retrying cannot fix; any other exception
    is a retryable job failure with a bounded diagnostic naming the plugin.
    `examples` are the texts of the worked examples its prompts show the
    model: the worker cuts Summary sentences that echo them (see
    `emelex_workers.faithfulness`). A summarizer that makes no model call
    (through `request.model.chat`) on an attempt is taken to be rule-based:
    a degenerate Summary from it fails the job permanently, unretried.
    """

    name: str
    summarize: Callable[[SummaryRequest], str]
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class Distiller:
    """A named distiller: `distill(request)` returns `KnowledgeCandidate`s (at most `request.max_candidates`
    unique ones); the worker's guards drop (and count) unfaithful ones, then the rest are validated before
    anything is applied. Exceptions count as for `Summarizer`; `examples` are the worked examples its
    prompts show, whose copies the guards reject."""

    name: str
    distill: Callable[[DistillRequest], Iterable[KnowledgeCandidate]]
    examples: tuple[str, ...] = ()


@dataclass(frozen=True)
class Embedder:
    """An embedder: `embed(texts)` returns one vector (a sequence of floats, all of one length) per text, in order;
    `model` names the model, and vectors of different models are kept apart. Exceptions count as a failed
    embedding pass (nothing stored); `close()`, if given, frees the model."""

    model: str
    embed: Callable[[list[str]], Sequence[Sequence[float]]]
    close: Callable[[], None] | None = None


def event_text(event: Event) -> str:
    """The text a model sees for one transcript event: its payload's "text" when that is a string, else the
    payload's stored canonical JSON; prefixed with the event kind, e.g. "user: hello"."""
    return f"{event.kind}: {event_body(event)}"


SAID_KINDS = frozenset({"user", "assistant"})  # the events that are what was said; any other kind is machinery


def event_body(event: Event) -> str:
    """`event_text` without the kind prefix: the payload's "text" when that is a string, else its canonical JSON."""
    payload = event.payload
    return payload["text"] if isinstance(payload, dict) and isinstance(payload.get("text"), str) else event.payload_json
