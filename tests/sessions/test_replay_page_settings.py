"""Replay never loops: a stored event larger than a page may now hold (page_bytes or max_event_bytes lowered after it
was written) is a typed error naming the event and the setting, from every paging loop, and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import (
    COMPACTION_KIND,
    MemoryStore,
    NewEvent,
    PageTooSmallError,
    Settings,
    SummaryDraft,
)
from emelex_memory.core.settings import MiB
from emelex_workers.cli import app

from emelex_memory.compaction import planning
from emelex_memory.sessions import leases, replay, service

from ..support import seed_session, table_rows

BIG = int(2.5 * MiB)  # one event's payload: over a 2 MiB page, within the 3 MiB event cap it was written with
MAX_PAGES = 50  # a paging loop that asks for more pages than this is looping


def _written_with_big_events(home: Path) -> Settings:
    return Settings(home=home, max_event_bytes=3 * MiB, max_turn_bytes=3 * MiB)


def _lowered(home: Path) -> Settings:
    return Settings(home=home, page_bytes=2 * MiB)


def _seed(settings: Settings, workspace: Path) -> str:
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            lease.append_turn([NewEvent("user", {"text": "small"})])
            lease.append_turn([NewEvent("user", {"text": "x" * BIG})])
            for i in range(4):
                lease.append_turn([NewEvent("user", {"text": f"q{i}"}), NewEvent("assistant", {"text": f"a{i}"})])
            lease.release()
    return session.id


def _count_pages(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail (instead of hanging) when a paging loop asks for more than MAX_PAGES pages."""
    real, calls = replay.replay_page, []

    def counted(*args, **kwargs):
        calls.append(1)
        assert len(calls) <= MAX_PAGES, "the paging loop does not progress"
        return real(*args, **kwargs)

    for module in (service, leases, planning):  # every module that reads replay pages
        monkeypatch.setattr(module, "replay_page", counted)


def _assert_names_event_and_setting(exc: PageTooSmallError, session_id: str, seq: int, limit: int) -> None:
    message = str(exc)
    assert f"event seq {seq} of Session {session_id}" in message
    assert f"more than this page may hold ({limit} bytes)" in message
    assert "EMELEX_PAGE_BYTES" in message and "\n" not in message


@pytest.fixture
def sid(home: Path, workspace: Path) -> str:
    return _seed(_written_with_big_events(home), workspace)


def test_replay_with_a_lowered_page_size_is_a_typed_error_and_changes_nothing(
    home: Path, workspace: Path, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _lowered(home)
    before = table_rows(settings.database_path)
    with MemoryStore.open(settings) as store:
        _count_pages(store, monkeypatch)
        page = store.replay(sid)
        assert [e.seq for e in page.events] == [1] and not page.done  # the event before the big one still shows
        with pytest.raises(PageTooSmallError) as raised:
            store.replay(sid, page.next_cursor)
        _assert_names_event_and_setting(raised.value, sid, 2, 2 * MiB)
        with store.acquire_lease(sid, workspace) as lease:
            with pytest.raises(PageTooSmallError):
                list(lease.replay_all())
            assert not lease.replayed
            with pytest.raises(PageTooSmallError):
                store.plan_compaction(sid, context_window=1000)
            lease.release()
    after = table_rows(settings.database_path)
    del before["session_leases"], after["session_leases"]  # the lease taken above; nothing else may change
    assert after == before


def test_an_explicit_max_bytes_below_a_stored_event_is_a_typed_error(home: Path, workspace: Path) -> None:
    sid = _seed(_written_with_big_events(home), workspace)
    with MemoryStore.open(Settings(home=home, max_event_bytes=MiB)) as store:
        with pytest.raises(PageTooSmallError) as raised:
            store.replay(sid, 1, max_bytes=2 * MiB)
        _assert_names_event_and_setting(raised.value, sid, 2, 2 * MiB)
        assert store.replay(sid, 1, max_bytes=3 * MiB).events[0].seq == 2  # a larger page reads it


def test_sessions_show_reports_it_in_one_line(
    home: Path, sid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_PAGE_BYTES", str(2 * MiB))
    result = CliRunner().invoke(app, ["memory", "sessions", "show", sid, "--after", "1"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: event seq 2 of Session {sid} holds ")
    assert result.output.count("\n") == 1 and "Traceback" not in result.output


def _compacted_with_a_big_summary(home: Path, workspace: Path) -> tuple[str, str]:
    """A Session whose Summary event is larger than 2 MiB, and a compaction job planned on top of that Summary."""
    settings = _written_with_big_events(home)
    with MemoryStore.open(settings) as store:
        sid = seed_session(store, workspace, 8)
        store.queue_compaction(sid, context_window=1000, count_tokens=lambda e: 10, force=True)
        with store.claim_job(kinds=COMPACTION_KIND) as claim:
            claim.complete(SummaryDraft("s" * BIG))
        with store.acquire_lease(sid, workspace) as lease:
            lease.replay()
            for i in range(8):
                lease.append_turn([NewEvent("user", {"text": f"r{i}"}), NewEvent("assistant", {"text": f"b{i}"})])
            lease.release()
        queued = store.queue_compaction(sid, context_window=1000, count_tokens=lambda e: 10, force=True)
        assert queued.job is not None and queued.job.source["base_summary_id"] is not None, queued.reason
    return sid, queued.job.id


def test_a_summary_larger_than_the_page_is_a_typed_error_in_replay_and_compaction_sources(
    home: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid, job_id = _compacted_with_a_big_summary(home, workspace)
    with MemoryStore.open(_lowered(home)) as store:
        _count_pages(store, monkeypatch)
        with pytest.raises(PageTooSmallError) as raised:
            store.replay(sid)
        assert f"of Session {sid} holds " in str(raised.value)
        with pytest.raises(PageTooSmallError):
            store.compaction_source(job_id)
        with pytest.raises(PageTooSmallError):
            store.read_compaction_source(store.get_job(job_id))
        with pytest.raises(PageTooSmallError):
            store.plan_compaction(sid, context_window=1000)


def test_a_distillation_source_with_a_lowered_page_size_is_a_typed_error(home: Path, workspace: Path) -> None:
    sid = _seed(_written_with_big_events(home), workspace)
    with MemoryStore.open(_lowered(home)) as store:
        job = store.queue_distillation(sid).job
        with pytest.raises(PageTooSmallError) as raised:
            store.read_distillation_source(job)
        _assert_names_event_and_setting(raised.value, sid, 2, 2 * MiB)
