"""`delete_session`: transactional, refuses busy Sessions, keeps Knowledge audit fields, drops unreferenced assets."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from emelex_memory import (
    MemoryStore,
    NewEvent,
    SessionBusyError,
    SessionNotFoundError,
)
from emelex_memory.job_kinds import builtin_kinds
from emelex_memory.maintenance import deletion as deletion_module

from ..support import Clock, kinds_fixture, table_rows

KINDS = builtin_kinds()
KINDS.register("noop")  # a test-only kind: a claim on the Session, not compaction

kinds = kinds_fixture(KINDS)


@pytest.fixture
def clock() -> Clock:
    """Starting at the real time (asset files age by their real timestamps)."""
    return Clock(time.time())


@pytest.fixture
def dstore(cstore):
    return cstore


def seed(store: MemoryStore, workspace: Path, *turns: list[NewEvent]) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for events in turns:
            lease.append_turn(events)
        lease.release()
    return session.id


def say(text: str, *assets) -> list[NewEvent]:
    return [NewEvent("user", {"text": text}, assets=tuple(assets))]


def test_deleting_a_source_session_keeps_the_knowledge_audit_fields(dstore, workspace):
    sid = seed(dstore, workspace, say("we use tabs"), say("really"))
    source = dstore.knowledge_source(sid, 1, 2)
    dstore.remember(workspace, "indent", "tabs", confidence=0.7, source=source)
    dstore.remember(workspace, "other", "unrelated")
    deletion = dstore.delete_session(sid)
    assert (deletion.events, deletion.knowledge_versions_detached) == (2, 1)
    with pytest.raises(SessionNotFoundError):
        dstore.get_session(sid)
    head = dstore.get_knowledge(workspace, "indent").head
    assert head.content == "tabs" and head.confidence == 0.7
    assert (head.source.session_id, head.source.first_seq, head.source.last_seq, head.source.digest) == (
        sid, 1, 2, source.digest,
    )
    assert head.source.session_deleted
    tomb = dstore.forget(workspace, "indent")  # the tombstone carries the audit fields on
    assert tomb.source == head.source


def test_a_live_lease_or_worker_claim_refuses_deletion(dstore, workspace, db_path, clock):
    sid = seed(dstore, workspace, say("hi"))
    lease = dstore.acquire_lease(sid, workspace, ttl_s=60)
    before = table_rows(db_path)
    with pytest.raises(SessionBusyError, match="leased"):
        dstore.delete_session(sid)
    assert table_rows(db_path) == before
    lease.release()
    dstore.enqueue_job("noop", sid, {"test": 1})
    claim = dstore.claim_job("noop", ttl_s=60)
    before = table_rows(db_path)
    with pytest.raises(SessionBusyError, match="jobs cancel"):
        dstore.delete_session(sid)
    assert table_rows(db_path) == before
    clock.now += 61  # the worker's lease expired: it no longer holds authority
    assert dstore.delete_session(sid).jobs == 1
    claim.ended = True


def test_an_expired_session_lease_does_not_block_deletion(dstore, workspace, clock):
    sid = seed(dstore, workspace, say("hi"))
    dstore.acquire_lease(sid, workspace, ttl_s=5)
    clock.now += 6
    assert dstore.delete_session(sid).events == 1


def test_assets_only_the_deleted_session_referenced_are_removed(dstore, workspace, clock):
    shared = dstore.put_asset(b"shared bytes", "image/png")
    own = dstore.put_asset(b"only in the deleted Session" * 100, "image/png")
    keeper = seed(dstore, workspace, say("keep", shared))
    clock.now += 10
    doomed = seed(dstore, workspace, say("a", shared, own), say("b", own))
    clock.now += 3601  # past the asset grace period
    deletion = dstore.delete_session(doomed)
    assert (deletion.asset_entries, deletion.asset_files, deletion.asset_bytes) == (1, 1, own.size)
    assert not os.path.exists(dstore.asset_dir / own.digest)
    assert dstore.read_asset(shared) == b"shared bytes"
    assert [e.assets for e in dstore.replay(keeper).events] == [(shared,)]


def test_deletion_keeps_an_asset_another_writer_put_within_the_grace_period(dstore, workspace, clock, db_path):
    linked = dstore.put_asset(b"once linked by the doomed Session", "image/png")
    doomed = seed(dstore, workspace, say("look", linked))
    clock.now += 100
    again = dstore.put_asset(b"once linked by the doomed Session", "image/png")  # another writer, about to link it
    clock.now += 100
    with dstore.acquire_lease(doomed, workspace) as lease:  # the Session is updated after that put
        lease.replay()
        lease.append_turn(say("later"))
        lease.release()
    clock.now += 100
    deletion = dstore.delete_session(doomed)
    assert (deletion.asset_entries, deletion.asset_files) == (0, 0)
    assert [row[0] for row in table_rows(db_path)["assets"]] == [again.digest]
    assert dstore.read_asset(again) == b"once linked by the doomed Session"
    other = seed(dstore, workspace, say("mine now", again))
    assert [e.assets for e in dstore.replay(other).events] == [(again,)]


def test_unknown_sessions_are_refused(dstore, db_path):
    before = table_rows(db_path)
    with pytest.raises(SessionNotFoundError):
        dstore.delete_session("no-such-session")
    assert table_rows(db_path) == before


def test_deletion_is_one_transaction(dstore, workspace, db_path, monkeypatch):
    sid = seed(dstore, workspace, say("x", dstore.put_asset(b"blob", "image/png")))
    before = table_rows(db_path)

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure after the DELETE")

    monkeypatch.setattr(deletion_module, "collect_entries", boom)  # runs after the Session's DELETE
    with pytest.raises(RuntimeError):
        dstore.delete_session(sid)
    assert table_rows(db_path) == before


# -- CLI ---------------------------------------------------------------------------------------


def test_cli_sessions_delete(monkeypatch, home, workspace):
    from typer.testing import CliRunner

    from emelex_memory import Settings
    from emelex_workers.cli import app

    monkeypatch.setenv("EMELEX_HOME", str(home))
    runner = CliRunner()
    with MemoryStore.open(Settings(), kinds=KINDS) as store:
        sid = seed(store, workspace, say("hello"))
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    declined = runner.invoke(app, ["memory", "sessions", "delete", sid], input="n\n")
    assert declined.exit_code == 1 and table_rows(db) == before
    done = runner.invoke(app, ["memory", "sessions", "delete", sid], input="y\n")
    assert done.exit_code == 0 and f"deleted Session {sid}: 1 events" in done.output
    again = runner.invoke(app, ["memory", "sessions", "delete", sid, "--yes"])
    assert again.exit_code == 1 and again.output.startswith("error: no Session")


def test_a_compacted_session_with_a_summary_can_be_deleted(dstore, workspace):
    from emelex_memory import CompactionPolicy, compaction_handler, run_one_job

    sid = seed(dstore, workspace, *[say(f"turn {i}") for i in range(6)])
    queued = dstore.queue_compaction(sid, context_window=1000, policy=CompactionPolicy(preserve_turns=1), force=True)
    assert queued.created
    outcome = run_one_job(dstore, compaction_handler(lambda events, job: "a summary"), kinds="compaction")
    assert outcome.status == "done"
    assert any(e.kind == "summary" for e in dstore.replay(sid).events)
    deletion = dstore.delete_session(sid)
    assert deletion.jobs == 1 and deletion.events == 7
