"""Served models against a scripted model server on 127.0.0.1 (tests/support/served.py): recording them (URL rules,
the API key never stored or shown), what the binding asks and refuses, and every fault: the server down, killed
mid-stream, too slow, 429 then 200, 5xx throughout, a reply that is not JSON or too large, a server that cannot
constrain output, and the model changed behind a resumed Session."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from emelex_memory import (
    InvalidModelError,
    MemoryStore,
    ModelServerError,
    ModelServerReplyError,
    ModelServerTimeoutError,
    NewEvent,
    ServedEndpoint,
    SnapshotMismatchError,
    UnconstrainedServerError,
)
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot
from emelex_workers.models import ModelManager
from emelex_workers.host.manager import bind_model, get_plugin_manager
from emelex_workers.worker.work import work
from emelex_workers.settings import WorkerSettings
from tests.support.agent import answer
from tests.support.served import ScriptedServer, add_served, free_port
from tests.support import table_rows
from tests.support.plugins import make_distribution

pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[3]
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
SECRET = "sk-emelex-test-4f9d2c7b"
SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
TURNS = [("Which Python do we use?", "Python 3.11, with apsw."), ("Where is the database?", "Under Emelex Home.")]


@pytest.fixture
def fast(home: Path) -> WorkerSettings:
    """Settings with short served-model timeouts and quick retries (the backoff starts at 0.25 s)."""
    return WorkerSettings(home=home, plugins_autoload=False, served_read_timeout_s=1.0, served_connect_timeout_s=1.0,
                    served_retries=2)


@pytest.fixture
def server():
    with ScriptedServer(reply=json.dumps({"x": "ok"})) as s:
        yield s


def bound(settings: WorkerSettings, model):
    return bind_model(get_plugin_manager(settings), model, settings)[1]


def cli(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "EMELEX_HOME": str(home), **(env or {})}
    return subprocess.run([*EMELEX, *args], env=full, cwd=ROOT, capture_output=True, text=True, timeout=120)


# -- recording a served model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("url, allow, problem", [
    ("ftp://127.0.0.1:21", False, "http:// or https://"),
    ("http://192.0.2.7:8080", False, "--allow-insecure"),
    ("http://user:pw@127.0.0.1:8080", False, "user name or password"),
    ("http://127.0.0.1:8080/?key=1", False, "query"),
    ("http://:8080", False, "no host"),
    ("http://[::1", False, "malformed"),
    ("http://[zz]:80", False, "malformed"),
])
def test_a_bad_url_is_refused_and_nothing_is_written(settings: WorkerSettings, url, allow, problem) -> None:
    with ModelManager(settings) as manager, pytest.raises(InvalidModelError, match=problem):
        manager.add_server("m", ServedEndpoint(url, "m", None, allow, 0))
    assert not settings.home_dir.exists()


def test_plain_http_off_loopback_needs_allow_insecure_and_https_does_not(settings: WorkerSettings) -> None:
    with ModelManager(settings) as manager:
        insecure = manager.add_server("lan", ServedEndpoint("http://192.0.2.7:8080/v1/", "m", None, True, 0))
        secure = manager.add_server("tls", ServedEndpoint("https://models.example/v1", "m", None, False, 0))
        loop = manager.add_server("loop", ServedEndpoint("http://localhost:11434", "m", None, False, 0))
    assert (insecure.server.url, secure.server.url, loop.server.url) == (
        "http://192.0.2.7:8080", "https://models.example", "http://localhost:11434")
    assert insecure.kind == "served" and insecure.files == () and insecure.reference.startswith("lan@sha256:")


EXPLODING = """
from emelex_openai.binding import ServedBinding
from emelex_workers.hookspecs import hookimpl


class Exploding(ServedBinding):
    @property
    def {member}(self):
        raise RuntimeError("{member} exploded")


@hookimpl(tryfirst=True)
def model_binding(model, settings):
    return Exploding(model, settings) if model.kind == "served" else None
