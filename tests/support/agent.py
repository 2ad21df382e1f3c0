"""Agent test doubles: a scripted `AgentBinding` (a queue of union outputs) and a test tool plugin.

This file is both a helper module for in-process tests and, installed as
the distribution `emelex-agenttest` (module `emelex_agenttest`, entry point
"agenttest", see `agent_plugin_distribution`), a real plugin for
subprocesses. It imports nothing from `tests`.

Behaviour comes from arguments in process, or from the EMELEX_AGENT_TEST
environment variable (JSON) in a subprocess:
- "outputs": the scripted binding's queue: each item is a raw string or a
  JSON object (rendered as compact JSON), one per model round. Build them
  with `answer(text)` and `calls((tool, arguments), ...)`.
- "generating": a file the binding writes (its pid) when a round starts;
  "hold_generation": a file the binding waits for before it emits the round
  (it honours the stop event while waiting and between every piece).
- "effects": the file the `effect` tool appends one line to per run:
  "<call_id> <label>\n" (flushed and fsynced before the tool goes on).
- "tool_started": a file the `effect` tool writes after its effect;
  "hold_tool": a file it then waits for (up to 120 s) before it returns;
  "hold_label": hold only the call with this label; "tool_done": a file it
  writes (the time, `time.time()`) right before it returns.
- "approval": the `effect` tool's approval policy (default "always").
- "linger_s": seconds the binding waits after a round's last report before it returns (as a model whose last
  token comes a while before the end of its reply).
- "progress_after_text": the binding reports no progress before or while it streams a round's text, only its
  final counts after the last piece (as a binding whose reports lag its tokens).
- "bound": a file the plugin writes (its pid) when it binds a model, so a
  test can observe whether a model was loaded at all.

Tools: `effect` (label: string; appends to the effects log), `peek`
(approval "never"; returns "peeked <label>", no effect) and `boom`
(approval "never"; raises).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from emelex_workers.agent.tools import ToolInvocation, ToolOutput, ToolSpec
from emelex_workers.hookspecs import hookimpl
from emelex_workers.plugin_api import GenerationInterrupted, GenerationProgress

ENV = "EMELEX_AGENT_TEST"
SCRIPTED_MARKER = b"emelex-agent-scripted-model"
SCRIPTED_MODEL_BYTES = b"GGUF\x03\x00\x00\x00" + SCRIPTED_MARKER + bytes(range(256)) * 4
DIST, VERSION, MODULE, ENTRY = "emelex-agenttest", "0.1.0", "emelex_agenttest", "agenttest"
PIECE = 4  # characters per streamed piece ("token")
POLL_S = 0.01
LABEL_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "maxLength": 64}},
    "required": ["label"],
    "additionalProperties": False,
}


def options() -> dict[str, Any]:
    """The EMELEX_AGENT_TEST options of this process ({} when unset)."""
    return json.loads(os.environ.get(ENV, "{}"))


def answer(text: str) -> dict:
    """A union output that answers `text`."""
    return {"answer": text}


def calls(*proposed: tuple[str, dict]) -> dict:
    """A union output that proposes the calls `(tool, arguments)`, in order."""
    return {"tool_calls": [{"name": name, "arguments": arguments} for name, arguments in proposed]}


def _wait_for(path: str, stop: threading.Event | None, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            raise GenerationInterrupted()
        time.sleep(POLL_S)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class ScriptedBinding:
    """An `AgentBinding` that needs no weights: each `stream_chat` emits the next scripted output.

    `outputs` (default: the "outputs" option) is the queue; a round with the
    queue empty raises RuntimeError. `rounds` records each round's messages
    and schema for assertions. 4 characters count as one token.
    """

    def __init__(self, outputs: Iterable[str | dict] | None = None, *, model: Any = None, window: int = 4096,
                 template: str = "scripted chat template") -> None:
        """A binding over `outputs` for `model` (an `InstalledModel`, or None in process)."""
        self.model = model
        self.outputs: deque[str | dict] = deque(options().get("outputs", []) if outputs is None else outputs)
        self.rounds: list[dict[str, Any]] = []
        self.closed = False
        self._window = window
        self._template = template

    @property
    def context_window(self) -> int:
        """The fixed window given at construction."""
        return self._window

    @property
    def template_digest(self) -> str:
        """SHA-256 of the template text given at construction."""
        return hashlib.sha256(self._template.encode()).hexdigest()

    def count_tokens(self, text: str) -> int:
        """One token per 4 characters, rounded up."""
        return (len(text) + PIECE - 1) // PIECE

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None) -> str:
        """For the worker's summarizers and distillers: "{}" under a schema, else "ok"."""
        return "{}" if json_schema else "ok"

    def stream_chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict,
                    stop: threading.Event, on_text: Callable[[str], None] | None = None,
                    temperature: float = 0.0, seed: int = 42,
                    on_progress: Callable[[GenerationProgress], None] | None = None) -> str:
        """The next scripted output, streamed in 4-character pieces; `GenerationInterrupted` once `stop` is set
        (checked before each piece and while holding). `on_progress` gets the prompt's evaluation (0 of the
        messages' tokens) before the hold, each piece with its count, then the final counts."""
        self.rounds.append({"messages": [dict(m) for m in messages], "schema": json_schema,
                            "max_tokens": max_tokens})
        opts = options()
        prompt = sum(self.count_tokens(m["content"]) for m in messages)
        late = opts.get("progress_after_text")
        final = on_progress or (lambda _: None)
        report = (lambda _: None) if late else final
        report(GenerationProgress(prompt, 0, "", evaluated_tokens=0))
        if opts.get("generating"):
            _write(opts["generating"], str(os.getpid()))
        if opts.get("hold_generation"):
            _wait_for(opts["hold_generation"], stop)
        if not self.outputs:
            raise RuntimeError("the scripted binding has no more outputs")
        item = self.outputs.popleft()
        raw = item if isinstance(item, str) else json.dumps(item, separators=(",", ":"))
        for start in range(0, len(raw), PIECE):
            if stop.is_set():
                raise GenerationInterrupted()
            if on_text is not None:
                on_text(raw[start:start + PIECE])
            report(GenerationProgress(prompt, start // PIECE + 1, raw[start:start + PIECE]))
        final(GenerationProgress(prompt, self.count_tokens(raw), ""))
        time.sleep(opts.get("linger_s", 0))
        return raw

    def close(self) -> None:
        """Mark closed; idempotent."""
        self.closed = True


def run_effect(invocation: ToolInvocation) -> ToolOutput:
    """Append "<call_id> <label>" to the effects log (fsynced), then optionally signal and hold."""
    opts = options()
    label = invocation.arguments["label"]
    with open(opts["effects"], "a") as f:
        f.write(f"{invocation.call_id} {label}\n")
        f.flush()
        os.fsync(f.fileno())
    if opts.get("hold_label") in (None, label):
        if opts.get("tool_started"):
            _write(opts["tool_started"], str(os.getpid()))
        if opts.get("hold_tool"):
            _wait_for(opts["hold_tool"], None)
    if opts.get("tool_done"):
        _write(opts["tool_done"], repr(time.time()))
    return ToolOutput(f"did {label}")


def run_peek(invocation: ToolInvocation) -> ToolOutput:
    """No effect: "peeked <label>"."""
    return ToolOutput(f"peeked {invocation.arguments['label']}")


def run_boom(invocation: ToolInvocation) -> ToolOutput:
    """Always fails."""
    raise RuntimeError(f"boom {invocation.arguments['label']}")


def tool_specs() -> list[ToolSpec]:
    """The plugin's tools: effect, peek, boom."""
    return [
        ToolSpec("effect", "Record an effect with a label.", LABEL_SCHEMA, run_effect,
                 approval=options().get("approval", "always")),
        ToolSpec("peek", "Look at a label without changing anything.", LABEL_SCHEMA, run_peek, approval="never"),
        ToolSpec("boom", "A tool that always fails.", LABEL_SCHEMA, run_boom, approval="never"),
    ]


@hookimpl
def register_tools(register) -> None:
    """Register effect, peek and boom."""
    for spec in tool_specs():
        register(spec)


@hookimpl(tryfirst=True)
def model_binding(model, settings) -> ScriptedBinding | None:
    """Bind model files that contain the scripted marker (a window of 4096 tokens, capped like a real binding by
    `model_max_context_tokens`); pass on anything else."""
    with open(model.model_file, "rb") as f:
        if SCRIPTED_MARKER not in f.read(64):
            return None
    if options().get("bound"):
        _write(options()["bound"], str(os.getpid()))
    return ScriptedBinding(model=model, window=min(4096, settings.model_max_context_tokens))


def scripted_model_file(directory: Path, name: str = "scripted.gguf") -> Path:
    """A small file this plugin binds (and that looks like a GGUF to the installer)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(SCRIPTED_MODEL_BYTES)
    return path


def agent_plugin_distribution(root: Path) -> Path:
    """Install this file as the `emelex-agenttest` distribution under `root` (put it on PYTHONPATH / sys.path,
    e.g. with `tests.support.plugins.activate`); return `root`."""
    from tests.support.plugins import make_distribution

    return make_distribution(root, DIST, VERSION, {MODULE: Path(__file__).read_text()}, {ENTRY: MODULE})


def add_to(pm: Any) -> None:
    """Register this module on a plugin manager in process, as the plugin "agenttest" of `emelex-agenttest`."""
    from emelex_workers.host.manager import PluginInfo

    module = sys.modules[__name__]
    pm.add_plugin(module, PluginInfo(ENTRY, DIST, VERSION, __name__, False))
