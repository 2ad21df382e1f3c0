"""Served-model faults said precisely and bounded, against a scripted model server on 127.0.0.1
(tests/support/served.py): a server that changed the model behind its name (the refusal names the old and new value
of every changed identity field, with advice for a served model), a reply that never ends (bounded by the round's
token limit and the reply cap, each streamed character read once), a reply that is a whole JSON body or an HTML page
(named as such, with the URL to check), `Retry-After` honoured up to a bound, a reply naming another model (refused
when it is another model the server lists or the name changed mid-run), and a silent server (its wait reported, a
stop seen within a quarter second)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, ModelServerError, ModelServerReplyError, SnapshotMismatchError
from emelex_workers.settings import WorkerSettings
from emelex_workers.agent import protocol
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.agent.session import RUNAWAY_WINDOW
from emelex_workers.cli.chat_show import TurnProgress
from emelex_workers.cli.work_display import PlainLines
from emelex_workers.host.manager import bind_model, get_plugin_manager
from emelex_workers.plugin_api import GenerationInterrupted, GenerationProgress
from emelex_workers.worker.work_report import JobStart
from tests.support.agent import answer
from tests.support.served import ScriptedServer, add_served

pytest.importorskip("httpx")

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fast(home: Path) -> WorkerSettings:
    return WorkerSettings(home=home, plugins_autoload=False, served_read_timeout_s=5.0, served_connect_timeout_s=1.0,
                    served_retries=2, served_request_timeout_s=60.0)


@pytest.fixture
def server():
    with ScriptedServer(reply=json.dumps({"x": "ok"})) as s:
        yield s


def bound(settings: WorkerSettings, model, stop: threading.Event | None = None):
    return bind_model(get_plugin_manager(settings), model, settings, stop=stop)[1]


def test_a_changed_server_is_refused_naming_old_and_new_of_every_changed_field(fast: WorkerSettings,
                                                                               workspace: Path) -> None:
    from tests.support.agent_crash_child import tools_of

    with ScriptedServer(reply=json.dumps(answer("hello"))) as server:
        model = add_served(fast, "m", server.url, "scripted")
        tools = tools_of(fast)

        async def session(resume: str | None) -> str:
            with MemoryStore.open(fast) as store:
                binding = bound(fast, model)
                snapshot = build_snapshot(binding, tools, model_reference=model.reference,
                                          model_snapshot_id=model.snapshot_id, system_prompt="Test agent.")
                if resume is not None:
                    await DurableAgentSession.resume(store, resume, workspace, binding, tools, snapshot, model=model)
                    return resume
                agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, model=model)
                await agent.turn("hi")
                await agent.close()
                return agent.session_id

        sid = asyncio.run(session(None))
        server.digest, server.template = "sha256:" + "b" * 64, "{{ .System }} {{ .Prompt }}"  # `ollama pull`
        with pytest.raises(SnapshotMismatchError) as refused:
            asyncio.run(session(sid))
    message = str(refused.value)
    assert refused.value.field == "template_digest"  # the first field that differs, as before (the served template's)
    assert "model_identity.digest was 'sha256:" + "a" * 64 + "' and is now 'sha256:" + "b" * 64 + "'" in message
    assert "model_identity.chat_template_sha256 was '" in message
    assert "serve the Session's model under that name again, or start a new Session" in message
    assert "None" not in message and "install" not in message  # nothing a served model cannot do


def test_a_reply_that_never_ends_stops_at_the_token_limit(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("endless", 16))
    pieces: list[str] = []
    text = binding.stream_chat(HI, max_tokens=64, json_schema=SCHEMA, stop=threading.Event(), on_text=pieces.append)
    assert len(pieces) == 64 and text == "".join(pieces)  # the server ignored max_tokens: it is read no further


def test_a_reply_of_huge_pieces_stops_at_the_reply_cap(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("endless", 512 * 1024))  # 512 KiB per piece: the cap comes first
    with pytest.raises(ModelServerReplyError, match="streamed more than 8388608 bytes"):
        binding.stream_chat(HI, max_tokens=512, json_schema=SCHEMA, stop=threading.Event())


def test_a_rounds_string_is_read_once_however_long_it_gets(monkeypatch) -> None:
    """Linear time: each streamed character is scanned once, and the runaway check after each piece looks at a
    window of bounded size, not at the whole string so far (which grew by one piece each time)."""
    from emelex_workers.agent.session import AgentSession
    from tests.support.agent import ScriptedBinding
    from tests.support.agent_engine import snapshot

    looked: list[int] = []
    real = protocol.runaway_at
    monkeypatch.setattr(protocol, "runaway_at", lambda text: looked.append(len(text)) or real(text))
    text = "".join(f"line {n:05d} of a long answer, none like another. " for n in range(1000))  # 45 000 characters
    agent = AgentSession(ScriptedBinding([answer(text)]), snapshot(tools=(), round_tokens=20_000), {})
    out = agent.generate_round(stop=threading.Event())
    assert out.answer == text and len(looked) > len(text) // 4  # looked after every 4-character piece
    assert max(looked) == RUNAWAY_WINDOW  # the check's work per piece stays the same as the string grows


@pytest.mark.parametrize("fault, said", [
    (("whole",), 'with a whole JSON reply, not a stream of events (it ignored "stream": true)'),
    (("garbage",), "with an HTML page ('<html>not json</html>'...), not a stream of events; check the URL"),
])
def test_a_reply_that_is_no_stream_is_named_with_the_url(fast: WorkerSettings, server: ScriptedServer, fault, said) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", fault)
    with pytest.raises(ModelServerReplyError) as error:
        binding.chat(HI, max_tokens=8, json_schema=SCHEMA)
    assert str(error.value).startswith(f"the server at {server.url} answered /v1/chat/completions {said}")
    assert "no [DONE]" not in str(error.value)


def test_retry_after_is_waited_out(fast: WorkerSettings, server: ScriptedServer) -> None:
    """The server refuses every request for 2 s, saying so in Retry-After; two quick retries (0.25 s, 0.5 s) would
    both come too soon, waiting what it asked does not."""
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("ratelimit", 2))
    assert binding.chat(HI, max_tokens=8, json_schema=SCHEMA) == '{"x": "ok"}'
    assert [r[1] for r in server.requests].count("/v1/chat/completions") <= 1 + 2 + 1  # probe, 429s, the answer


def test_a_retry_after_longer_than_emelex_waits_fails_at_once_saying_so(fast: WorkerSettings, server) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("ratelimit", 3600))
    with pytest.raises(ModelServerError, match="asked to retry after 3600s, longer than the 60s Emelex waits"):
        binding.chat(HI, max_tokens=8, json_schema=SCHEMA)


def test_a_reply_from_another_listed_model_or_a_model_that_changed_is_refused(fast: WorkerSettings, server) -> None:
    server.also_lists = ["fallback-model"]
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("model", "fallback-model"))
    with pytest.raises(ModelServerReplyError, match="answered with model 'fallback-model', another model it serves"):
        binding.chat(HI, max_tokens=8, json_schema=SCHEMA)
    server.fail("/v1/chat/completions", ("model", "scripted:latest"), ("model", "scripted:latest"),
                ("model", "scripted-v2"))
    assert binding.chat(HI, max_tokens=8, json_schema=SCHEMA) == '{"x": "ok"}'  # an alias the server does not list
    assert binding.chat(HI, max_tokens=8, json_schema=SCHEMA) == '{"x": "ok"}'
    with pytest.raises(ModelServerReplyError, match="where it answered as 'scripted:latest' before"):
        binding.chat(HI, max_tokens=8, json_schema=SCHEMA)


def test_a_silent_server_is_reported_while_it_is_waited_for_and_a_stop_ends_the_wait(fast, server) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("slow", 1.2))
    seen: list[GenerationProgress] = []
    assert binding.chat(HI, max_tokens=8, json_schema=SCHEMA, on_token=seen.append) == '{"x": "ok"}'
    waits = [p.waiting_s for p in seen if p.waiting_s is not None]
    assert waits[0] == 0.0 and max(waits) >= 1.0  # reported as the request goes out, then every quarter second
    server.fail("/v1/chat/completions", ("slow", 4.0))
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(GenerationInterrupted, match="^while waiting for the server at "):
        binding.stream_chat(HI, max_tokens=8, json_schema=SCHEMA, stop=stop)


def test_the_wait_is_shown_in_the_chat_status_and_the_workers_plain_lines(capsys) -> None:
    progress = TurnProgress(0.0)
    progress.report(1, GenerationProgress(11, 0, "", estimated=True, waiting_s=12.4))
    assert "waiting for the model server: 12 s" in progress.status(13.0)
    lines = PlainLines(__import__("sys").stdout)
    job = JobStart("j1", "distill", "s1", 1, 100)
    for waited in (0.0, 5.0, 10.2, 20.0, 40.5, 41.0):
        lines.generating(job, GenerationProgress(11, 0, "", estimated=True, waiting_s=waited), 64)
    assert capsys.readouterr().out.splitlines() == [
        "[distill] job j1  waiting for the model server: 10 s", "[distill] job j1  waiting for the model server: 40 s"]
