"""Assets on transcript events: transactional links in append_turn, verified and capped replay."""

from __future__ import annotations

import json
import os
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    MAX_REPLAY_MEDIA_BYTES,
    AssetLinkMismatchError,
    AssetMediaCapError,
    AssetMismatchError,
    AssetMissingError,
    AssetNotFoundError,
    AssetRef,
    AssetTamperedError,
    InvalidAssetError,
    MemoryStore,
    NewEvent,
    SessionLease,
)

from ..support import table_rows

MiB = 1024 * 1024


@pytest.fixture
def lease(store: MemoryStore, workspace: Path):
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    lease.replay()
    yield lease
    lease.close()


def _raw(db: Path) -> apsw.Connection:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READWRITE)
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def test_assets_are_linked_and_replayed_in_order(store: MemoryStore, lease: SessionLease) -> None:
    png = store.put_asset(b"png bytes", "image/png")
    wav = store.put_asset(b"wav bytes", "audio/wav")
    turn = lease.append_turn([
        NewEvent("user", {"text": "look"}, assets=(png, wav, png)),
        NewEvent("assistant", {"text": "seen"}),
    ])
    lease.append_turn([NewEvent("tool_result", {"ok": True}, assets=[wav])])
    events = list(lease.replay_all())
    assert [e.assets for e in events] == [(png, wav, png), (), (wav,)]
    assert events[1].asset_refs is None
    assert {e.ref: e.links for e in store.list_assets().assets} == {png: 2, wav: 2}
    links = store.asset_links(png.digest)
    assert links.next_cursor is None
    assert [(x.session_id, x.seq, x.ordinal) for x in links.links] == [(lease.session_id, turn.first_seq, 0),
                                                                       (lease.session_id, turn.first_seq, 2)]
    first = store.asset_links(png.digest, limit=1)
    assert first.links == links.links[:1] and first.next_cursor
    second = store.asset_links(png.digest, cursor=first.next_cursor, limit=1)
    assert second.links == links.links[1:] and second.next_cursor is None
    page = store.replay(lease.session_id, 0, limit=1)
    assert page.events[0].assets == (png, wav, png) and not page.done


@pytest.mark.parametrize("problem", ["uncatalogued", "wrong size", "wrong kind", "file gone", "file damaged",
                                     "not a ref"])
def test_a_turn_linking_a_bad_ref_commits_nothing(
    store: MemoryStore, lease: SessionLease, db_path: Path, problem: str
) -> None:
    good = store.put_asset(b"good", "text/plain")
    bad = store.put_asset(b"bad", "text/plain")
    lease.append_turn([NewEvent("user", "before")])
    expected_error: type[Exception]
    if problem == "uncatalogued":
        ref, expected_error = AssetRef("0" * 64, 3, "text/plain"), AssetNotFoundError
    elif problem == "wrong size":
        ref, expected_error = AssetRef(bad.digest, 4, "text/plain"), AssetMismatchError
    elif problem == "wrong kind":
        ref, expected_error = AssetRef(bad.digest, 3, "text/html"), AssetNotFoundError
    elif problem == "file gone":
        (store.asset_dir / bad.digest).unlink()
        ref, expected_error = bad, AssetMissingError
    elif problem == "file damaged":
        os.chmod(store.asset_dir / bad.digest, 0o640)
        ref, expected_error = bad, AssetTamperedError
    else:
        ref, expected_error = (bad.digest, 3, "text/plain"), InvalidAssetError
    rows, cursor = table_rows(db_path), lease.cursor
    with pytest.raises(expected_error):
        lease.append_turn([NewEvent("user", "first", assets=(good,)), NewEvent("user", "second", assets=(good, ref))])
    assert table_rows(db_path) == rows and lease.cursor == cursor
    lease.append_turn([NewEvent("user", "after", assets=(good,))])  # the lease is still usable
    assert [e.assets for e in lease.replay_all()] == [(), (good,)]


def test_event_asset_count_and_per_event_media_are_capped(
    store: MemoryStore, lease: SessionLease, db_path: Path
) -> None:
    ref = store.put_asset(b"tiny", "text/plain")
    rows = table_rows(db_path)
    with pytest.raises(InvalidAssetError, match="at most 64"):
        lease.append_turn([NewEvent("user", "many", assets=(ref,) * 65)])
    huge = AssetRef("1" * 64, 100 * MiB, "video/mp4")  # the cap is checked before the catalog
    with pytest.raises(AssetMediaCapError, match="replay cap"):
        lease.append_turn([NewEvent("user", "too much", assets=(huge, huge, huge))])
    assert table_rows(db_path) == rows


