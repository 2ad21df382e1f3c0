"""The 256 MiB replay media cap holds for the whole replay view, enforced where history is written and replayed.

The cap is lowered to a few hundred bytes for these tests (the code reads it at call time), so real but small
assets stand in for large ones.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    AssetMediaCapError,
    AssetRef,
    CompactionPolicy,
    MemoryStore,
    NewEvent,
    ReplayMediaCapError,
    compaction_handler,
    run_one_job,
)
from emelex_memory.assets import links
from emelex_memory.core.migrations import MIGRATIONS, migrate

from ..support import table_rows

CAP = 100


@pytest.fixture
def low_cap(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(links, "MAX_REPLAY_MEDIA_BYTES", CAP)
    return CAP


def media(store: MemoryStore, i: int, size: int = 40) -> AssetRef:
    return store.put_asset(bytes([i]) * size, "application/octet-stream")


def leased(store: MemoryStore, workspace: Path):
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace, ttl_s=600)
    lease.replay()
    return lease


def test_append_refuses_a_turn_that_would_take_the_replay_over_the_cap(cstore, workspace, db_path, low_cap):
    lease = leased(cstore, workspace)
    lease.append_turn([NewEvent("user", "one", assets=(media(cstore, 1),))])
    lease.append_turn([NewEvent("user", "text only")])
    lease.append_turn([NewEvent("user", "two", assets=(media(cstore, 2),))])  # 80 of 100 bytes
    third = media(cstore, 3)
    before = table_rows(db_path)
    with pytest.raises(AssetMediaCapError, match="120 bytes of media, over the 100 byte replay cap"):
        lease.append_turn([NewEvent("user", "three", assets=(third,))])
    assert table_rows(db_path) == before  # nothing was written
    with pytest.raises(AssetMediaCapError):  # spread over the events of one turn, the same
        lease.append_turn([NewEvent("user", "a", assets=(media(cstore, 4, 10),)),
                           NewEvent("user", "b", assets=(third,))])
    lease.append_turn([NewEvent("user", "fits", assets=(media(cstore, 5, 20),))])  # exactly 100
    assert sum(r.size for e in lease.replay_all() for r in e.assets) == CAP
    lease.release()


def test_a_summary_makes_room_for_more_media(cstore, workspace, low_cap):
    lease = leased(cstore, workspace)
    for i in range(2):
        lease.append_turn([NewEvent("user", f"q{i}", assets=(media(cstore, i),)), NewEvent("assistant", "a")])
    lease.append_turn([NewEvent("user", "last question"), NewEvent("assistant", "last answer")])
    with pytest.raises(AssetMediaCapError):
        lease.append_turn([NewEvent("user", "too much", assets=(media(cstore, 9),))])
    lease.release()
    queued = cstore.queue_compaction(lease.session_id, context_window=1000, policy=CompactionPolicy(preserve_turns=1),
                                     force=True)
    assert queued.job is not None, queued.reason
    assert run_one_job(cstore, compaction_handler(lambda events, job: "a summary"), kinds="compaction").status == "done"
    with cstore.acquire_lease(lease.session_id, workspace) as again:
        view = list(again.replay_all())
        assert [e.kind for e in view] == ["summary", "user", "assistant"]  # the media turns are covered
        again.append_turn([NewEvent("user", "now it fits", assets=(media(cstore, 9), media(cstore, 8)))])
        assert sum(r.size for e in again.replay_all() for r in e.assets) == 80
        with pytest.raises(AssetMediaCapError):
            again.append_turn([NewEvent("user", "but not this", assets=(media(cstore, 7),))])
        again.release()


def test_a_replay_over_the_cap_raises_instead_of_paging_past_it(cstore, workspace, monkeypatch):
    lease = leased(cstore, workspace)  # written under the real cap; the lower cap stands for an altered database
    for i in range(3):
        lease.append_turn([NewEvent("user", f"m{i}", assets=(media(cstore, i),))])
    lease.release()
    monkeypatch.setattr(links, "MAX_REPLAY_MEDIA_BYTES", CAP)
    assert len(cstore.replay(lease.session_id).events) == 2  # one page still ends before the cap
    with cstore.acquire_lease(lease.session_id, workspace) as resumed:
        with pytest.raises(ReplayMediaCapError, match="120 bytes of media, over the 100 byte replay cap"):
            list(resumed.replay_all())
        assert not resumed.replayed
        with pytest.raises(ReplayMediaCapError):  # page by page, as a resume reads, the same
            while not resumed.replay().done:
                pass
        assert not resumed.replayed
        resumed.release()


def test_m008_records_the_running_media_total_of_existing_events(tmp_path: Path) -> None:
    conn = apsw.Connection(str(tmp_path / "old.sqlite3"))
    names = [m.name for m in MIGRATIONS]
    migrate(conn, MIGRATIONS[: names.index("m008_event_media_ends")])
    digest = "ab" * 32
    with conn:
        conn.execute("INSERT INTO sessions (id, uuid, workspace_path, workspace_dev, workspace_ino, created_at, "
                     "updated_at) VALUES (1, 's1', '/w', 1, 2, 10, 10), (2, 's2', '/w', 1, 2, 10, 10)")
        rows = [(1, 1, None), (1, 2, f'[["{digest}",30,"image/png"],["{digest}",30,"text/plain"]]'), (1, 3, None),
                (1, 4, f'[["{digest}",30,"image/png"]]'), (2, 1, f'[["{digest}",30,"image/png"]]')]
        for session, seq, refs in rows:
            conn.execute("INSERT INTO events (session_id, seq, turn, position, kind, payload, size, byte_end, "
                         "created_at, asset_refs) VALUES (?, ?, ?, 0, 'user', 'null', 4, ?, 11, ?)",
                         (session, seq, seq, 4 * seq, refs))
    migrate(conn)
    ends = conn.execute("SELECT session_id, seq, media_end FROM events ORDER BY session_id, seq").fetchall()
    assert ends == [(1, 1, 0), (1, 2, 60), (1, 3, 60), (1, 4, 90), (2, 1, 30)]
    conn.close()
