"""Versioned workspace Knowledge: immutable ordered versions, tombstones, pins, scoping, paging and validation."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path

import apsw
import pytest

from emelex_memory import (
    InvalidInputError,
    InvalidKnowledgeError,
    KnowledgeError,
    KnowledgeForgottenError,
    KnowledgeNotFoundError,
    KnowledgePinnedError,
    KnowledgeSource,
    MemoryStore,
    NewEvent,
    SessionNotFoundError,
    WorkspaceIdentity,
    WorkspaceMissingError,
    WorkspaceReplacedError,
)
from emelex_memory.knowledge.values import MAX_CONTENT_BYTES

from ..support import table_rows


@pytest.fixture
def kstore(cstore):
    return cstore


@pytest.fixture
def other_workspace(tmp_path: Path) -> Path:
    w = tmp_path / "other"
    w.mkdir()
    return w


def history(store: MemoryStore, workspace, key: str) -> list:
    out, after = [], 0
    while True:
        page = store.knowledge_history(workspace, key, after, limit=2)
        out.extend(page.versions)
        after = page.next_cursor
        if page.done:
            return out


def session_with_events(store: MemoryStore, workspace: Path, n_turns: int = 2) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        for i in range(n_turns):
            lease.append_turn([NewEvent("user", {"text": f"q{i}"}), NewEvent("assistant", {"text": f"a{i}"})])
        lease.release()
    return session.id


# -- versions ------------------------------------------------------------------------------


def test_versions_are_appended_in_order_and_the_head_is_newest(kstore, workspace, clock):
    for i, text in enumerate(["tabs", "spaces", "4 spaces"]):
        clock.now += 10
        v = kstore.remember(workspace, "indent", text, confidence=0.5 + i / 10)
        assert v.version == i + 1
    versions = history(kstore, workspace, "indent")
    assert [(v.version, v.content, v.confidence) for v in versions] == [
        (1, "tabs", 0.5),
        (2, "spaces", 0.6),
        (3, "4 spaces", 0.7),
    ]
    assert [v.created_at for v in versions] == sorted(v.created_at for v in versions)
    entry = kstore.get_knowledge(workspace, "indent")
    assert (entry.content, entry.head.version, entry.tombstoned) == ("4 spaces", 3, False)


def test_remembering_the_same_content_appends_nothing(kstore, workspace, db_path):
    kstore.remember(workspace, "k", "v", confidence=0.9)
    before = table_rows(db_path)
    again = kstore.remember(workspace, "k", "v", confidence=0.9)
    assert again.version == 1
    assert table_rows(db_path) == before
    assert kstore.remember(workspace, "k", "v", confidence=0.8).version == 2


def test_versions_are_immutable_in_the_database(kstore, workspace, db_path):
    kstore.remember(workspace, "k", "v1")
    kstore.remember(workspace, "k", "v2")
    before = table_rows(db_path)
    conn = apsw.Connection(str(db_path))
    try:
        for sql in (
            "UPDATE knowledge_versions SET content = 'forged' WHERE version = 1",
            "UPDATE knowledge_versions SET confidence = 0.1",
            "UPDATE knowledge_versions SET version = version + 10",
            "UPDATE knowledge_versions SET source_session_uuid = 'x'",
        ):
            with pytest.raises(apsw.ConstraintError, match="immutable"):
                conn.execute(sql)
    finally:
        conn.close()
    assert table_rows(db_path) == before


def test_recall_hides_tombstones_and_the_tombstone_keeps_confidence_and_source(kstore, workspace):
    sid = session_with_events(kstore, workspace)
    source = kstore.knowledge_source(sid, 1, 4)
    kstore.remember(workspace, "build", "make test", confidence=0.75, source=source)
    kstore.remember(workspace, "keep", "me")
    tomb = kstore.forget(workspace, "build")
    assert tomb.tombstone and tomb.content is None and tomb.version == 2
    assert (tomb.confidence, tomb.source, tomb.origin) == (0.75, source, "user")
    assert [e.key for e in kstore.recall(workspace).entries] == ["keep"]
    every = kstore.recall(workspace, include_tombstones=True).entries
    assert [(e.key, e.tombstoned) for e in every] == [("build", True), ("keep", False)]
    assert kstore.get_knowledge(workspace, "build").tombstoned
    assert history(kstore, workspace, "build")[0].content == "make test"
    revived = kstore.remember(workspace, "build", "make check")
    assert revived.version == 3 and not kstore.get_knowledge(workspace, "build").tombstoned


def test_forgetting_twice_appends_one_tombstone(kstore, workspace):
    kstore.remember(workspace, "k", "v")
    assert kstore.forget(workspace, "k").version == 2
    assert kstore.forget(workspace, "k").version == 2
    assert len(history(kstore, workspace, "k")) == 2


# -- pins ------------------------------------------------------------------------------------


def test_a_pinned_entry_cannot_be_forgotten_until_unpinned(kstore, workspace, db_path):
    kstore.remember(workspace, "k", "v")
    assert kstore.pin(workspace, "k").pinned
    before = table_rows(db_path)
    with pytest.raises(KnowledgePinnedError, match="unpin"):
        kstore.forget(workspace, "k")
    assert table_rows(db_path) == before
    assert kstore.remember(workspace, "k", "corrected").version == 2  # the user may still correct it
    assert not kstore.unpin(workspace, "k").pinned
    assert kstore.forget(workspace, "k").tombstone


def test_a_writer_that_leaves_pins_to_the_user_is_refused_inside_the_transaction(kstore, workspace, db_path):
    """`unless_pinned` (another agent's write through `emelex mcp`): the pin is read in the writing transaction, so a
    pin the user sets between a client's look and its write still stops the write."""
    kstore.remember(workspace, "k", "v")
    assert kstore.remember(workspace, "k", "v2", unless_pinned=True).version == 2
    kstore.pin(workspace, "k")
    before = table_rows(db_path)
    with pytest.raises(KnowledgePinnedError, match="pinned"):
        kstore.remember(workspace, "k", "an agent's rewrite", unless_pinned=True, client="agent 1.0")
    assert table_rows(db_path) == before


def test_a_forgotten_entry_cannot_be_pinned(kstore, workspace, db_path):
    kstore.remember(workspace, "k", "v")
    kstore.forget(workspace, "k")
    before = table_rows(db_path)
    with pytest.raises(KnowledgeForgottenError, match="forgotten; remember it again") as raised:
        kstore.pin(workspace, "k")
    assert not isinstance(raised.value, KnowledgeNotFoundError)  # the entry exists: the remedy is to remember it
    assert "remember" in KnowledgeForgottenError.__doc__ and isinstance(raised.value, KnowledgeError)
    assert table_rows(db_path) == before


# -- workspace scoping ----------------------------------------------------------------------------


def test_knowledge_of_workspace_a_is_invisible_from_workspace_b(kstore, workspace, other_workspace, db_path):
    kstore.remember(workspace, "secret", "only for A")
    assert kstore.recall(other_workspace).entries == []
    assert kstore.recall(other_workspace, include_tombstones=True).entries == []
    before = table_rows(db_path)
    for call in (kstore.get_knowledge, kstore.forget, kstore.pin, kstore.unpin):
        with pytest.raises(KnowledgeNotFoundError):
            call(other_workspace, "secret")
    with pytest.raises(KnowledgeNotFoundError):
        kstore.knowledge_history(other_workspace, "secret")
    assert table_rows(db_path) == before
    kstore.remember(other_workspace, "secret", "B's own")
    assert kstore.get_knowledge(workspace, "secret").content == "only for A"


def test_scope_is_the_directory_identity_not_its_spelling(kstore, workspace, tmp_path):
    kstore.remember(workspace, "k", "v")
    link = tmp_path / "link"
    link.symlink_to(workspace)
    assert [e.key for e in kstore.recall(link).entries] == ["k"]
    renamed = tmp_path / "renamed"
    os.rename(workspace, renamed)
    assert kstore.get_knowledge(renamed, "k").content == "v"
    workspace.mkdir()  # a new directory at the old path is another workspace, not shown as an empty one
    with pytest.raises(WorkspaceReplacedError, match="last seen at this path .*moved away"):
        kstore.recall(workspace)
    kstore.remember(workspace, "other", "w", new_workspace=True)
    assert [e.key for e in kstore.recall(workspace).entries] == ["other"]
    assert [e.key for e in kstore.recall(renamed).entries] == ["k"]


def test_a_stale_identity_writes_nothing(kstore, workspace, tmp_path, db_path):
    ident = WorkspaceIdentity.inspect(workspace)
    kstore.remember(ident, "k", "v")
    os.rename(workspace, tmp_path / "moved")
    workspace.mkdir()  # same path, different directory
    before = table_rows(db_path)
    with pytest.raises(WorkspaceReplacedError, match="nothing was written"):
        kstore.remember(ident, "k", "v2")
    with pytest.raises(WorkspaceReplacedError):
        kstore.forget(ident, "k")
    with pytest.raises(WorkspaceReplacedError):
        kstore.pin(ident, "k")
    os.rmdir(workspace)
    with pytest.raises(WorkspaceMissingError):
        kstore.remember(ident, "k", "v2")
    assert table_rows(db_path) == before


def test_a_foreign_identity_writes_nothing(kstore, workspace, other_workspace, db_path):
    kstore.remember(workspace, "k", "v")
    a, b = WorkspaceIdentity.inspect(workspace), WorkspaceIdentity.inspect(other_workspace)
    forged = WorkspaceIdentity(b.path, a.device, a.inode)  # A's identity claimed for B's path
    before = table_rows(db_path)
    with pytest.raises(WorkspaceReplacedError):
        kstore.remember(forged, "k", "overwritten from B")
    with pytest.raises(WorkspaceReplacedError):
        kstore.forget(forged, "k")
    with pytest.raises(KnowledgeNotFoundError):
        kstore.forget(b, "k")
    assert table_rows(db_path) == before


def test_the_workspace_is_rechecked_inside_the_writing_transaction(kstore, workspace, tmp_path, db_path, monkeypatch):
    ident = WorkspaceIdentity.inspect(workspace)
    kstore.remember(ident, "k", "v")
    before = table_rows(db_path)
    original = kstore.db.write

    @contextmanager
    def swap_then_write():
        os.rename(workspace, tmp_path / "swapped-away")  # the preflight already passed
        workspace.mkdir()
        with original() as conn:
            yield conn

    monkeypatch.setattr(kstore.db, "write", swap_then_write)
    with pytest.raises(WorkspaceReplacedError):
        kstore.remember(ident, "k", "raced")
    monkeypatch.undo()
    assert table_rows(db_path) == before


# -- provenance -------------------------------------------------------------------------------


def test_provenance_is_verified_against_the_transcript(kstore, workspace, other_workspace, db_path):
    sid = session_with_events(kstore, workspace)
    good = kstore.knowledge_source(sid, 1, 2)
    foreign_sid = session_with_events(kstore, other_workspace)
    before = table_rows(db_path)
    bad = [
        (KnowledgeSource(sid, 1, 2, "0" * 64), InvalidKnowledgeError, "digest does not match"),
        (KnowledgeSource(sid, 1, 9, good.digest), InvalidKnowledgeError, "ends at"),
        (KnowledgeSource(sid, 3, 2, good.digest), InvalidKnowledgeError, "empty"),
        (KnowledgeSource(sid, 1, 2, "XYZ"), InvalidKnowledgeError, "64 lowercase hex"),
        (KnowledgeSource("no-such-session", 1, 2, good.digest), SessionNotFoundError, "does not exist"),
        (kstore.knowledge_source(foreign_sid, 1, 2), InvalidKnowledgeError, "another workspace"),
        (("tuple", 1, 2, good.digest), InvalidKnowledgeError, "KnowledgeSource"),
    ]
    for source, error, message in bad:
        with pytest.raises(error, match=message):
            kstore.remember(workspace, "k", "v", source=source)
    assert table_rows(db_path) == before
    v = kstore.remember(workspace, "k", "v", source=good)
    assert v.source == good and not v.source.session_deleted


def test_knowledge_source_refuses_missing_or_oversized_ranges(kstore, workspace):
    sid = session_with_events(kstore, workspace)
    with pytest.raises(InvalidKnowledgeError, match="no events"):
        kstore.knowledge_source(sid, 3, 5)
    with pytest.raises(SessionNotFoundError):
        kstore.knowledge_source("nope", 1, 1)
    kstore.settings.knowledge_source_max_bytes = 10  # a tiny cap for this store only
    with pytest.raises(InvalidKnowledgeError, match="knowledge_source_max_bytes"):
        kstore.knowledge_source(sid, 1, 4)


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, content, confidence",
    [
        ("", "v", 1.0),
        (" padded", "v", 1.0),
        ("new\nline", "v", 1.0),
        ("k" * 257, "v", 1.0),
        ("\ud800", "v", 1.0),
        (7, "v", 1.0),
        ("k", "", 1.0),
        ("k", "   ", 1.0),
        ("k", "x" * (MAX_CONTENT_BYTES + 1), 1.0),
        ("k", b"bytes", 1.0),
        ("k", "v", 1.5),
        ("k", "v", -0.1),
        ("k", "v", math.nan),
        ("k", "v", True),
        ("k", "v", "0.5"),
    ],
)
def test_invalid_input_is_refused_and_writes_nothing(kstore, workspace, db_path, key, content, confidence):
    before = table_rows(db_path)
    with pytest.raises(InvalidKnowledgeError):
        kstore.remember(workspace, key, content, confidence=confidence)
    assert table_rows(db_path) == before


