"""The plugin test kit: build Events, Jobs and requests in one line, and run a plugin's summarizer, distiller or
tool the way `emelex memory work` and the agent run it, with the same checks and faithfulness guards
(docs/plugins.md, "The test kit").

    from emelex_workers import plugin_testing as kit
    from emelex_notes import plugin

    def test_summary():
        summary = kit.run_summarizer(kit.summarizer(plugin, "notes"), [("user", "Use SQLite."), ("assistant", "OK.")])
        assert summary.text == "The user asked: Use SQLite."

A transcript is a sequence of `(kind, text)` pairs (or ready `Event`s); the kit numbers them from seq 1, one turn
per user event. `TestModel` is a model binding test double: it counts 4 UTF-8 bytes a token (the estimate a
model-free plugin gets from the worker) and answers `chat` with replies you give it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emelex_memory import (
    COMPACTION_KIND,
    DISTILL_KIND,
    DistillationInput,
    Event,
    Job,
    KnowledgeCandidate,
    KnowledgeEntry,
    KnowledgeSource,
    PluginHookError,
)

from ..agent.tools import RegisteredTool, registered_tools, run_tool as _run_tool
from ..host import hookspecs
from ..host.manager import EmelexPluginManager, PluginInfo, distillers, summarizers
from ..host.tools import ToolInvocation, ToolOutput, ToolSpec
from ..host.types import Distiller, DistillRequest, GenerationProgress, Summarizer, SummaryRequest
from ..worker.outputs import (
    EstimatedBinding,
    checked_candidates,
    checked_summary,
    component_name,
    read_proposals,
)

__all__ = ["SESSION_ID", "DistillRun", "SummaryRun", "TestModel", "distill_request", "distiller", "event", "job",
           "run_distiller", "run_summarizer", "run_tool", "summarizer", "summary_request", "tool", "transcript"]

SESSION_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"  # the Session of the kit's jobs and requests
WORKSPACE = "/workspace"
Transcript = Sequence["tuple[str, str | dict] | Event"]


def event(kind: str, text: str | dict, *, seq: int = 1, turn: int | None = None) -> Event:
    """One transcript event: `kind` ("user", "assistant", "summary", "tool_result", ...) with `text` (a str becomes
    the payload `{"text": text}`; a dict is the payload itself)."""
    payload = {"text": text} if isinstance(text, str) else text
    payload_json = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    size = len(payload_json.encode("utf-8"))
    return Event((seq, seq, seq if turn is None else turn, 0, kind, payload_json, size, size, 0.0, None))


def transcript(items: Transcript) -> tuple[Event, ...]:
    """`items` as Events numbered from seq 1, a new turn at each user event (ready Events are kept as they are)."""
    events, turn, end = [], 0, 0
    for seq, item in enumerate(items, start=1):
        if isinstance(item, Event):
            events.append(item)
            continue
        kind, text = item
        turn += kind == "user" or turn == 0
        made = event(kind, text, seq=seq, turn=turn)
        end += made.size
        events.append(Event((*made[:7], end, *made[8:])))
    return tuple(events)


def job(kind: str = COMPACTION_KIND, *, events: Sequence[Event] = (), budget_tokens: int = 256, attempts: int = 0,
        source: dict | None = None) -> Job:
    """A running job of `kind` over `events` (its source records their seq range; a compaction's its Summary
    budget), with `attempts` failed attempts so far."""
    first, last = (events[0].seq, events[-1].seq) if events else (1, 1)
    made = {"first_seq": first, "last_seq": last, "event_count": len(events), "digest": "0" * 64}
    if kind == COMPACTION_KIND:
        made["summary_budget_tokens"] = budget_tokens
    made.update(source or {})
    return Job(id="0190a1b2-0000-7000-8000-000000000001", kind=kind, session_id=SESSION_ID,
               source_key=f"{kind}:{first}-{last}", source=made, state="running", attempts=attempts, due_at=0.0,
               lease_holder="plugin-testing", lease_expires_at=None, diagnostics=(), result=None, created_at=0.0,
               updated_at=0.0, finished_at=None)


class TestModel:
    """A model binding test double: `count_tokens` counts 4 UTF-8 bytes a token, `context_window` is `window`, and
    `chat` answers with the next of `replies` (a list, used in order and then its last one again) or with
    `replies(messages)` (a callable), reporting progress through `on_token` as a streaming binding does. `calls`
    holds the messages of every `chat`."""

    __test__ = False  # not a pytest test class
    model = None

    def __init__(self, replies: Sequence[str] | Callable[[list[dict]], str] = ("",), window: int = 4096) -> None:
        """A model answering with `replies` in a window of `window` tokens."""
        self.replies, self.window = replies, window
        self.calls: list[list[dict[str, str]]] = []

    @property
    def context_window(self) -> int:
        """The window given."""
        return self.window

    def count_tokens(self, text: str) -> int:
        """`text`'s UTF-8 bytes / 4, rounded up (the estimate a model-free plugin gets)."""
        return EstimatedBinding(self.window).count_tokens(text)

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
             on_token: Callable[[GenerationProgress], None] | None = None) -> str:
        """The next reply (see the class docstring)."""
        self.calls.append(list(messages))
        if callable(self.replies):
            reply = self.replies(messages)
        else:
            reply = self.replies[min(len(self.calls), len(self.replies)) - 1]
        if on_token is not None:
            prompt = sum(self.count_tokens(m.get("content", "")) for m in messages)
            on_token(GenerationProgress(prompt, self.count_tokens(reply), reply))
        return reply

    def close(self) -> None:
        """Nothing to free."""


