"""The HTTP side of a served model: one httpx client per binding, bounded in time and size, retried with tenacity.

Every request has a connect timeout, a read timeout (the longest silence)
and an overall deadline (`served_*` settings). A refused or dropped
connection, HTTP 429 and HTTP 5xx are retried with exponential backoff
(`served_retries` times) before any byte of the reply was used; nothing
else is retried. A `Retry-After` the server sends with a retried status is
waited out, up to `RETRY_AFTER_MAX_S` and the deadline (a longer one fails
at once, saying so). A reply is at most `MAX_REPLY_BYTES`, one streamed line
at most `MAX_LINE_BYTES`. Every failure is one of the `ModelServerError`
family with a one-line message; the API key (read from its environment
variable when the client is made) is sent only in the Authorization header
and scrubbed from every message.

A streamed request (`stream_lines`) is sent and read on a thread of its own,
while the caller waits on what it reads: so a silent server (before its
first byte, between lines, during a retry's wait) is reported every
`WAIT_REPORT_S` (`on_wait`), and a stop is seen within `WAIT_REPORT_S`
(`StreamStopped`): the reading thread's socket is shut down, or, before the
server answered at all, the thread is left to end at its own timeout.
"""

from __future__ import annotations

import email.utils
import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import tenacity

from emelex_memory import (
    ModelServerError,
    ModelServerReplyError,
    ModelServerTimeoutError,
    ServedEndpoint,
)
from emelex_workers.plugin_api import WorkerSettings

MAX_REPLY_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
MAX_DETAIL = 200  # characters of a server's own error text in our messages
MAX_ERROR_BYTES = 64 * 1024  # bytes of an error reply read for that text
RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_MAX_S = 8.0
RETRY_AFTER_MAX_S = 60.0  # the longest `Retry-After` waited out
WAIT_REPORT_S = 0.25  # how often a wait on a streamed reply is reported and a stop looked for


class StreamStopped(Exception):  # noqa: N818 - the caller's own stop, not a failure
    """`stream_lines` stopped reading because its `stop` event was set."""