"""


@pytest.mark.parametrize("member", ["model_identity", "context_window"])
def test_models_list_shows_a_binding_that_raises_as_a_problem(tmp_path: Path, server: ScriptedServer, member) -> None:
    home = tmp_path / "home"
    add_served(WorkerSettings(home=home), "m", server.url, "scripted")
    site = make_distribution(tmp_path / "site", "emelex-exploding", "0.1", {"emelex_exploding": EXPLODING.format(
        member=member)}, {"exploding": "emelex_exploding"})
    listed = cli(home, "models", "list", env={"PYTHONPATH": str(site)})
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert f"server not checked: plugin 'exploding' failed reading {member}: RuntimeError: {member} exploded" \
        in listed.stdout


def test_models_list_bounds_the_whole_listing_of_a_server(tmp_path: Path, server: ScriptedServer) -> None:
    home = tmp_path / "home"
    add_served(WorkerSettings(home=home), "m", server.url, "scripted")
    for path in ("/v1/models", "/api/version", "/api/tags"):  # each answer within 5 s, all of them over 10 s
        server.fail(path, ("slow", 4.0))
    listed = cli(home, "models", "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert "server not checked: the server did not finish answering within 10s" in listed.stdout


def test_an_api_key_value_is_refused_as_a_variable_name(settings: WorkerSettings) -> None:
    with ModelManager(settings) as manager, pytest.raises(InvalidModelError) as err:
        manager.add_server("m", ServedEndpoint("http://127.0.0.1:1", "m", SECRET, False, 0))
    assert SECRET not in str(err.value)


def test_add_server_checks_the_server_and_the_key_never_appears(tmp_path: Path, server: ScriptedServer) -> None:
    home = tmp_path / "home"
    added = cli(home, "models", "add-server", "remote", "--url", server.url + "/v1", "--model", "scripted",
                "--api-key-env", "EMELEX_TEST_KEY", "--json", env={"EMELEX_TEST_KEY": SECRET})
    assert added.returncode == 0, added.stderr
    out = json.loads(added.stdout)
    assert out["outcome"] == "added" and out["identity"]["verified"] is True
    assert out["identity"]["digest"] == "sha256:" + "a" * 64 and out["context_window"] == 4096
    assert server.requests[0][2]["Authorization"] == f"Bearer {SECRET}"  # sent to the server, and only there
    listed = cli(home, "models", "list", "--json", env={"EMELEX_TEST_KEY": SECRET})
    text = cli(home, "models", "list", env={"EMELEX_TEST_KEY": SECRET})
    assert "identity verified" in text.stdout
    manifest = (home / "models" / "remote" / "manifest.json").read_bytes()
    for shown in (added.stdout, added.stderr, listed.stdout, listed.stderr, text.stdout, manifest.decode()):
        assert SECRET not in shown
    assert json.loads(manifest)["server"]["api_key_env"] == "EMELEX_TEST_KEY"


def test_add_server_records_nothing_when_the_server_is_down(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = cli(home, "models", "add-server", "gone", "--url", f"http://127.0.0.1:{free_port()}", "--model", "m",
               env={"EMELEX_SERVED_RETRIES": "0"})
    assert done.returncode != 0 and "cannot reach the model server" in done.stderr
    assert "Traceback" not in done.stderr and not (home / "models" / "gone").exists()


def test_a_server_without_a_digest_is_listed_as_unverified(tmp_path: Path, server: ScriptedServer) -> None:
    server.digest = "none"
    server._routes = lambda method, path, body, real=server._routes: (
        {"models": []} if path == "/api/tags" else real(method, path, body))
    home = tmp_path / "home"
    assert cli(home, "models", "add-server", "m", "--url", server.url, "--model", "scripted").returncode == 0
    listed = cli(home, "models", "list")
    assert "identity unverified" in listed.stdout and "reports no digest" in listed.stdout


def test_a_refused_key_is_scrubbed_from_the_error(fast: WorkerSettings, server: ScriptedServer, monkeypatch) -> None:
    monkeypatch.setenv("EMELEX_TEST_KEY", SECRET)
    model = add_served(fast, "m", server.url, "scripted", api_key_env="EMELEX_TEST_KEY")
    server.fail("/v1/models", ("status", 401))  # the scripted server echoes the Authorization header back
    binding = bound(fast, model)
    with pytest.raises(ModelServerError, match="HTTP 401") as err:
        binding.context_window
    assert SECRET not in str(err.value) and "***" in str(err.value)
    binding.close()


def test_an_unset_key_variable_is_a_one_line_error(fast: WorkerSettings, server: ScriptedServer, monkeypatch) -> None:
    monkeypatch.delenv("EMELEX_TEST_KEY", raising=False)
    model = add_served(fast, "m", server.url, "scripted", api_key_env="EMELEX_TEST_KEY")
    with pytest.raises(ModelServerError, match="EMELEX_TEST_KEY, which is not set"):
        bound(fast, model).context_window
    assert server.requests == []


# -- the binding ------------------------------------------------------------------------------------------------


def test_a_model_the_server_does_not_serve_is_refused(fast: WorkerSettings, server: ScriptedServer) -> None:
    model = add_served(fast, "m", server.url, "other-model")
    with pytest.raises(ModelServerError, match="does not serve model 'other-model'.*scripted"):
        bound(fast, model).context_window


def test_429_then_200_is_retried_and_answers(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    before = server.count("/v1/chat/completions")
    server.fail("/v1/chat/completions", ("status", 429))
    assert binding.chat([{"role": "user", "content": "hi"}], max_tokens=8, json_schema=SCHEMA) == '{"x": "ok"}'
    assert server.count("/v1/chat/completions") - before == 2


def test_5xx_throughout_gives_up_after_the_retries(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    server.fail("/v1/chat/completions", *[("status", 503)] * 5)
    with pytest.raises(ModelServerError, match="HTTP 503.*after 2 retries"):
        binding.chat([{"role": "user", "content": "hi"}], max_tokens=8)
    assert server.count("/v1/chat/completions") == 3  # the first try and served_retries=2 more


def test_5xx_until_the_deadline_says_the_deadline_stopped_the_retries(fast: WorkerSettings, server) -> None:
    settings = fast.model_copy(update={"served_retries": 20, "served_request_timeout_s": 0.5})
    binding = bound(settings, add_served(settings, "m", server.url, "scripted"))
    server.fail("/v1/chat/completions", *[("status", 503)] * 20)
    with pytest.raises(ModelServerError, match=r"HTTP 503.*0\.5s \(served_request_timeout_s\)") as err:
        binding.chat([{"role": "user", "content": "hi"}], max_tokens=8)
    assert "after 20 retries" not in str(err.value)
    assert server.count("/v1/chat/completions") < 21


def test_a_4xx_is_not_retried(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    server.fail("/v1/chat/completions", ("status", 400))
    with pytest.raises(ModelServerReplyError, match="HTTP 400"):
        binding.chat([{"role": "user", "content": "hi"}], max_tokens=8)
    assert server.count("/v1/chat/completions") == 1


def test_a_server_slower_than_the_timeout_is_a_timeout_error_not_retried(fast: WorkerSettings, server) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.connect()
    server.fail("/v1/chat/completions", ("slow", 3.0))
    with pytest.raises(ModelServerTimeoutError, match="served_read_timeout_s"):
        binding.chat([{"role": "user", "content": "hi"}], max_tokens=8)
    assert server.count("/v1/chat/completions") == 1


@pytest.mark.parametrize("fault, error, message", [
    (("garbage",), ModelServerReplyError, "not JSON"),
    (("huge", 8 * 1024 * 1024 + 1), ModelServerReplyError, "more than 8388608 bytes"),
    (("reply", 200, b"[" * 200_000, {}), ModelServerReplyError, "not JSON"),  # nested past Python's recursion limit
    (("reply", 400, b"[" * 200_000, {}), ModelServerReplyError, "HTTP 400"),  # the same as an error's detail
    (("reply", 200, b"not gzip at all", {"Content-Encoding": "gzip"}), ModelServerReplyError, "could not be decoded"),
])
def test_a_reply_that_is_not_json_or_too_large_is_a_reply_error(fast, server, fault, error, message) -> None:
    server.fail("/v1/models", fault)
    with pytest.raises(error, match=message):
        bound(fast, add_served(fast, "m", server.url, "scripted")).context_window


def test_a_chunk_whose_choices_are_an_object_is_a_reply_error() -> None:
    from emelex_openai.binding import _delta

    with pytest.raises(ModelServerReplyError, match="malformed chunk"):
        _delta({"choices": {"delta": {"content": "x"}}}, "http://127.0.0.1:1")


def test_a_template_with_a_lone_surrogate_has_a_digest(fast: WorkerSettings, server: ScriptedServer) -> None:
    server.template = "{{ .Prompt }}\ud800"  # JSON can carry it; UTF-8 cannot
    identity = bound(fast, add_served(fast, "m", server.url, "scripted")).model_identity
    assert identity["chat_template_sha256"] == hashlib.sha256(b"{{ .Prompt }}\xed\xa0\x80").hexdigest()


def test_a_server_killed_mid_stream_is_a_server_error(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    binding.constraint()
    server.fail("/v1/chat/completions", ("drop", 1))
    with pytest.raises(ModelServerError, match="before it was complete|dropped the connection"):
        binding.stream_chat([{"role": "user", "content": "hi"}], max_tokens=8, json_schema=SCHEMA,
                            stop=threading.Event())


def test_a_server_that_cannot_constrain_is_refused_for_schemas_only(fast: WorkerSettings, server) -> None:
    server.constrain = False
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    with pytest.raises(UnconstrainedServerError, match="does not constrain"):
        binding.chat([{"role": "user", "content": "hi"}], max_tokens=8, json_schema=SCHEMA)
    with pytest.raises(UnconstrainedServerError):
        binding.template_digest  # the agent's snapshot needs it: refused before any Session exists
    assert binding.chat([{"role": "user", "content": "hi"}], max_tokens=8) == "Hello there!"  # free text is fine


def test_stop_interrupts_between_chunks(fast: WorkerSettings, server: ScriptedServer) -> None:
    from emelex_workers.plugin_api import GenerationInterrupted

    server.reply = json.dumps({"x": "a long answer " * 10})
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    stop, pieces = threading.Event(), []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        stop.set()

    with pytest.raises(GenerationInterrupted):
        binding.stream_chat([{"role": "user", "content": "hi"}], max_tokens=64, json_schema=SCHEMA, stop=stop,
                            on_text=on_text)
    assert len(pieces) == 1


def test_progress_uses_reported_usage_and_marks_estimates(fast: WorkerSettings, server: ScriptedServer) -> None:
    binding = bound(fast, add_served(fast, "m", server.url, "scripted"))
    seen = []
    binding.chat([{"role": "user", "content": "hi"}], max_tokens=8, json_schema=SCHEMA, on_token=seen.append)
    assert all(p.estimated for p in seen[:-1]) and seen[-1].estimated is False  # the server reported its usage
    assert (seen[-1].prompt_tokens, seen[-1].generated_tokens) == (11, 3)
    assert binding.tokens_estimated and binding.count_tokens("abcdefg") == 3  # no tokenize endpoint: bytes / 3


# -- the worker: nothing lost ---------------------------------------------------------------------------------


def _distill_job(store: MemoryStore, workspace: Path) -> str:
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    list(lease.replay_all())
    for question, reply in TURNS:
        lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": reply})])
    store.finish_session(lease)  # queues distillation
    return session.id


@pytest.mark.parametrize("fault", ["down", "drop", "slow", "unconstrained"])
def test_a_failing_server_releases_the_job_unconsumed_and_stops_the_run(fast, server, workspace, fault) -> None:
    url = f"http://127.0.0.1:{free_port()}" if fault == "down" else server.url
    model = add_served(fast, "m", url, "scripted")
    server.constrain = fault != "unconstrained"  # the extractive distiller's labels need a schema
    with MemoryStore.open(fast) as store:
        sid = _distill_job(store, workspace)
        server.fail("/v1/chat/completions", *{"down": [], "drop": [("drop", 0)] * 3, "unconstrained": [],
                                              "slow": [("slow", 3.0)] * 3}[fault])
        before = store.replay(sid).events
        with pytest.raises(UnconstrainedServerError if fault == "unconstrained" else ModelServerError):
            work(store, fast, model=model)
        (job,) = store.list_jobs().jobs
        assert job.state == "pending" and job.attempts == 0
        assert "model unavailable, no attempt consumed" in job.diagnostics[-1].message
        assert store.replay(sid).events == before and store.recall(workspace).entries == []
        server.faults.clear()
        server.constrain = True
        if fault != "down":  # the server is back: the same job now completes
            assert work(store, fast, model=model).counts["done"] == 1


# -- the model changed behind a resumed Session -----------------------------------------------------------------


def test_a_resume_against_a_server_reporting_another_digest_is_refused_naming_the_field(
        fast: WorkerSettings, workspace: Path) -> None:
    from tests.support.agent_crash_child import tools_of

    with ScriptedServer(reply=json.dumps(answer("hello"))) as server:
        model = add_served(fast, "m", server.url, "scripted")
        tools = tools_of(fast)

        def snapshot(binding):
            return build_snapshot(binding, tools, model_reference=model.reference,
                                  model_snapshot_id=model.snapshot_id, system_prompt="Test agent.")

        async def create() -> str:
            with MemoryStore.open(fast) as store:
                binding = bound(fast, model)
                agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot(binding),
                                                         model=model)
                result = await agent.turn("hi")
                assert result.outcome == "answer" and result.answer == "hello"
                await agent.close()
                return agent.session_id

        sid = asyncio.run(create())
        server.digest = "sha256:" + "b" * 64  # e.g. `ollama pull` replaced the model behind its name
        before = table_rows(fast.database_path)

        async def resume() -> None:
            with MemoryStore.open(fast) as store:
                binding = bound(fast, model)
                await DurableAgentSession.resume(store, sid, workspace, binding, tools, snapshot(binding), model=model)

        with pytest.raises(SnapshotMismatchError, match="model_identity.digest") as err:
            asyncio.run(resume())
        assert err.value.field == "model_identity.digest"
        after = table_rows(fast.database_path)
        assert {k: v for k, v in after.items() if k != "session_leases"} == \
            {k: v for k, v in before.items() if k != "session_leases"}


def test_emelex_chat_runs_on_a_served_model_and_refuses_a_changed_one(tmp_path: Path, workspace: Path) -> None:
    home = tmp_path / "home"
    with ScriptedServer(reply=json.dumps(answer("hello from the server"))) as server:
        assert cli(home, "models", "add-server", "m", "--url", server.url, "--model", "scripted").returncode == 0
        chat = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--model", "m"], input="hi\n/exit\n",
                              env={**os.environ, "EMELEX_HOME": str(home)}, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        assert chat.returncode == 0, chat.stderr
        assert "hello from the server" in chat.stdout
        with MemoryStore.open(WorkerSettings(home=home)) as store:
            (session,) = store.list_sessions().sessions
            assert [e.kind for e in store.replay(session.id).events] == ["context", "user", "assistant", "audit"]
        server.digest = "sha256:" + "c" * 64
        resumed = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--resume", session.id],
                                 input="/exit\n", env={**os.environ, "EMELEX_HOME": str(home)}, cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 1 and "model_identity.digest" in resumed.stderr
        assert "Traceback" not in resumed.stderr and len(resumed.stderr.strip().splitlines()) == 1


def test_emelex_chat_refuses_a_server_that_cannot_constrain_before_any_session(tmp_path: Path, workspace) -> None:
    home = tmp_path / "home"
    with ScriptedServer(constrain=False) as server:
        assert cli(home, "models", "add-server", "m", "--url", server.url, "--model", "scripted").returncode == 0
        chat = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace), "--model", "m"], input="hi\n",
                              env={**os.environ, "EMELEX_HOME": str(home)}, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    assert chat.returncode == 1 and "does not constrain" in chat.stderr and "Traceback" not in chat.stderr
    if WorkerSettings(home=home).database_path.exists():
        with MemoryStore.open(WorkerSettings(home=home)) as store:
            assert store.list_sessions().sessions == []