def summary_request(items: Transcript, *, budget_tokens: int = 256, model: Any = None, attempt: int = 0,
                    settings: Any = None) -> SummaryRequest:
    """The `SummaryRequest` the worker would build for a compaction of `items` (a `TestModel()` unless `model`)."""
    events = transcript(items)
    return SummaryRequest(job(COMPACTION_KIND, events=events, budget_tokens=budget_tokens, attempts=attempt), events,
                          budget_tokens, model if model is not None else TestModel(), attempt, settings)


def distill_request(items: Transcript, *, knowledge: Iterable[KnowledgeEntry] = (), max_candidates: int = 128,
                    model: Any = None, attempt: int = 0, settings: Any = None) -> DistillRequest:
    """The `DistillRequest` the worker would build for a distill job over `items`, with the workspace's live
    `knowledge`."""
    events = transcript(items)
    made = job(DISTILL_KIND, events=events, attempts=attempt)
    source = KnowledgeSource(SESSION_ID, made.source["first_seq"], made.source["last_seq"], made.source["digest"])
    data = DistillationInput(SESSION_ID, WORKSPACE, source, events, tuple(knowledge))
    return DistillRequest(made, data, max_candidates, model if model is not None else TestModel(), attempt, settings)


def _manager(plugin: object, name: str, settings: Any = None) -> EmelexPluginManager:
    """A plugin manager holding only `plugin` (a module or object with hook implementations), checked as the
    host checks an installed one; its registration hooks get `settings`."""
    pm = EmelexPluginManager()
    pm.settings = settings
    pm.add_hookspecs(hookspecs)
    pm.add_plugin(plugin, PluginInfo(name, "the plugin under test", "", getattr(plugin, "__name__", ""), False))
    pm.check_pending()
    return pm


def summarizer(plugin: object, name: str, settings: Any = None) -> Summarizer:
    """The summarizer `name` that `plugin`'s `register_summarizers` registers (given `settings`; through the host,
    with its checks); `UnknownPluginComponentError` when it registers none of that name."""
    from ..host.manager import choose

    return choose(summarizers(_manager(plugin, "plugin-under-test", settings)), name, "summarizer").component


def distiller(plugin: object, name: str, settings: Any = None) -> Distiller:
    """The distiller `name` that `plugin`'s `register_distillers` registers, as `summarizer` does."""
    from ..host.manager import choose

    return choose(distillers(_manager(plugin, "plugin-under-test", settings)), name, "distiller").component


