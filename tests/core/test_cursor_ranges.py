"""Positions and cursors out of range (beyond SQLite's 64-bit integers, negative, NaN or infinite) are typed
`InvalidInputError`s through the library and one `error:` line through the CLI, never an `OverflowError` or a
silently empty page, and they change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import InvalidInputError, MemoryStore, Settings
from emelex_workers.cli import app

from ..support import seed_session, table_rows

HUGE = 99999999999999999999
TOO_BIG = 2**63
DIGEST = "0" * 64


@pytest.fixture
def seeded(home: Path, workspace: Path) -> tuple[Settings, str]:
    settings = Settings(home=home)
    with MemoryStore.open(settings) as store:
        sid = seed_session(store, workspace, 8)
        store.remember(workspace, "style", "black")
        store.queue_compaction(sid, context_window=1000, count_tokens=lambda e: 10, force=True)
        store.queue_distillation(sid)
    return settings, sid


def _calls(store: MemoryStore, sid: str, workspace: Path, job_id: str):
    lease = store.acquire_lease(sid, workspace)
    yield "replay huge", lambda: store.replay(sid, HUGE)
    yield "replay 2**63", lambda: store.replay(sid, TOO_BIG)
    yield "replay bool", lambda: store.replay(sid, True)
    yield "lease replay huge", lambda: lease.replay(HUGE)
    yield "compaction source huge", lambda: store.compaction_source(job_id, TOO_BIG)
    for cursor in ("nan:1", "inf:1", "-inf:1", "1e999:1", "1.0:99999999999999999999", "1.0:-5", "1.0:", "x"):
        yield f"sessions {cursor}", lambda c=cursor: store.list_sessions(cursor=c)
    for cursor in (str(HUGE), str(TOO_BIG), "-1", "1.5", " 7"):
        yield f"jobs {cursor}", lambda c=cursor: store.list_jobs(cursor=c)
        yield f"failed jobs {cursor}", lambda c=cursor: store.failed_jobs(cursor=c)
    for cursor in (f"{HUGE}:1:0", f"1:{TOO_BIG}:0", "-1:0:0", "1:1:-1", "1:1"):
        yield f"asset links {cursor}", lambda c=cursor: store.asset_links(DIGEST, cursor=c)
    for cursor in (f"c3R5bGU.{HUGE}", "c3R5bGU.-3", "c3R5bGU.nan"):
        yield f"recall {cursor}", lambda c=cursor: store.recall(workspace, cursor=c)
    yield "history huge", lambda: store.knowledge_history(workspace, "style", HUGE)
    yield "history 2**63", lambda: store.knowledge_history(workspace, "style", TOO_BIG)
    for cursor in ("sha256:zz", "sha256:" + "0" * 63, "sha256:" + "A" * 64):
        yield f"model refs {cursor}", lambda c=cursor: store.session_model_refs(sid, cursor=c)
    yield "knowledge source huge last", lambda: store.knowledge_source(sid, 1, TOO_BIG)
    yield "knowledge source huge first", lambda: store.knowledge_source(sid, HUGE, HUGE)


def test_out_of_range_positions_and_cursors_are_invalid_input_and_change_nothing(
    seeded: tuple[Settings, str], workspace: Path
) -> None:
    settings, sid = seeded
    with MemoryStore.open(settings) as store:
        job_id = store.list_jobs(kind="compaction").jobs[0].id
        before = table_rows(settings.database_path)
        calls = list(_calls(store, sid, workspace, job_id))
        outcomes = {}
        for name, call in calls:
            try:
                call()
                outcomes[name] = "no error"
            except InvalidInputError as exc:
                assert "\n" not in str(exc)
                outcomes[name] = "ok"
            except Exception as exc:  # noqa: BLE001 - the test reports every other outcome by name
                outcomes[name] = f"{type(exc).__name__}: {exc}"
        assert {n: o for n, o in outcomes.items() if o != "ok"} == {}
    after = table_rows(settings.database_path)
    assert len(after["session_leases"]) == 1  # the lease _calls took; nothing else changed
    del before["session_leases"], after["session_leases"]
    assert after == before


def test_valid_cursors_still_page(seeded: tuple[Settings, str], workspace: Path) -> None:
    settings, sid = seeded
    with MemoryStore.open(settings) as store:
        assert store.list_sessions(cursor=f"{1e12!r}:{2**63 - 1}").sessions[0].id == sid
        assert len(store.list_jobs(cursor=str(2**63 - 1)).jobs) == 2
        assert store.replay(sid, 2**63 - 1).events == []
        assert store.session_model_refs(sid, cursor="sha256:" + "f" * 64).refs == []
        assert store.knowledge_history(workspace, "style", 2**63 - 1).versions == []


@pytest.mark.parametrize("args", [
    ["sessions", "list", "--cursor", "nan:1"],
    ["sessions", "list", "--cursor", f"1.0:{HUGE}"],
    ["jobs", "list", "--cursor", str(HUGE)],
    ["jobs", "failed", "--cursor", "-1"],
    ["knowledge", "list", "-w", "{ws}", "--cursor", f"c3R5bGU.{HUGE}"],
])
def test_the_cli_prints_one_error_line(
    seeded: tuple[Settings, str], workspace: Path, home: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    _, sid = seeded
    monkeypatch.setenv("EMELEX_HOME", str(home))
    result = CliRunner().invoke(app, ["memory", *(a.format(sid=sid, ws=workspace) for a in args)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", [
    ["sessions", "show", "{sid}", "--after", str(HUGE)],
    ["sessions", "show", "{sid}", "--after", "-1"],
    ["knowledge", "history", "style", "-w", "{ws}", "--after", str(HUGE)],
])
def test_an_out_of_range_flag_is_a_usage_error_naming_the_flag(
    seeded: tuple[Settings, str], workspace: Path, home: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    _, sid = seeded
    monkeypatch.setenv("EMELEX_HOME", str(home))
    result = CliRunner().invoke(app, ["memory", *(a.format(sid=sid, ws=workspace) for a in args)])
    assert result.exit_code == 2, result.output
    error, hint = result.output.splitlines()
    assert error.startswith("error: Invalid value for '--after'") and "after_seq" not in error
    assert hint == f"try 'emelex memory {' '.join(args[:2])} --help'"
