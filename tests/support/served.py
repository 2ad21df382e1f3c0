"""Model servers for the served-model tests: llama-cpp-python's real OpenAI-compatible server on the embedded default
model, and `ScriptedServer`, a small scripted HTTP peer on 127.0.0.1 (a test double of a model server, Ollama-like)
for the faults a real server cannot be made to show on cue."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from emelex_memory import ServedEndpoint
from emelex_workers.models import ModelManager
from emelex_workers.settings import WorkerSettings

SERVER_START_S = 120.0  # the longest wait for llama-cpp-python's server to answer
ALIAS = "smollm2-served"
PROBE_MARK = "zq7"  # the value the binding's constraint probe schema allows


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def llama_server(model_path: Path, *, n_ctx: int = 2048, embedding: bool = False) -> Iterator[str]:
    """`python -m llama_cpp.server` serving `model_path` as `ALIAS` on a free loopback port (with `embedding`, its
    `/v1/embeddings` too); yields its base URL. Waits at most `SERVER_START_S` for it to answer; terminates it (then
    kills it) on leaving."""
    port = free_port()
    log = tempfile.TemporaryFile()  # not a pipe: the server logs a lot, and a full pipe would stall it
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", ALIAS,
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "2",
         *(["--embedding", "true"] if embedding else [])],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"llama_cpp.server exited: {log.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"llama_cpp.server did not answer within {SERVER_START_S}s") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def add_served(settings: WorkerSettings, name: str, url: str, model_id: str = ALIAS, **options: Any):
    """Record `model_id` at `url` as served model `name` (no server check); return the `InstalledModel`."""
    endpoint = ServedEndpoint(url, model_id, options.pop("api_key_env", None), options.pop("allow_insecure", False),
                              options.pop("context_window", 2048))
    with ModelManager(settings) as manager:
        return manager.add_server(name, endpoint)


class ScriptedServer:
    """An Ollama-like OpenAI-compatible peer on 127.0.0.1, scripted by the test.

    It lists `model_id`, reports `digest` and `template` (Ollama's /api/tags and
    /api/show) and answers chat completions with `reply` (streamed in 4-character
    pieces, then a usage chunk and [DONE]) when the request asks for a JSON schema
    with `response_format` `json_schema` — or "Hello there!" when `constrain` is
    False, like a server that ignores the schema. The constraint probe gets the
    one value its schema allows. `fail(path, *faults)` queues faults, one per
    request to `path`: `("status", code)`, `("slow", seconds)`, `("drop", pieces)`
    (stream that many pieces, then close the connection), `("garbage",)` (a
    body that is not JSON), `("huge", nbytes)` and `("reply", status, body, headers)`
    (those raw bytes with those extra headers); for a chat completion also
    `("endless", size)` (an answer string streamed in pieces of `size`
    characters until the client hangs up), `("whole",)` (the completion as one
    JSON body, "stream" ignored), `("ratelimit", seconds)` (HTTP 429 with
    `Retry-After: seconds` to every request of that path until that long after
    the first) and `("model", name)` (chunks naming model `name`). `also_lists`
    are more model IDs `/v1/models` lists. `requests` logs every request as
    (method, path, headers, body).
    """

    def __init__(self, *, model_id: str = "scripted", digest: str = "sha256:" + "a" * 64,
                 template: str = "{{ .Prompt }}", reply: str = "{}", constrain: bool = True) -> None:
        self.model_id, self.digest, self.template, self.reply, self.constrain = model_id, digest, template, reply, \
            constrain
        self.faults: dict[str, deque] = defaultdict(deque)
        self.requests: list[tuple[str, str, dict, Any]] = []
        self.also_lists: list[str] = []
        self.limited_until: float | None = None  # ("ratelimit", s): when requests are answered again
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True
        self._http.handle_error = lambda request, address: None  # a client that hung up early is a scripted fault
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def fail(self, path: str, *faults: tuple) -> None:
        """Queue `faults` for the next requests to `path`, one each."""
        self.faults[path].extend(faults)

    def count(self, path: str) -> int:
        """How many requests `path` got."""
        return sum(1 for r in self.requests if r[1] == path)

    # -- answering ------------------------------------------------------------------------------------------

    def _routes(self, method: str, path: str, body: Any) -> Any:
        if (method, path) == ("GET", "/v1/models"):
            return {"object": "list", "data": [{"id": m, "object": "model"} for m in (self.model_id, *self.also_lists)]}
        if (method, path) == ("GET", "/api/version"):
            return {"version": "0.5.7"}
        if (method, path) == ("GET", "/api/tags"):
            return {"models": [{"name": self.model_id, "model": self.model_id, "digest": self.digest.split(":")[-1]}]}
        if (method, path) == ("POST", "/api/show"):
            return {"template": self.template, "parameters": "num_ctx 4096"}
        return None

    def _reply(self, body: dict) -> tuple[int, Any] | list[dict] | None:
        """A chat completion's reply of a subclass: an error (`(status, JSON body)`), the data chunks of a stream (each
        sent as an SSE `data:` line, then [DONE]), or None for the scripted answer (`_content`)."""
        return None

    def _content(self, body: dict) -> str:
        fmt = body.get("response_format") or {}
        schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
        if not self.constrain or schema is None:
            return "Hello there!"
        if PROBE_MARK in json.dumps(schema):
            return json.dumps({"probe": PROBE_MARK})
        return self.reply

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, data: bytes, content_type: str = "application/json",
                      headers: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                server.requests.append((method, self.path, dict(self.headers), body))
                queue = server.faults.get(self.path)
                fault = queue.popleft() if queue else None
                if fault is not None and fault[0] == "ratelimit":
                    server.limited_until = server.limited_until or time.monotonic() + fault[1]
                    if time.monotonic() < server.limited_until:
                        queue.appendleft(fault)  # every request until then
                        return self._send(429, b'{"error": {"message": "slow down"}}',
                                          headers={"Retry-After": str(fault[1])})
                    fault = None
                if fault is not None and fault[0] == "slow":
                    time.sleep(fault[1])
                elif fault is not None and fault[0] == "status":
                    echo = {"error": {"message": f"scripted {fault[1]}; got {self.headers.get('Authorization')}"}}
                    return self._send(fault[1], json.dumps(echo).encode())
                elif fault is not None and fault[0] == "garbage":
                    return self._send(200, b"<html>not json</html>", "text/html")
                elif fault is not None and fault[0] == "huge":
                    return self._send(200, b'{"data": "' + b"x" * fault[1] + b'"}')
                elif fault is not None and fault[0] == "reply":
                    return self._send(fault[1], fault[2], headers=fault[3])
                if (method, self.path) == ("POST", "/v1/chat/completions"):
                    custom = server._reply(body)
                    if isinstance(custom, tuple):
                        return self._send(custom[0], json.dumps(custom[1]).encode())
                    if custom is not None:
                        return self._stream(custom)
                    return self._chat(body, fault)
                answer = server._routes(method, self.path, body)
                if answer is None:
                    return self._send(404, b'{"detail": "Not Found"}')
                self._send(200, json.dumps(answer).encode())

            def _chat(self, body: dict, fault: tuple | None) -> None:
                content = server._content(body)
                if fault is not None and fault[0] == "endless":
                    return self._endless(fault[1])
                if not body.get("stream") or (fault is not None and fault[0] == "whole"):
                    choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                    return self._send(200, json.dumps({"choices": [choice]}).encode())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                pieces = [content[i:i + 4] for i in range(0, len(content), 4)]
                named = {"model": fault[1]} if fault is not None and fault[0] == "model" else {}
                for n, piece in enumerate(pieces):
                    if fault is not None and fault[0] == "drop" and n == fault[1]:
                        self.wfile.flush()
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    chunk = {**named, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                usage = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": len(pieces)}}
                self.wfile.write(f"data: {json.dumps(done)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def _stream(self, chunks: list[dict]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _endless(self, size: int) -> None:
                """An answer string that never ends, in pieces of `size` characters, until the client hangs up."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                first = {"choices": [{"index": 0, "delta": {"content": '{"answer": "'}, "finish_reason": None}]}
                try:
                    self.wfile.write(f"data: {json.dumps(first)}\n\n".encode())
                    for n in itertools.count():  # no piece repeats another: no runaway repetition to stop at
                        words = "".join(f"w{n}x{k} " for k in range(size // 8 + 1))[:size]
                        more = {"choices": [{"index": 0, "delta": {"content": words}, "finish_reason": None}]}
                        self.wfile.write(f"data: {json.dumps(more)}\n\n".encode())
                except OSError:  # the client hung up
                    self.close_connection = True

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

        return Handler