def test_limits_of_key_and_content_are_inclusive(kstore, workspace):
    key = "é" * 128  # 256 UTF-8 bytes
    assert kstore.remember(workspace, key, "x" * MAX_CONTENT_BYTES, confidence=0).version == 1
    assert kstore.get_knowledge(workspace, key).confidence == 0.0


# -- paging ----------------------------------------------------------------------------------------


def test_active_pages_use_a_stable_cursor_that_survives_concurrent_changes(kstore, workspace):
    keys = [f"key-{i:02d}" for i in range(25)]
    for key in reversed(keys):
        kstore.remember(workspace, key, f"value of {key}")
    seen, cursor = [], None
    while True:
        page = kstore.recall(workspace, cursor=cursor, limit=7)
        assert len(page.entries) <= 7
        seen.extend(e.key for e in page.entries)
        if len(seen) == 7:
            kstore.remember(workspace, "key-00", "changed behind the cursor")
            kstore.remember(workspace, "key-03", "changed behind the cursor")
            kstore.forget(workspace, "key-20")
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [k for k in keys if k != "key-20"]


def test_pages_are_bounded_in_bytes(kstore, workspace):
    for i in range(5):
        kstore.remember(workspace, f"k{i}", "x" * MAX_CONTENT_BYTES)
    floor = 256 + MAX_CONTENT_BYTES + 256
    page = kstore.recall(workspace, max_bytes=2 * floor)
    assert len(page.entries) == 2 and page.next_cursor
    page = kstore.recall(workspace, max_bytes=floor, cursor=page.next_cursor)
    assert [e.key for e in page.entries] == ["k2"]
    with pytest.raises(InvalidInputError):
        kstore.recall(workspace, max_bytes=floor - 1)
    with pytest.raises(InvalidInputError):
        kstore.recall(workspace, limit=0)


def test_bad_cursors_are_refused(kstore, workspace):
    for cursor in ("garbage", "!!!.1", "a2V5.notanint", 5):
        with pytest.raises(InvalidInputError):
            kstore.recall(workspace, cursor=cursor)
    with pytest.raises(InvalidInputError):
        kstore.knowledge_history(workspace, "k", -1)


def test_history_uses_an_exclusive_monotonic_cursor(kstore, workspace):
    for i in range(7):
        kstore.remember(workspace, "k", f"v{i}")
    page = kstore.knowledge_history(workspace, "k", 0, limit=3)
    assert [v.version for v in page.versions] == [1, 2, 3] and not page.done
    page = kstore.knowledge_history(workspace, "k", page.next_cursor, limit=3)
    assert [v.version for v in page.versions] == [4, 5, 6] and not page.done
    page = kstore.knowledge_history(workspace, "k", page.next_cursor, limit=3)
    assert [v.version for v in page.versions] == [7] and page.done and page.next_cursor == 7
    assert kstore.knowledge_history(workspace, "k", 7).versions == []
