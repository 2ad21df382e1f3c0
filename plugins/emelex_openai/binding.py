"""`ServedBinding`: a `ModelBinding` and `AgentBinding` for a model an OpenAI-compatible server serves.

On first use the binding asks the server what it serves (`connect`): the
model must be listed by `GET /v1/models`; then it recognises the server
(llama.cpp's llama-server by `GET /props`, Ollama by `GET /api/version`,
llama-cpp-python's server by `POST /extras/tokenize`, vLLM by the
`max_model_len` of its model list) and reads what it reports about the
model: that is the model's *identity* (`model_identity`): model ID, server
kind, a content digest (Ollama's), the model file's path and metadata
(llama-server, vLLM), the chat template's SHA-256 when reported, and
`verified`: true only when a content digest was reported.

JSON-schema-constrained output: the server's way of accepting a schema is
found by a probe, once, the first time constrained output is needed — a tiny
completion whose schema allows one string no model would write unasked.
The ways tried, in an order that depends on the server: `response_format`
`{"type": "json_schema", ...}` (OpenAI, vLLM, llama-server, Ollama 0.5+),
`{"type": "json_object", "schema": ...}` (llama-cpp-python, llama-server),
llama-server's top-level `json_schema` and vLLM's `guided_json`. When none
constrains, every constrained call raises `UnconstrainedServerError`:
Emelex never runs the agent or an extractive job unconstrained.

A grammar is sent as GBNF that this binding writes (the request's `grammar`
field, `emelex_workers.plugin_api.schema_to_gbnf`) instead of the schema
when the server is llama-cpp-python's or llama-server and the schema holds
a literal their own converters mis-escape (a `"`, a `\\`, a non-ASCII
character: `needs_escaped_literals`); a server that refuses a round's
grammar or schema is a one-line error naming what it said.

Native tool calling (`tool_calling`, probed once, the first time it is
asked): Ollama says whether a model takes tools (`/api/show`'s
`capabilities`); any other server is sent a tiny streamed request offering
one tool (`PROBE_TOOL`) with `tool_choice` "auto" and asking for it, and
calls tools natively when it streams that call back. llama-server does
with `--jinja` (without it: HTTP 500 "tools param requires --jinja flag"),
vLLM with `--enable-auto-tool-choice --tool-call-parser ...` (without:
HTTP 400 '"auto" tool choice requires ...'), llama-cpp-python's server
does not (its default chat format renders the tools and answers in text;
"chatml-function-calling" breaks off a streamed reply: "Automatic streaming
tool choice is not supported").
`stream_tool_round` then sends the round's tools in the `tools` field and
reads the `tool_calls` deltas (accumulated by index; Ollama sends each call
whole), returning the round in the agent's union form.

Generation is always streamed (`stream_options.include_usage` asked), so
progress is reported and `stop` is checked between chunks and while the
server is silent (whose wait is reported too, `GenerationProgress.waiting_s`).
A reply is read no further than its `max_tokens` pieces (a server ignoring
the limit is cut there: finish "length"); one that is no stream of events (a
whole JSON body, an HTML page) is named as such. A chunk naming a model other
than the one asked for is refused when the server lists that name as another
model, or when it differs from the name earlier replies used; a name it does
not list is taken for an alias. Token counts are
the server's where it has a tokenize endpoint (llama-cpp-python's
`/extras/tokenize`, llama-server's and vLLM's `/tokenize`), else the
estimate of `ESTIMATE_BYTES_PER_TOKEN`; progress whose counts are not the
server's own reported usage says `estimated`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from emelex_memory import (
    InstalledModel,
    ModelServerError,
    ModelServerReplyError,
    ModelServerTimeoutError,
    UnconstrainedServerError,
)
from emelex_workers.plugin_api import WorkerSettings
from emelex_workers.plugin_api import (
    DEFAULT_SEED,
    RETRY_TEMPERATURE,
    Completion,
    GenerationInterrupted,
    GenerationProgress,
    ToolCalling,
    needs_escaped_literals,
    schema_to_gbnf,
)

from .client import Rejected, ServerClient, StreamStopped

CHAT_PATH = "/v1/chat/completions"
ESTIMATE_BYTES_PER_TOKEN = 3  # UTF-8 bytes per token when the server cannot count: over-counts English (~4)
COUNT_CACHE = 4096  # texts whose token count is kept (by their SHA-256)
PROBE_VALUE = "zq7"
PROBE_SCHEMA = {"type": "object", "properties": {"probe": {"type": "string", "enum": [PROBE_VALUE]}},
                "required": ["probe"], "additionalProperties": False}
PROBE_MESSAGES = [{"role": "user", "content": "Say hello."}]
PROBE_TOKENS = 32
OLLAMA_DEFAULT_CONTEXT = 2048  # Ollama's context when a model sets no num_ctx (newer releases allow more)
PROBE_TOOL = {"type": "function", "function": {
    "name": "emelex_probe", "description": "Records the value the user gives.",
    "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}}
PROBE_TOOL_MESSAGES = [{"role": "user", "content": f"Call the tool emelex_probe with the value {PROBE_VALUE}."}]
GBNF_SERVERS = ("llama-cpp-python", "llama-server")  # they take a grammar as it is: `grammar`
MAX_LISTED = 1000  # models of a server's list remembered (a reply naming one of them, not the bound one, is refused)
SSE_FIELDS = (":", "event:", "id:", "retry:")  # the lines of a stream of events other than its data

# The ways of asking for schema-constrained output, by name: each adds these fields to the request.
VARIANTS: dict[str, Callable[[dict], dict]] = {
    "response_format.json_schema": lambda schema: {"response_format": {
        "type": "json_schema", "json_schema": {"name": "emelex", "strict": True, "schema": schema}}},
    "response_format.json_object": lambda schema: {"response_format": {"type": "json_object", "schema": schema}},
    "json_schema": lambda schema: {"json_schema": schema},
    "guided_json": lambda schema: {"guided_json": schema},
}
ORDER = {
    "llama-cpp-python": ("response_format.json_object",),
    "llama-server": ("response_format.json_schema", "json_schema", "response_format.json_object"),
    "ollama": ("response_format.json_schema",),
    "vllm": ("response_format.json_schema", "guided_json"),
    "openai-compatible": ("response_format.json_schema", "guided_json", "response_format.json_object"),
}


class ServedBinding:
    """A `ModelBinding`/`AgentBinding` over one served model (`model.server`); see the module docstring.

    Nothing is contacted until the first call that needs the server. Calls
    must not overlap (the worker and the agent run one at a time).
    """

    remote_constraint = True  # the server applies a round's grammar (or calls tools): the agent checks each call

    def __init__(self, model: InstalledModel, settings: WorkerSettings, *,
                 stop: threading.Event | None = None) -> None:
        """Bind the served `model` with the `served_*` settings (timeouts, retries); nothing is contacted yet. Once
        `stop` is set, a reply being read stops (`GenerationInterrupted`)."""
        if model.server is None:
            raise ValueError(f"model {model.name!r} is not a served model")
        self.model = model
        self._stop = stop
        self._endpoint = model.server
        self._settings = settings
        self._client: ServerClient | None = None
        self._info: dict[str, Any] | None = None
        self._variant: str | None = None
        self._tool_calling: ToolCalling | None = None
        self._counts: dict[bytes, int] = {}  # SHA-256 of a text -> its token count
        self._reply_model: str | None = None  # the name the first reply gave the model, when not the one asked for

    # -- the server ----------------------------------------------------------------------------------------------

    def _http(self) -> ServerClient:
        if self._client is None:
            self._client = ServerClient(self._endpoint, self._settings)
        return self._client

    def connect(self) -> dict[str, Any]:
        """What the server reports (once per binding): its kind, the model's identity, context window and
        tokenizer. `ModelServerError` when it cannot be reached or does not serve the model."""
        if self._info is None:
            self._info = _inspect(self._http(), self._endpoint.model_id)
        return self._info

    @property
    def model_identity(self) -> dict[str, Any]:
        """The model as the server reports it (see the module docstring); recorded in a Session's snapshot."""
        return dict(self.connect()["identity"])

    @property
    def context_window(self) -> int:
        """The server's context window (as it reports it, or the one declared with `--context-window`, the smaller
        of both), capped by `model_max_context_tokens`. `ModelServerError` when neither is known."""
        reported, declared = self.connect()["context"], self._endpoint.context_window
        known = [n for n in (reported, declared) if n]
        if not known:
            raise ModelServerError(
                f"the server at {self._endpoint.url} does not report the context window of {self._endpoint.model_id}"
                f"; add the model with `emelex models add-server ... --context-window N` (the server's context size; remove it first if it is recorded)")
        return min(min(known), self._settings.model_max_context_tokens)

    @property
    def tokens_estimated(self) -> bool:
        """True when the server has no tokenize endpoint, so `count_tokens` estimates."""
        return self.connect()["tokenizer"] is None

    def count_tokens(self, text: str) -> int:
        """Tokens of `text`: the server's own count where it has a tokenize endpoint (without the BOS token it
        adds), else UTF-8 bytes / `ESTIMATE_BYTES_PER_TOKEN`, rounded up."""
        if not text:
            return 0
        key = hashlib.sha256(text.encode()).digest()
        cached = self._counts.get(key)
        if cached is not None:
            return cached
        tokenizer = self.connect()["tokenizer"]
        if tokenizer is None:
            count = -(-len(text.encode()) // ESTIMATE_BYTES_PER_TOKEN)
        else:
            count = max(0, _tokenize(self._http(), tokenizer, self._endpoint.model_id, text)
                        - self._info["tokenizer_overhead"])
        if len(self._counts) >= COUNT_CACHE:
            self._counts.clear()
        self._counts[key] = count
        return count

    # -- constrained output -------------------------------------------------------------------------------------

    def constraint(self) -> str:
        """The name of the way this server constrains output to a JSON schema (found by the probe, once);
        `UnconstrainedServerError` when it has none."""
        if self._variant is None:
            info = self.connect()
            tried = []
            for name in ORDER[info["server"]]:
                tried.append(name)
                if self._probe(name):
                    self._variant = name
                    break
            else:
                raise UnconstrainedServerError(
                    f"the {info['server']} server at {self._endpoint.url} does not constrain {self._endpoint.model_id} "
                    f"to a JSON schema (tried {', '.join(tried)}); the agent and extractive jobs need that: see "
                    "docs/models.md, or set summary_mode and distill_mode to abstractive")
        return self._variant

    def _probe(self, name: str) -> bool:
        body = {"model": self._endpoint.model_id, "messages": PROBE_MESSAGES, "max_tokens": PROBE_TOKENS,
                "temperature": 0.0, "seed": DEFAULT_SEED, "stream": False, **VARIANTS[name](PROBE_SCHEMA)}
        try:
            reply = self._http().post_json(CHAT_PATH, body, retry=False)
        except Rejected:
            return False  # the server does not accept this way of asking
        try:
            return json.loads(_message_text(reply)) == {"probe": PROBE_VALUE}
        except (ModelServerReplyError, ValueError):
            return False

    def _constrained(self, schema: dict) -> dict:
        """The request fields that constrain a reply to `schema`: the server's way (`constraint`), or, for a server
        whose converter mis-escapes a literal `schema` holds, a GBNF grammar written here."""
        variant = self.constraint()
        if self.connect()["server"] in GBNF_SERVERS and needs_escaped_literals(schema):
            try:
                return {"grammar": schema_to_gbnf(schema)}
            except ValueError:
                pass  # a schema the writer does not cover: the server's converter it is
        return VARIANTS[variant](schema)

    # -- native tool calling --------------------------------------------------------------------------------

    def tool_calling(self) -> ToolCalling:
        """Whether this server calls tools natively, found out once (see the module docstring)."""
        if self._tool_calling is None:
            self._tool_calling = self._probe_tools()
        return self._tool_calling

    def _probe_tools(self) -> ToolCalling:
        info = self.connect()
        if info["server"] == "ollama" and isinstance(info.get("capabilities"), list):
            native = "tools" in info["capabilities"]
            return ToolCalling(native, f"Ollama lists {'tools among' if native else 'no tools in'} the model's "
                                       "capabilities")
        calls: dict[int, dict] = {}
        try:
            self._generate(PROBE_TOOL_MESSAGES, max_tokens=PROBE_TOKENS * 2, json_schema=None, temperature=0.0,
                           seed=DEFAULT_SEED, extra={"tools": [PROBE_TOOL], "tool_choice": "auto"}, calls=calls,
                           retry=False)
        except Rejected as refused:
            return ToolCalling(False, f"the server refused tools (HTTP {refused.status}: {refused.detail})")
        except ModelServerTimeoutError:
            raise
        except ModelServerError as exc:  # it answered what it serves, then broke its reply to tools
            return ToolCalling(False, f"the server's reply to tools broke off ({str(exc)[:200]})")
        probe = [c for c in calls.values() if c["name"] == PROBE_TOOL["function"]["name"]]
        if probe and _arguments(probe[0]["arguments"]) == {"value": PROBE_VALUE}:
            return ToolCalling(True, "the server streamed a tool call for the probe")
        if calls:
            return ToolCalling(False, "the server's tool call did not say what the probe asked")
        return ToolCalling(False, "the server answered the probe in text")

    def stream_tool_round(self, messages: list[dict], *, tools: list[dict], tool_choice: str, calls_per_batch: int,
                          max_tokens: int, stop: threading.Event, on_text: Callable[[str], None] | None = None,
                          temperature: float = 0.0, seed: int = DEFAULT_SEED,
                          on_progress: Callable[[GenerationProgress], None] | None = None) -> str:
        """The `AgentBinding` method of native tool calling: one streamed completion offering `tools` (OpenAI
        function tools; none: the answer alone) with `tool_choice`, `parallel_tool_calls` asked when
        `calls_per_batch` allows several; returns the round in the union form (`{"answer": text}`, or
        `{"tool_calls": [{"name", "arguments"}, ...]}` in the order the server indexed them), and streams that text to
        `on_text` as it learns it (the answer as it comes, the calls once complete). An answer cut by `max_tokens`
        is returned unclosed, so the agent reports the token limit. `GenerationInterrupted` once `stop` is set."""
        opened: list[bool] = []

        def content(piece: str) -> None:
            if on_text is not None:
                if not opened:
                    opened.append(True)
                    on_text('{"answer":"')
                on_text(json.dumps(piece, ensure_ascii=False)[1:-1])

        extra: dict[str, Any] = {}
        if tools:
            extra = {"tools": tools, "tool_choice": tool_choice}
            if calls_per_batch > 1:
                extra["parallel_tool_calls"] = True
        calls: dict[int, dict] = {}
        if on_progress is not None:  # the round starts before its first text (a screen then starts it afresh)
            on_progress(GenerationProgress(0, 0, "", estimated=True))
        completion = self._generate(messages, max_tokens=max_tokens, json_schema=None, temperature=temperature,
                                    seed=seed, extra=extra, on_text=content, stop=stop, calls=calls,
                                    on_token=on_progress)
        if calls:
            raw = json.dumps({"tool_calls": [{"name": c["name"], "arguments": _arguments(c["arguments"])}
                                             for _, c in sorted(calls.items())]}, separators=(",", ":"),
                             ensure_ascii=False)
            if on_text is not None:
                on_text(('"}' if opened else "") + raw)
            return raw
        raw = json.dumps({"answer": completion.text}, separators=(",", ":"), ensure_ascii=False)
        if completion.finish_reason == "length":
            return raw[:-2]  # unclosed: the round used all of its tokens
        if on_text is not None:
            on_text('"}' if opened else raw)
        return raw

    @property
    def template_digest(self) -> str:
        """SHA-256 hex of the chat template the server reports (of "" when it reports none). The agent's snapshot
        needs it, so a server that cannot constrain output is refused here (`UnconstrainedServerError`)."""
        self.constraint()
        return self.connect()["identity"]["chat_template_sha256"] or hashlib.sha256(b"").hexdigest()

    # -- generation ---------------------------------------------------------------------------------------------

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
             on_token: Callable[[GenerationProgress], None] | None = None) -> str:
        """One greedy completion, constrained to `json_schema` when given; progress to `on_token`."""
        return self.complete(messages, max_tokens=max_tokens, json_schema=json_schema, on_token=on_token).text

    def complete(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict | None = None,
                 attempt: int = 0, repeat_penalty: float = 1.0,
                 on_token: Callable[[GenerationProgress], None] | None = None) -> Completion:
        """One completion sampled for `attempt` as the llama.cpp plugin does (greedy first, then temperature 0.7
        with seed 42 + attempt), with its stop reason; `repeat_penalty` is sent only when above 1."""
        temperature = 0.0 if attempt <= 0 else RETRY_TEMPERATURE
        extra = {"repeat_penalty": repeat_penalty} if repeat_penalty > 1.0 else {}
        return self._generate(messages, max_tokens=max_tokens, json_schema=json_schema, temperature=temperature,
                              seed=DEFAULT_SEED + max(0, attempt), extra=extra, on_token=on_token)

    def stream_chat(self, messages: list[dict[str, str]], *, max_tokens: int, json_schema: dict,
                    stop: threading.Event, on_text: Callable[[str], None] | None = None,
                    temperature: float = 0.0, seed: int = DEFAULT_SEED,
                    on_progress: Callable[[GenerationProgress], None] | None = None) -> str:
        """The `AgentBinding` method: one constrained completion streamed to `on_text`; `GenerationInterrupted`
        once `stop` is set (checked between chunks and while the server is silent; the connection is then closed,
        which stops the server); progress, and the server's silences, to `on_progress`."""
        return self._generate(messages, max_tokens=max_tokens, json_schema=json_schema, temperature=temperature,
                              seed=seed, extra={}, on_text=on_text, stop=stop, on_token=on_progress).text

    def _generate(self, messages: list[dict], *, max_tokens: int, json_schema: dict | None,
                  temperature: float, seed: int, extra: dict,
                  on_token: Callable[[GenerationProgress], None] | None = None,
                  on_text: Callable[[str], None] | None = None, stop: threading.Event | None = None,
                  calls: dict[int, dict] | None = None, retry: bool = True) -> Completion:
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        body: dict[str, Any] = {
            "model": self._endpoint.model_id, "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed, "stream": True, "stream_options": {"include_usage": True},
            **extra,
        }
        if json_schema is not None:
            body.update(self._constrained(json_schema))
        prompt = sum(self.count_tokens(str(m.get("content", ""))) for m in messages) if on_token else 0
        pieces: list[str] = []
        reason, usage, done, streaming = "unknown", None, False, False
        client, url = self._http(), self._endpoint.url

        def stopping() -> bool:
            return (stop is not None and stop.is_set()) or (self._stop is not None and self._stop.is_set())

        def waiting(seconds: float) -> None:
            if on_token is not None:
                on_token(GenerationProgress(prompt, len(pieces), "", estimated=True, waiting_s=seconds))

        waiting(0.0)  # the request goes out: what is shown now is a wait for the server
        try:
            with _refused_constraint(url, body), \
                    client.stream_lines(CHAT_PATH, body, stop=stopping, on_wait=waiting, retry=retry) as lines:
                for line in lines:
                    if stopping():
                        raise GenerationInterrupted(f"while the server at {url} replied ({len(pieces)} pieces so "
                                                    "far)")
                    if not line.startswith("data:"):
                        if not streaming and line.strip() and not line.startswith(SSE_FIELDS):
                            raise ModelServerReplyError(_not_a_stream(url, line))
                        continue  # blank separators, comments (": ping"), event names
                    streaming = True
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = client.decode_line(data, CHAT_PATH)
                    if not isinstance(chunk, dict):
                        raise ModelServerReplyError(f"the server at {url} streamed a chunk that is not a JSON object; "
                                                    "check that it is OpenAI-compatible")
                    if isinstance(chunk.get("error"), dict):
                        raise ModelServerError(f"the server at {url} failed mid-reply: "
                                               f"{client.scrub(str(chunk['error'].get('message')))[:200]}")
                    self._check_model(chunk.get("model"))
                    usage = chunk.get("usage") if isinstance(chunk.get("usage"), dict) else usage
                    piece, finish = _delta(chunk, url)
                    if calls is not None:
                        _tool_deltas(chunk, calls, url)
                    reason = finish or reason
                    if piece and len(pieces) == max_tokens:  # a server that ignores the limit: stop reading it
                        reason, done = "length", True
                        break
                    if piece:
                        pieces.append(piece)
                        if on_text is not None:
                            on_text(piece)
                        if on_token is not None:
                            on_token(GenerationProgress(prompt, len(pieces), piece, estimated=True))
        except StreamStopped:
            raise GenerationInterrupted(f"while waiting for the server at {url} ({len(pieces)} pieces so far)") \
                from None
        if not done:
            raise ModelServerError(f"the server at {url} ended its reply before it was complete (no [DONE]); check "
                                   "that it is still running, then run the command again")
        if on_token is not None:
            exact = _usage(usage)
            on_token(GenerationProgress(*(exact or (prompt, len(pieces))), "", estimated=exact is None))
        return Completion("".join(pieces), reason)

    def _check_model(self, named: Any) -> None:
        """A reply's `model`, when it gives one, must name the model asked for, or at least no other model the server
        lists, and the same model as the binding's earlier replies (see the module docstring)."""
        if not isinstance(named, str) or not named or named == self._endpoint.model_id:
            return
        url, asked = self._endpoint.url, self._endpoint.model_id
        if named in self.connect()["listed"]:
            raise ModelServerReplyError(
                f"the server at {url} answered with model {named!r}, another model it serves, not {asked!r}: a proxy "
                f"falling back to another model?; fix the server, or add {named!r} with `emelex models add-server`")
        if self._reply_model is None:
            self._reply_model = named  # a name the server does not list: an alias of the model asked for
        elif named != self._reply_model:
            raise ModelServerReplyError(
                f"the server at {url} answered for {asked!r} as model {named!r}, where it answered as "
                f"{self._reply_model!r} before: the model behind that name changed; check the server")

    def close(self) -> None:
        """Close the connections to the server; idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None


# -- what the server reports --------------------------------------------------------------------------------


def _inspect(client: ServerClient, model_id: str) -> dict[str, Any]:
    """Ask the server what it serves: see the module docstring."""
    listed = client.get_json("/v1/models")
    entries = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(entries, list):
        raise ModelServerReplyError(f"the server at {client.url} answered GET /v1/models without a model list; "
                                    "check that it is an OpenAI-compatible server")
    entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == model_id), None)
    if entry is None:
        served = ", ".join(str(e.get("id")) for e in entries[:10] if isinstance(e, dict)) or "none"
        raise ModelServerError(f"the server at {client.url} does not serve model {model_id!r} (it serves: "
                               f"{client.scrub(served)[:300]}); add the model with one of those IDs")
    identity: dict[str, Any] = {"model_id": model_id, "digest": None, "model_path": None, "metadata": None,
                                "chat_template_sha256": None}
    context, tokenizer, kind, capabilities = None, None, "openai-compatible", None
    props = client.get_json("/props", missing_ok=True)
    if isinstance(props, dict) and ("default_generation_settings" in props or "model_path" in props):
        kind, tokenizer = "llama-server", "/tokenize"
        identity["model_path"] = _text(props.get("model_path"))
        identity["chat_template_sha256"] = _digest(props.get("chat_template"))
        settings = props.get("default_generation_settings")
        context = _count(settings.get("n_ctx")) if isinstance(settings, dict) else None
        context = context or _count(props.get("n_ctx"))
        meta = entry.get("meta")
        identity["metadata"] = {k: v for k, v in meta.items() if isinstance(v, (int, float, str))} \
            if isinstance(meta, dict) else None
    elif isinstance(client.get_json("/api/version", missing_ok=True), dict):
        kind = "ollama"
        identity["digest"] = _ollama_digest(client, model_id)
        shown = client.post_json("/api/show", {"model": model_id}, missing_ok=True)
        if isinstance(shown, dict):
            capabilities = shown.get("capabilities")  # Ollama 0.6+: "completion", "tools", ...
            identity["chat_template_sha256"] = _digest(shown.get("template"))
            found = re.search(r"^num_ctx\s+(\d+)", str(shown.get("parameters") or ""), re.M)
            context = int(found.group(1)) if found else OLLAMA_DEFAULT_CONTEXT
    elif "max_model_len" in entry:
        kind, tokenizer = "vllm", "/tokenize"
        context = _count(entry.get("max_model_len"))
        identity["model_path"] = _text(entry.get("root"))
    elif _probe_tokenize(client, model_id):
        kind, tokenizer = "llama-cpp-python", "/extras/tokenize"
    identity["server"] = kind
    identity["verified"] = identity["digest"] is not None
    info = {"server": kind, "identity": identity, "context": context, "tokenizer": tokenizer, "tokenizer_overhead": 0,
            "listed": frozenset(str(e.get("id")) for e in entries[:MAX_LISTED] if isinstance(e, dict)),
            "capabilities": capabilities if kind == "ollama" else None}
    if tokenizer is not None:
        info["tokenizer_overhead"] = _tokenize(client, tokenizer, model_id, "")  # a BOS token some servers add
    return info


def _probe_tokenize(client: ServerClient, model_id: str) -> bool:
    try:
        reply = client.post_json("/extras/tokenize", {"input": "", "model": model_id}, missing_ok=True, retry=False)
    except Rejected:
        return False
    return isinstance(reply, dict) and isinstance(reply.get("tokens"), list)


def _tokenize(client: ServerClient, path: str, model_id: str, text: str) -> int:
    """Tokens of `text` by the server's tokenize endpoint `path`: llama-cpp-python's `/extras/tokenize` reads
    `input`; `/tokenize` is llama-server's (`content`) or vLLM's (`prompt`), so both are sent."""
    if path == "/extras/tokenize":
        body = {"input": text, "model": model_id}
    else:
        body = {"content": text, "add_special": False, "model": model_id, "prompt": text, "add_special_tokens": False}
    reply = client.post_json(path, body)
    tokens = reply.get("tokens") if isinstance(reply, dict) else None
    if isinstance(tokens, list):
        return len(tokens)
    raise ModelServerReplyError(f"the server at {client.url} answered {path} without a token list")


def _ollama_digest(client: ServerClient, model_id: str) -> str | None:
    tags = client.get_json("/api/tags", missing_ok=True)
    models = tags.get("models") if isinstance(tags, dict) else None
    for m in models if isinstance(models, list) else []:
        if isinstance(m, dict) and model_id in (m.get("name"), m.get("model")) and isinstance(m.get("digest"), str):
            digest = m["digest"]
            return digest if digest.startswith("sha256:") else f"sha256:{digest}"
    return None


@contextmanager
def _refused_constraint(url: str, body: dict) -> Iterator[None]:
    """A refusal of a request that carried a grammar or a schema, whose reason names one of them, as one line saying
    so (the server could not use the constraint: not a fault of the connection or of the model)."""
    try:
        yield
    except ModelServerError as exc:
        constrained = any(key in body for key in ("grammar", "json_schema", "guided_json", "response_format"))
        if not constrained or not re.search(r"grammar|schema", str(exc), re.IGNORECASE) or \
                isinstance(exc, ModelServerTimeoutError):
            raise
        raise ModelServerReplyError(f"the server at {url} could not use the output grammar of this request: "
                                    f"{exc}") from None


def _tool_deltas(chunk: dict, calls: dict[int, dict], url: str) -> None:
    """Add the `tool_calls` of one streamed chunk to `calls` (index -> {"id", "name", "arguments"}): keyed by their
    `index` (a call without one: a new call when it has an ID, else the last call), the name set once (or streamed in
    pieces), the arguments' JSON text concatenated (an object given whole written as JSON)."""
    choices = chunk.get("choices")
    deltas = ((choices[0].get("delta") or {}).get("tool_calls") if choices else None) or []
    if not isinstance(deltas, list):
        raise ModelServerReplyError(f"the server at {url} streamed tool_calls that are not a list")
    for item in deltas:
        if not isinstance(item, dict) or not isinstance(item.get("function", {}), dict):
            raise ModelServerReplyError(f"the server at {url} streamed a malformed tool call")
        index = item.get("index")
        if not isinstance(index, int):
            index = len(calls) if item.get("id") or not calls else max(calls)
        entry = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
        function = item.get("function") or {}
        entry["id"] = item.get("id") or entry["id"]
        name = function.get("name")
        if isinstance(name, str) and name != entry["name"]:
            entry["name"] += name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            entry["arguments"] += arguments
        elif isinstance(arguments, dict):
            entry["arguments"] = json.dumps(arguments, ensure_ascii=False)


