"""A test plugin, installed per test as the distribution `emelex-fakeplugin` (see tests/support/plugins.py).

It binds fake models (files containing FAKE_MARKER) before the built-in
llama.cpp plugin, and provides the summarizer "fake" and the distiller "fake".
Its behaviour comes from the EMELEX_FAKE_PLUGIN environment variable (JSON):
"mode" is "ok", "fail" (summarizer and distiller raise), "slow" (they write
the "started" file, then wait until killed), "overlong" (a Summary over
budget) or "go-live" (the summarizer takes the Session's lease, as a chat
resuming mid-job would); "record" names a file each run appends its job ID to;
"window" sets the binding's context window (default 4096).
With "chat": N the summarizer and distiller first call the binding's `chat`,
which generates N tokens, reporting each through `on_token` (waiting "delay"
seconds before each, if given) unless "legacy" makes it a binding without
`on_token`; "fail_after_chat" then fails the job. With "prompt_steps": K it
first reports the prompt's evaluation in K steps, "prompt_delay" seconds each.
"""

from __future__ import annotations

import json
import os
import time

from emelex_memory import KnowledgeCandidate
from emelex_workers.faithfulness import sentences
from emelex_workers.hookspecs import hookimpl
from emelex_workers.plugin_api import Distiller, Summarizer, event_body, event_text
from emelex_workers.plugin_api import WorkerSettings

FAKE_MARKER = b"emelex-fake-model"
HELD = []  # leases taken in "go-live" mode, kept alive so they stay live


def _options() -> dict:
    return json.loads(os.environ.get("EMELEX_FAKE_PLUGIN", "{}"))


class FakeBinding:
    """A ModelBinding that needs no weights: 4 characters per token, a set window, canned answers."""

    def __init__(self, model) -> None:
        self.model = model
        self.closed = False

    @property
    def context_window(self) -> int:
        return _options().get("window", 4096)

    def count_tokens(self, text: str) -> int:
        return (len(text) + 3) // 4

    def chat(self, messages, *, max_tokens, json_schema=None, on_token=None) -> str:
        from emelex_workers.plugin_api import GenerationProgress

        prompt = sum(self.count_tokens(m["content"]) for m in messages) + 3 * len(messages)  # a template's tokens
        steps = _options().get("prompt_steps", 0) if on_token is not None else 0
        for k in range(steps + 1 if steps else 0):
            if k:
                time.sleep(_options().get("prompt_delay", 0))
            on_token(GenerationProgress(prompt, 0, "", evaluated_tokens=prompt * k // steps))
        words = []
        for n in range(1, min(max_tokens, _options().get("chat", 0)) + 1):
            time.sleep(_options().get("delay", 0))
            words.append("tok")
            if on_token is not None:
                on_token(GenerationProgress(prompt, n, "tok "))
        if on_token is not None:
            on_token(GenerationProgress(prompt, len(words), ""))
        return "{}" if json_schema else " ".join(words) or "ok"

    def close(self) -> None:
        self.closed = True


class LegacyBinding(FakeBinding):
    """A binding written before `on_token` existed."""

    def chat(self, messages, *, max_tokens, json_schema=None) -> str:
        return super().chat(messages, max_tokens=max_tokens, json_schema=json_schema)


def _behave(job_id: str, model=None) -> None:
    options = _options()
    if options.get("record"):
        with open(options["record"], "a") as f:
            f.write(job_id + "\n")
    mode = options.get("mode", "ok")
    if model is not None and options.get("chat"):
        model.chat([{"role": "user", "content": "summarize this, please"}], max_tokens=64)
        if options.get("fail_after_chat"):
            raise RuntimeError("fake plugin failure after the model ran")
    if mode == "fail":
        raise RuntimeError("fake plugin failure " + "x" * 5000)
    if mode == "slow":
        with open(options["started"], "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)


def summarize(request) -> str:
    _behave(request.job.id, request.model)
    mode = _options().get("mode")
    if mode == "overlong":
        return "word " * (request.budget_tokens * 4)
    if mode == "go-live":
        from emelex_memory import MemoryStore

        with MemoryStore.open(WorkerSettings()) as store:
            session = store.get_session(request.job.session_id)
            HELD.append(store.acquire_lease(session.id, session.workspace.path, ttl_s=600))
    first = sentences(event_text(request.events[0]))[0]  # a whole sentence: the guard checks every claim
    return f"Summary of the events, starting with {first}"


def distill(request):
    _behave(request.job.id, request.model)
    return [
        KnowledgeCandidate(f"fact-{e.seq}", event_body(e)[:200], 0.75)
        for e in request.data.events if e.kind == "assistant"
    ]


@hookimpl(tryfirst=True)
def model_binding(model):
    with open(model.model_file, "rb") as f:
        if FAKE_MARKER not in f.read(64):
            return None
    return LegacyBinding(model) if _options().get("legacy") else FakeBinding(model)


@hookimpl
def register_summarizers(register) -> None:
    register(Summarizer("fake", summarize))


@hookimpl
def register_distillers(register) -> None:
    register(Distiller("fake", distill))