class _Retry(Exception):
    """A failure worth retrying: what went wrong and what to do, joined into a `ModelServerError` (with the limit
    that stopped the attempts) once they are spent."""

    def __init__(self, problem: str, advice: str, retry_after: float | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.advice = advice
        self.retry_after = retry_after  # the server's Retry-After, in seconds, when it sent one


class Rejected(Exception):  # noqa: N818 - a reply, not an error of ours
    """The server refused a request sent with `retry=False` (a probe of what it accepts) with an HTTP error status;
    `status` and the server's `detail` (bounded, key scrubbed). With `retry=True` such a refusal is a
    `ModelServerReplyError` instead."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class ServerClient:
    """Requests to one model server (`endpoint`), bounded and retried as the module docstring says."""

    def __init__(self, endpoint: ServedEndpoint, settings: WorkerSettings, *, connect_timeout_s: float | None = None,
                 read_timeout_s: float | None = None) -> None:
        """A client for `endpoint` with the `served_*` settings (the timeouts may be overridden, e.g. for a quick
        listing). Raises `ModelServerError` when httpx is missing or the API key variable is unset."""
        try:
            import httpx
        except ImportError:
            raise ModelServerError(
                "served models need httpx: run `pip install 'emelex-memory[openai]'`"
            ) from None
        self._httpx = httpx
        self.url = endpoint.url
        self._key: str | None = None
        headers = {"Accept": "application/json"}
        if endpoint.api_key_env is not None:
            key = os.environ.get(endpoint.api_key_env, "")
            if not key:
                raise ModelServerError(
                    f"the API key of the server at {endpoint.url} is read from the environment variable "
                    f"{endpoint.api_key_env}, which is not set (or empty): set it, then run the command again"
                )
            self._key = key
            headers["Authorization"] = f"Bearer {key}"
        connect = settings.served_connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        read = settings.served_read_timeout_s if read_timeout_s is None else read_timeout_s
        self._deadline_s = settings.served_request_timeout_s
        self._read_s = read
        self._retries = settings.served_retries
        self._http = httpx.Client(
            base_url=endpoint.url, headers=headers, follow_redirects=False,
            timeout=httpx.Timeout(connect=connect, read=read, write=read, pool=connect),
        )

    def close(self) -> None:
        """Close the connections; idempotent."""
        self._http.close()

    def scrub(self, text: str) -> str:
        """`text` with the API key (if any) replaced by `***`."""
        return text.replace(self._key, "***") if self._key else text

    # -- requests ---------------------------------------------------------------------------------------------

    def get_json(self, path: str, *, missing_ok: bool = False) -> Any:
        """GET `path` and return its JSON; None when `missing_ok` and the server has no such path (HTTP 404/405)."""
        return self._json("GET", path, None, missing_ok=missing_ok, retry=True)

    def post_json(self, path: str, body: dict, *, missing_ok: bool = False, retry: bool = True) -> Any:
        """POST `body` as JSON to `path` and return the reply's JSON; None as for `get_json`. With `retry` False
        only a failed connection is retried, and an HTTP error status raises `Rejected`; otherwise a 4xx is a
        `ModelServerReplyError`."""
        return self._json("POST", path, body, missing_ok=missing_ok, retry=retry)

    def _json(self, method: str, path: str, body: dict | None, *, missing_ok: bool, retry: bool) -> Any:
        deadline = time.monotonic() + self._deadline_s
        with self._response(method, path, body, deadline, retry_status=retry) as response:
            if response is None:
                if missing_ok:
                    return None
                raise ModelServerError(f"the server at {self.url} has no {path} (HTTP 404): give the base URL of an "
                                       "OpenAI-compatible server (without /v1)")
            data = bytearray()
            for chunk in self._reading(response.iter_bytes, path, deadline):
                data += chunk
                if len(data) > MAX_REPLY_BYTES:
                    raise ModelServerReplyError(f"the server at {self.url} sent more than {MAX_REPLY_BYTES} bytes for "
                                                f"{path}; check that the URL is a model server")
        return self._decode(bytes(data), path)

    @contextmanager
    def stream_lines(self, path: str, body: dict, *, stop: Callable[[], bool] | None = None,
                     on_wait: Callable[[float], None] | None = None, retry: bool = True) -> Iterator[Iterator[str]]:
        """POST `body` to `path` and yield an iterator over the reply's lines as they arrive (each at most
        `MAX_LINE_BYTES`, the whole reply at most `MAX_REPLY_BYTES`); leaving the block closes the connection.
        While nothing arrives, `on_wait(seconds)` is called every `WAIT_REPORT_S` with the time since the request
        was sent or the last line came, and once `stop()` is true the iterator raises `StreamStopped` (see the
        module docstring). With `retry` False an HTTP error status raises `Rejected` from the iterator at once, as for
        `post_json`."""
        deadline = time.monotonic() + self._deadline_s
        read: queue.Queue = queue.Queue()
        done = threading.Event()
        held: list[Any] = []  # the open response, once the server answered

        def produce() -> None:
            try:
                with self._response("POST", path, body, deadline, retry_status=retry, cancelled=done) as response:
                    if response is None:
                        raise ModelServerError(f"the server at {self.url} has no {path} (HTTP 404): give the base "
                                               "URL of an OpenAI-compatible server (without /v1)")
                    held.append(response)
                    for line in self._lines(response, path, deadline):
                        if done.is_set():
                            return
                        read.put((True, line))
                read.put((False, None))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
                if not done.is_set():
                    read.put((False, exc))

        def lines() -> Iterator[str]:
            since = time.monotonic()
            while True:
                try:
                    more, value = read.get(timeout=WAIT_REPORT_S)
                except queue.Empty:
                    if stop is not None and stop():
                        raise StreamStopped() from None
                    if on_wait is not None:
                        on_wait(time.monotonic() - since)
                    continue
                if not more:
                    if value is not None:
                        raise value
                    return
                since = time.monotonic()
                yield value

        reader = threading.Thread(target=produce, name="emelex-served-reply", daemon=True)
        reader.start()
        try:
            yield lines()
        finally:
            done.set()
            if held:
                _shut(held[0])  # a reader blocked on the socket ends now; a finished one is unaffected
                reader.join(self._read_s)

    def _lines(self, response: Any, path: str, deadline: float) -> Iterator[str]:
        total, pending = 0, b""
        for chunk in self._reading(response.iter_raw, path, deadline):
            total += len(chunk)
            if total > MAX_REPLY_BYTES:
                raise ModelServerReplyError(f"the server at {self.url} streamed more than {MAX_REPLY_BYTES} bytes for "
                                            f"{path}; check that the URL is a model server")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > MAX_LINE_BYTES:
                raise ModelServerReplyError(f"the server at {self.url} streamed a line longer than {MAX_LINE_BYTES} "
                                            "bytes; check that the URL is a model server")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.decode("utf-8", "replace")

    def decode_line(self, text: str, path: str) -> Any:
        """The JSON value of one streamed data line; `ModelServerReplyError` when it is not JSON."""
        return self._decode(text.encode(), path)

    def _decode(self, data: bytes, path: str) -> Any:
        try:
            return json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
            shown = self.scrub(data[:60].decode("utf-8", "replace"))
            raise ModelServerReplyError(f"the server at {self.url} replied to {path} with something that is not JSON "
                                        f"({shown!r}...); check that the URL is an OpenAI-compatible server") from None

    # -- connection, status and retries ----------------------------------------------------------------------

    def _reading(self, chunks: Any, path: str, deadline: float) -> Iterator[bytes]:
        """The reply's byte chunks, with a dropped connection, a read timeout and the deadline as typed errors."""
        httpx = self._httpx
        try:
            for chunk in chunks():
                if time.monotonic() > deadline:
                    raise ModelServerTimeoutError(
                        f"the server at {self.url} took longer than {self._deadline_s:g}s (served_request_timeout_s) "
                        f"for {path}; check its load, or raise EMELEX_SERVED_REQUEST_TIMEOUT_S")
                yield chunk
        except httpx.TimeoutException:
            raise self._timeout(path) from None
        except httpx.TransportError as exc:
            raise ModelServerError(f"the server at {self.url} dropped the connection while replying to {path} "
                                   f"({type(exc).__name__}); check that it is still running, then run the command "
                                   "again") from None
        except httpx.HTTPError as exc:  # e.g. DecodingError: a body its Content-Encoding does not describe
            raise ModelServerReplyError(f"the server at {self.url} sent a reply to {path} that could not be decoded "
                                        f"({type(exc).__name__}); check that the URL is a model server") from None

    def _timeout(self, path: str) -> ModelServerTimeoutError:
        return ModelServerTimeoutError(
            f"the server at {self.url} was silent for {self._read_s:g}s (served_read_timeout_s) while answering "
            f"{path}; check its load, or raise EMELEX_SERVED_READ_TIMEOUT_S")

    @contextmanager
    def _response(self, method: str, path: str, body: dict | None, deadline: float, *,
                  retry_status: bool, cancelled: threading.Event | None = None) -> Iterator[Any]:
        """An open streamed response with a 2xx status (None for 404/405), after retries; closed on leaving. A
        retry waits what the server's `Retry-After` asked, when more than the backoff (within the deadline); once
        `cancelled` is set no further attempt is made."""
        backoff = tenacity.wait_exponential(multiplier=0.25, max=BACKOFF_MAX_S)

        def wait(state: tenacity.RetryCallState) -> float:
            asked = getattr(state.outcome.exception(), "retry_after", None) if state.outcome else None
            return min(max(backoff(state), asked or 0.0), max(0.0, deadline - time.monotonic()))

        stopped = tenacity.stop_after_attempt(self._retries + 1) | tenacity.stop_after_delay(
            max(0.0, deadline - time.monotonic()))
        if cancelled is not None:
            stopped = stopped | tenacity.stop_when_event_set(cancelled)
        attempts = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Retry), stop=stopped, wait=wait, reraise=True,
            sleep=(lambda seconds: cancelled.wait(seconds)) if cancelled is not None else time.sleep,
        )
        try:
            response = attempts(self._open, method, path, body, retry_status)
        except _Retry as spent:
            retries = attempts.statistics.get("attempt_number", 1) - 1
            limit = f"after {retries} retries" if retries >= self._retries else (
                f"after {retries} retries, when the deadline of {self._deadline_s:g}s (served_request_timeout_s) "
                "ran out")
            raise ModelServerError(f"{spent.problem} {limit}; {spent.advice}") from None
        try:
            yield None if response.status_code in (404, 405) else response
        finally:
            response.close()

    def _open(self, method: str, path: str, body: dict | None, retry_status: bool) -> Any:
        httpx = self._httpx
        request = self._http.build_request(method, path, json=body)
        try:
            response = self._http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise _Retry(*self._unreachable(exc)) from None
            raise self._timeout(path) from None
        except httpx.TransportError as exc:  # refused, reset, or closed before the status line
            raise _Retry(*self._unreachable(exc)) from None
        status = response.status_code
        if 200 <= status < 300 or status in (404, 405):
            return response
        try:
            detail = self._detail(response)
        finally:
            response.close()
        if status in RETRIED_STATUS and retry_status:
            after = _retry_after(response.headers.get("retry-after"))
            if after is not None and after > RETRY_AFTER_MAX_S:
                raise ModelServerError(
                    f"the server at {self.url} answered {path} with HTTP {status} and asked to retry after "
                    f"{after:.0f}s, longer than the {RETRY_AFTER_MAX_S:.0f}s Emelex waits; run the command again "
                    "later")
            raise _Retry(f"the server at {self.url} kept answering {path} with HTTP {status} ({detail})",
                         "check its logs and load, then run the command again", after)
        if status in (401, 403):
            raise ModelServerError(f"the server at {self.url} refused the request (HTTP {status}: {detail}): check "
                                   "the API key in the variable named by --api-key-env")
        if 300 <= status < 400:
            raise ModelServerReplyError(f"the server at {self.url} redirects {path} (HTTP {status}); add the model "
                                        "again with the URL it redirects to")
        if not retry_status:  # the caller asks whether the server accepts the request at all
            raise Rejected(status, detail)
        raise ModelServerReplyError(f"the server at {self.url} refused {path} (HTTP {status}: {detail}); check the "
                                    "model ID and the server's logs")

    def _unreachable(self, exc: Exception) -> tuple[str, str]:
        return (f"cannot reach the model server at {self.url} ({type(exc).__name__})",
                "start it, or check the URL with `emelex models list`")

    def _detail(self, response: Any) -> str:
        """The server's own error text, bounded and scrubbed (its JSON `error.message`/`detail` when it has one)."""
        raw = b""
        try:
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > MAX_ERROR_BYTES:
                    break
        except self._httpx.HTTPError:
            pass
        text = raw.decode("utf-8", "replace")
        try:
            value = json.loads(text)
            error = value.get("error", value) if isinstance(value, dict) else value
            text = str(error.get("message") or error.get("detail") or error) if isinstance(error, dict) else str(error)
        except (ValueError, RecursionError):
            pass
        text = " ".join(self.scrub(text).split())
        return (text[:MAX_DETAIL - 3] + "...") if len(text) > MAX_DETAIL else (text or "no detail")


def _retry_after(value: str | None) -> float | None:
    """The seconds a `Retry-After` header asks to wait (a number of seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        return max(0.0, float(value.strip()))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _shut(response: Any) -> None:
    """Shut the socket of a streamed `response` down (both ways), so that a thread blocked reading it ends."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