def _arguments(text: str) -> Any:
    """A tool call's arguments from their JSON text: {} for none, the object it holds, else the text itself (which
    the agent then refuses as no round)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _message_text(reply: Any) -> str:
    try:
        text = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ModelServerReplyError("the server's completion has no choices[0].message.content") from None
    return text if isinstance(text, str) else ""


def _delta(chunk: dict, url: str) -> tuple[str, str | None]:
    choices = chunk.get("choices")
    if not choices:
        return "", None  # e.g. the final usage chunk
    try:
        choice = choices[0]
        piece = (choice.get("delta") or {}).get("content") or ""
        finish = choice.get("finish_reason")
    except (AttributeError, IndexError, KeyError, TypeError):  # KeyError: `choices` is an object, not a list
        raise ModelServerReplyError(f"the server at {url} streamed a malformed chunk (no choices[0].delta); check "
                                    "that it is OpenAI-compatible") from None
    if not isinstance(piece, str):
        raise ModelServerReplyError(f"the server at {url} streamed content that is not text")
    return piece, finish if isinstance(finish, str) else None


def _usage(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    return None if prompt is None or completion is None else (prompt, completion)


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _text(value: Any) -> str | None:
    return value[:1024] if isinstance(value, str) and value else None


def _digest(template: Any) -> str | None:
    """The SHA-256 of a template string (a lone surrogate, which JSON can carry, hashed as its UTF-8-like bytes)."""
    if not isinstance(template, str) or not template:
        return None
    return hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()


def _not_a_stream(url: str, line: str) -> str:
    """What a streamed completion's reply that is no stream of events is, by its first line, and what to check."""
    shown = line.strip()[:60]
    if shown.startswith("{"):
        return (f"the server at {url} answered {CHAT_PATH} with a whole JSON reply, not a stream of events (it ignored "
                f'"stream": true); check that {url} is an OpenAI-compatible server that streams')
    if shown.startswith("<"):
        return (f"the server at {url} answered {CHAT_PATH} with an HTML page ({shown!r}...), not a stream of events; "
                f"check the URL {url}: it must be the model server's base URL")
    return (f"the server at {url} answered {CHAT_PATH} with something that is not a stream of events ({shown!r}...); "
            f"check that {url} is an OpenAI-compatible server")