def tool(plugin: object, name: str) -> ToolSpec:
    """The tool `name` that `plugin`'s `register_tools` registers, checked as the agent checks it
    (`PluginHookError` for an invalid spec)."""
    found = registered_tools(_manager(plugin, "plugin-under-test"))
    if name not in found:
        raise PluginHookError(f"the plugin registers no tool named {name!r} (it registers: "
                              f"{', '.join(sorted(found)) or 'none'})")
    return found[name].spec


@dataclass(frozen=True)
class SummaryRun:
    """What the worker would make of a summarizer's output: `text`, the Summary it would append (after the
    guards), `raw`, what the summarizer returned, `model_calls`, how many times it called the model, and `cuts`,
    what the guards took out (as the job's result counts it: `cut_unsupported`, ...; only nonzero counts)."""

    text: str
    raw: str
    model_calls: int
    cuts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DistillRun:
    """What the worker would apply of a distiller's proposals: the `candidates` it keeps and `rejected`, the
    counts of those the guards dropped by reason (only reasons with a count)."""

    candidates: tuple[KnowledgeCandidate, ...]
    rejected: dict[str, int] = field(default_factory=dict)


class _Counting:
    """A binding that counts its `chat` calls, as the worker's metering does."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.model, self.calls = inner, getattr(inner, "model", None), 0

    @property
    def context_window(self) -> int:
        return self.inner.context_window

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def chat(self, messages: list[dict[str, str]], **options: Any) -> str:
        self.calls += 1
        return self.inner.chat(messages, **options)

    def close(self) -> None:
        self.inner.close()


def run_summarizer(component: Summarizer, items: Transcript, *, budget_tokens: int = 256, model: Any = None,
                   attempt: int = 0, settings: Any = None) -> SummaryRun:
    """Run `component` on a compaction of `items` as the worker does: the same request, the same checks of its
    output (a non-blank str within the budget) and the same faithfulness guards. Raises what the worker would
    record: `PluginHookError` naming the summarizer, `DegenerateOutputError` / `DeterministicOutputError`, or the
    summarizer's own exception. Without `model`, a summarizer with `needs_model=False` gets the worker's estimate
    and any other a `TestModel()`."""
    named = component_name("summarizer", component.name, "plugin-under-test")
    inner = model if model is not None else (TestModel() if component.needs_model else EstimatedBinding(4096, named))
    binding = _Counting(inner)
    request = summary_request(items, budget_tokens=budget_tokens, model=binding, attempt=attempt, settings=settings)
    raw = component.summarize(request)
    text, cuts = checked_summary(raw, named=named, budget=budget_tokens, count=binding.count_tokens, job=request.job,
                           events=request.events, examples=component.examples, model_called=binding.calls > 0)
    return SummaryRun(text, raw, binding.calls, cuts)


def run_distiller(component: Distiller, items: Transcript, *, knowledge: Iterable[KnowledgeEntry] = (),
                  model: Any = None, attempt: int = 0, settings: Any = None) -> DistillRun:
    """Run `component` on a distill job over `items` as the worker does: the same request, its proposals read
    lazily (at most 513), the same guards and validation. Raises `InvalidCandidateError` for a batch the worker
    would refuse, or the distiller's own exception."""
    named = component_name("distiller", component.name, "plugin-under-test")
    inner = model if model is not None else (TestModel() if component.needs_model else EstimatedBinding(4096, named))
    request = distill_request(items, knowledge=knowledge, model=inner, attempt=attempt, settings=settings)
    result = checked_candidates(read_proposals(component.distill(request)), events=request.data.events,
                                examples=component.examples)
    return DistillRun(tuple(result.candidates), {k: v for k, v in result.rejected.items() if v})


def run_tool(spec: ToolSpec, arguments: dict, *, workspace: Path, call_id: str = "call-1") -> ToolOutput:
    """Run one call of the tool `spec` with `arguments` in `workspace` as the agent does: an exception or a result
    that is not a `ToolOutput` becomes an error output; a store-less agent keeps only a preview of output over
    `max_output_bytes`."""
    invocation = ToolInvocation(call_id, spec.name, arguments, Path(workspace))
    return _run_tool(RegisteredTool(spec, "plugin-under-test", ""), invocation)
