"""`ToolServer`: a scripted model server on 127.0.0.1 that calls tools natively the way a capable model behind
llama-server (`--jinja`), vLLM (`--enable-auto-tool-choice --tool-call-parser ...`) or Ollama does, replaying scripted
replies in the format that server streams (a test double of such a server; the formats are those the servers'
sources and docs give: `docs/agent.md`, "Native tool calling").

A reply is `text("...")` (an answer in the model's own words, streamed in 4-character pieces), `tool_calls((name,
arguments), ...)` (one round of calls, in one reply: several are parallel calls) or `text_then_calls(text, ...)` (a
preamble the model writes before its calls). `native=False` makes the server refuse tools as that server does
without tool calling switched on. The server also answers the binding's probes: what it serves (`/v1/models` and the
server's own endpoints), the JSON-schema constraint probe, and the tool probe (`hold_probe`, an event, holds that
reply until it is set). `chats` logs every chat completion request body the server was sent.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import Any

from .served import PROBE_MARK, ScriptedServer

FLAVOURS = ("llama-server", "vllm", "ollama")
REFUSALS = {  # what each server answers a request with tools when it cannot call them
    "llama-server": (500, {"error": {"code": 500, "message": "tools param requires --jinja flag",
                                     "type": "server_error"}}),
    "vllm": (400, {"object": "error", "message": '"auto" tool choice requires --enable-auto-tool-choice and '
                   "--tool-call-parser to be set", "type": "BadRequestError", "param": None, "code": 400}),
    "ollama": (400, {"error": "registry.ollama.ai/library/qwen2.5:7b does not support tools"}),
}
HOLD_S = 60  # the longest a held reply waits
ARGUMENT_PIECE = 7  # characters of a call's arguments per streamed delta (llama-server, vLLM)


def text(words: str) -> tuple:
    """A reply that answers in the model's own words."""
    return ("text", words, ())


def tool_calls(*calls: tuple[str, dict]) -> tuple:
    """A reply that calls tools `(name, arguments)`, in order, in one round."""
    return ("calls", "", calls)


def text_then_calls(words: str, *calls: tuple[str, dict]) -> tuple:
    """A reply whose model writes `words` before its calls."""
    return ("calls", words, calls)


class ToolServer(ScriptedServer):
    """A server of `flavour` (one of `FLAVOURS`) replaying `replies` (see the module docstring) to the chat
    completions that are not probes, one each, in order."""

    def __init__(self, flavour: str, replies: list[tuple] = (), *, native: bool = True, model_id: str = "qwen",
                 hold_probe: threading.Event | None = None) -> None:
        super().__init__(model_id=model_id)
        self.flavour, self.native, self.hold_probe = flavour, native, hold_probe
        self.replies: deque[tuple] = deque(replies)
        self.chats: list[dict] = []

    # -- what it serves ---------------------------------------------------------------------------------------

    def _routes(self, method: str, path: str, body: Any) -> Any:
        if (method, path) == ("GET", "/v1/models"):
            entry = {"id": self.model_id, "object": "model"}
            if self.flavour == "vllm":
                entry |= {"max_model_len": 8192, "root": "/models/qwen"}
            return {"object": "list", "data": [entry]}
        if self.flavour == "llama-server" and (method, path) == ("GET", "/props"):
            return {"default_generation_settings": {"n_ctx": 8192}, "model_path": "/models/qwen.gguf",
                    "chat_template": "{{ messages }}"}
        if self.flavour != "ollama" and (method, path) == ("POST", "/tokenize"):
            text_ = body.get("content") or body.get("prompt") or ""
            return {"tokens": list(range(len(text_) // 4))}
        if self.flavour == "ollama":
            if (method, path) == ("POST", "/api/show"):
                return {"template": "{{ .Prompt }}", "parameters": "num_ctx 8192",
                        "capabilities": ["completion", "tools"] if self.native else ["completion"]}
            return super()._routes(method, path, body)
        return None

    # -- chat completions -------------------------------------------------------------------------------------

    def _reply(self, body: dict) -> tuple[int, Any] | list[dict] | None:
        reply = self._choose(body)
        if body.get("stream") or not isinstance(reply, tuple) or len(reply) != 3:
            return self._chunks(reply) if isinstance(reply, tuple) and len(reply) == 3 else reply
        kind, words, calls = reply  # a reply not streamed: one message
        message = {"role": "assistant", "content": words or None}
        if calls:
            message["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                      "function": {"name": name, "arguments": json.dumps(arguments)}}
                                     for i, (name, arguments) in enumerate(calls)]
        return 200, {"choices": [{"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if calls else "stop"}]}

    def _choose(self, body: dict) -> tuple:
        """The scripted reply to `body` (`(kind, words, calls)`), or an error `(status, JSON body)`."""
        tools = body.get("tools")
        if tools and any(t["function"]["name"] == "emelex_probe" for t in tools):
            if self.hold_probe is not None:
                self.hold_probe.wait(timeout=HOLD_S)
            if not self.native:
                return REFUSALS[self.flavour]
            return ("calls", "", (("emelex_probe", {"value": PROBE_MARK}),))
        if PROBE_MARK in json.dumps(body.get("response_format") or body.get("json_schema") or {}):
            return ("text", json.dumps({"probe": PROBE_MARK}), ())
        self.chats.append(body)
        if tools and not self.native:
            return REFUSALS[self.flavour]
        if not self.replies:
            return 500, {"error": {"message": "the scripted server has no more replies"}}
        return self.replies.popleft()

    def _chunks(self, reply: tuple) -> list[dict]:
        """The data chunks of `reply`, as this server streams them."""
        kind, words, calls = reply
        chunks = [_chunk({"role": "assistant", "content": ""})] if self.flavour == "vllm" else []
        chunks += [_chunk({"content": words[i:i + 4]}) for i in range(0, len(words), 4)]
        for index, (name, arguments) in enumerate(calls):
            chunks += getattr(self, "_" + self.flavour.replace("-", "_"))(index, name, json.dumps(arguments))
        finish = "tool_calls" if calls else "stop"
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        chunks.append({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": len(chunks)}})
        return chunks

    @staticmethod
    def _llama_server(index: int, name: str, arguments: str) -> list[dict]:
        """llama-server: the call's ID, type and name with empty arguments, then the arguments in pieces."""
        first = {"index": index, "id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": ""}}
        return [_chunk({"tool_calls": [first]})] + [
            _chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + ARGUMENT_PIECE]}}]})
            for i in range(0, len(arguments), ARGUMENT_PIECE)]

    @staticmethod
    def _vllm(index: int, name: str, arguments: str) -> list[dict]:
        """vLLM: the ID, type and name (no arguments key), then the arguments in pieces."""
        first = {"id": f"chatcmpl-tool-{index}", "type": "function", "index": index, "function": {"name": name}}
        return [_chunk({"tool_calls": [first]})] + [
            _chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[i:i + ARGUMENT_PIECE]}}]})
            for i in range(0, len(arguments), ARGUMENT_PIECE)]

    @staticmethod
    def _ollama(index: int, name: str, arguments: str) -> list[dict]:
        """Ollama: each call whole, in a chunk of its own."""
        call = {"id": f"call_{index:08x}", "index": index, "type": "function",
                "function": {"name": name, "arguments": arguments}}
        return [_chunk({"role": "assistant", "content": "", "tool_calls": [call]})]


def _chunk(delta: dict) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