def test_appends_keep_the_whole_replay_within_the_aggregate_media_cap(
    store: MemoryStore, lease: SessionLease, db_path: Path
) -> None:
    big = store.put_asset((bytes(MiB) for _ in range(100)), "video/mp4")
    small = store.put_asset(b"note", "text/plain")
    lease.append_turn([NewEvent("user", "two videos", assets=(big, big)), NewEvent("user", "text", assets=(small,))])
    rows = table_rows(db_path)
    with pytest.raises(AssetMediaCapError, match="over the 268435456 byte replay cap"):
        lease.append_turn([NewEvent("user", "one more", assets=(big,))])  # 300 MiB in one replay: refused
    assert table_rows(db_path) == rows
    events = list(lease.replay_all())
    assert [e.seq for e in events] == [1, 2]
    assert sum(r.size for e in events for r in e.assets) <= MAX_REPLAY_MEDIA_BYTES


def test_replay_refuses_an_event_over_the_cap_written_behind_its_back(
    store: MemoryStore, lease: SessionLease, db_path: Path
) -> None:
    lease.append_turn([NewEvent("user", "plain")])
    digest = "2" * 64
    refs = [[digest, 128 * MiB, "video/mp4"]] * 3
    conn = _raw(db_path)
    with conn:
        conn.execute("INSERT INTO assets (digest, media_kind, size, created_at, touched_at) VALUES (?, ?, ?, 0, 0)",
                     (digest, "video/mp4", 128 * MiB))
        conn.execute("UPDATE events SET asset_refs = ? WHERE seq = 1", (json.dumps(refs),))
        conn.executemany("INSERT INTO event_assets VALUES (?, 1, ?, ?, 'video/mp4')",
                         [(1, i, digest) for i in range(3)])
    conn.close()
    with pytest.raises(AssetLinkMismatchError, match="over the"):
        store.replay(lease.session_id)


_TAMPERING = {
    "link deleted": "DELETE FROM event_assets WHERE ordinal = 1",
    "every link of the page deleted": "DELETE FROM event_assets",
    "link points at another kind": "UPDATE event_assets SET media_kind = 'text/html' WHERE ordinal = 0",
    "link ordinals swapped": "UPDATE event_assets SET ordinal = 5 - ordinal WHERE seq = 1",
    "stray link on an asset-free event": "INSERT INTO event_assets SELECT session_id, 2, 0, digest, media_kind "
                                         "FROM event_assets WHERE seq = 1 AND ordinal = 0",
    "recorded refs dropped": "UPDATE events SET asset_refs = NULL WHERE seq = 1",
    "recorded ref rewritten": "UPDATE events SET asset_refs = replace(asset_refs, 'text/plain', 'text/html')",
    "recorded refs malformed": "UPDATE events SET asset_refs = '[[1,2]]' WHERE seq = 1",
    "catalog size changed": "UPDATE assets SET size = size + 1 WHERE media_kind = 'text/plain'",
}


@pytest.mark.parametrize("tampering", sorted(_TAMPERING))
def test_replay_verifies_links_against_the_events_and_catalog(
    store: MemoryStore, lease: SessionLease, db_path: Path, tampering: str
) -> None:
    text = store.put_asset(b"text", "text/plain")
    store.put_asset(b"text", "text/html")
    png = store.put_asset(b"png", "image/png")
    lease.append_turn([NewEvent("user", "with assets", assets=(text, png)), NewEvent("assistant", "without")])
    assert [e.assets for e in store.replay(lease.session_id).events] == [(text, png), ()]
    conn = _raw(db_path)
    with conn:
        conn.execute("DROP TRIGGER event_assets_counted")  # a hand edit does not keep the counters either
        conn.execute("DROP TRIGGER event_assets_uncounted")
        conn.execute(_TAMPERING[tampering])
    conn.close()
    with pytest.raises(AssetLinkMismatchError, match="event seq [12]"):
        store.replay(lease.session_id)


def test_deleting_a_session_unlinks_its_assets(store: MemoryStore, lease: SessionLease, db_path: Path) -> None:
    ref = store.put_asset(b"shared", "text/plain")
    lease.append_turn([NewEvent("user", "a", assets=(ref, ref))])
    assert store.asset_entries(ref.digest).assets[0].links == 2
    assert store.collect_assets(grace_s=0).removed_entries == 0  # referenced: never collected
    lease.release()
    conn = _raw(db_path)
    with conn:
        conn.execute("DELETE FROM sessions")
    conn.close()
    assert store.asset_entries(ref.digest).assets[0].links == 0
    assert store.collect_assets(grace_s=0).removed_files == 1
