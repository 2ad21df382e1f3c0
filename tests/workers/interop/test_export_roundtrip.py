"""An export read back into a fresh Home is the same store, event for event and version for version: compacted
Sessions (a chain of two Summaries, verified on replay), assets, tombstones, pins, provenance and the client that
wrote a version. A second import changes nothing; an import into a store whose event IDs are taken re-anchors the
Summaries' provenance, and they still verify."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emelex_memory import (
    COMPACTION_KIND,
    Event,
    ExportedEvent,
    ExportedSession,
    MemoryStore,
    NewEvent,
    Settings,
    compaction_handler,
    run_one_job,
)
from emelex_workers.interop.export_file import import_export, write_export

WINDOW = 2000


def tokens(event: Event) -> int:
    return 100


def summarize(events: list[Event], job) -> str:
    return "summary of " + ",".join(str(e.seq) for e in events)


def add_turns(store: MemoryStore, session_id: str, workspace: Path, n: int, label: str, assets=()) -> None:
    with store.acquire_lease(session_id, workspace) as lease:
        list(lease.replay_all())
        for i in range(n):
            lease.append_turn([NewEvent("user", {"text": f"{label}{i} question", "n": 1.5e-7}, assets=assets),
                               NewEvent("assistant", {"text": f"{label}{i} answer é"})])
        lease.release()


def compact(store: MemoryStore, session_id: str) -> None:
    queued = store.queue_compaction(session_id, context_window=WINDOW, count_tokens=tokens, force=True)
    assert queued.job is not None, queued.reason
    outcome = run_one_job(store, compaction_handler(summarize, model_ref="m@sha256:abc"), kinds=COMPACTION_KIND)
    assert outcome.status == "done", outcome.detail


def build(store: MemoryStore, workspace: Path) -> None:
    scratch = store.create_session(workspace, title="deleted before the export")  # its event IDs stay unused
    add_turns(store, scratch.id, workspace, 5, "s")
    plot = store.put_asset(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4000, "image/png")  # > one asset_data chunk
    first = store.create_session(workspace, title="compacted twice")
    add_turns(store, first.id, workspace, 10, "a", assets=(plot,))
    compact(store, first.id)
    add_turns(store, first.id, workspace, 10, "b")
    compact(store, first.id)
    second = store.create_session(workspace, title="plain")
    add_turns(store, second.id, workspace, 3, "c")
    store.remember(workspace, "port", "the api listens on 8443", confidence=0.8,
                   source=store.knowledge_source(second.id, 1, 2))
    store.remember(workspace, "port", "the api listens on 9443", client="claude-code 2.1.3")
    store.remember(workspace, "old", "a retired fact here")
    store.forget(workspace, "old", client="codex 0.65")
    store.remember(workspace, "pinned", "always run make test first")
    store.pin(workspace, "pinned")
    store.delete_session(scratch.id)


def records(store: MemoryStore) -> list:
    return [r for r in store.export_records()]


def view_of(exported: list, session_id: str) -> list[tuple]:
    """The raw events of an exported Session that its replay shows (after its newest Summary's range)."""
    session = next(r for r in exported if isinstance(r, ExportedSession) and r.id == session_id)
    through = max(s.through_seq for s in session.summaries)
    start = exported.index(session) + 1
    events = exported[start:start + session.events]
    return [(e.seq, e.kind, e.payload_json) for e in events if e.kind != "summary" and e.seq > through]


def view(store: MemoryStore, session_id: str) -> list[tuple]:
    events, after = [], 0
    while True:
        page = store.replay(session_id, after)  # verifies every Summary it shows
        events += [(e.seq, e.kind, e.payload_json, e.created_at, e.assets) for e in page.events]
        after = page.next_cursor
        if page.done:
            return events


@pytest.fixture
def exported(tmp_path: Path, workspace: Path) -> tuple[Path, list]:
    with MemoryStore.open(Settings(home=tmp_path / "a")) as store:
        build(store, workspace)
        path = tmp_path / "export.jsonl"
        report = write_export(store, str(path))
        assert report.counts == {"assets": 1, "sessions": 2, "events": 48, "knowledge": 3}
        return path, records(store)


def test_an_export_read_back_into_a_fresh_home_is_the_same_store(tmp_path: Path, workspace: Path, exported) -> None:
    path, before = exported
    assert path.stat().st_mode & 0o777 == 0o600
    with MemoryStore.open(Settings(home=tmp_path / "b")) as fresh:
        report = import_export(fresh, str(path))
        assert (report.imported, report.refused) == ({"assets": 1, "sessions": 2, "knowledge": 3}, [])
        after = records(fresh)
        assert after == before  # every event (IDs, payload bytes, times, assets) and every version, in order
        sessions = [r for r in after if isinstance(r, ExportedSession)]
        assert [len(s.summaries) for s in sessions] == [2, 0]
        views = {s.id: view(fresh, s.id) for s in sessions}
        assert views[sessions[0].id][0][1] == "summary"
        assert fresh.read_asset(next(e for e in after if isinstance(e, ExportedEvent) and e.assets).assets[0])
        again = import_export(fresh, str(path))
        assert again.unchanged == {"sessions": 2, "knowledge": 3} and again.refused == []
        assert records(fresh) == before
    with MemoryStore.open(Settings(home=tmp_path / "a")) as original:
        assert {s.id: view(original, s.id) for s in sessions} == views


def test_an_import_where_the_event_ids_are_taken_reanchors_the_summaries(tmp_path: Path, workspace: Path,
                                                                         exported) -> None:
    path, before = exported
    with MemoryStore.open(Settings(home=tmp_path / "c")) as other:
        own = other.create_session(workspace, title="already here")
        add_turns(other, own.id, workspace, 30, "z")  # event IDs 1-60: the export's (from 11 on) are taken
        report = import_export(other, str(path))
        assert report.refused == []
        exported_sessions = [r for r in before if isinstance(r, ExportedSession)]
        compacted = exported_sessions[0]
        shown = view(other, compacted.id)  # the re-anchored Summaries verify
        assert shown[0][1] == "summary"
        assert [e[2] for e in shown if e[1] != "summary"] == [e[2] for e in view_of(before, compacted.id)]
        theirs = [(e.seq, e.kind, e.created_at) for e in before if isinstance(e, ExportedEvent)]
        ours = [(e.seq, e.kind, e.created_at) for e in records(other) if isinstance(e, ExportedEvent)]
        assert ours[60:] == theirs  # the 60 events of the Session already here come first


def test_a_session_whose_summary_does_not_verify_is_refused_and_nothing_of_it_written(tmp_path: Path,
                                                                                       exported) -> None:
    path, _ = exported
    lines = path.read_text().splitlines()
    tampered = []
    for line in lines:
        obj = json.loads(line)
        if obj["type"] == "event" and obj["kind"] == "user" and obj["seq"] == 3:
            obj["payload"]["text"] = "something never said"
        tampered.append(json.dumps(obj))
    bad = tmp_path / "tampered.jsonl"
    bad.write_text("\n".join(tampered) + "\n")
    with MemoryStore.open(Settings(home=tmp_path / "d")) as fresh:
        report = import_export(fresh, str(bad))
        assert report.refused_count == 1 and "does not verify" in report.refused[0]
        assert report.imported["sessions"] == 1
        assert len(fresh.list_sessions().sessions) == 1


def rewritten(path: Path, tmp_path: Path, change) -> Path:
    """A copy of the export at `path` with each record passed through `change` (which may return None to drop
    it, or a list of records to put in its place); the closing line's count follows."""
    out = []
    for line in path.read_text().splitlines():
        got = change(json.loads(line))
        out += [] if got is None else got if isinstance(got, list) else [got]
    out[-1]["lines"] = len(out)
    copy = tmp_path / "altered.jsonl"
    copy.write_text("".join(json.dumps(o) + "\n" for o in out))
    return copy


def test_a_session_short_of_its_event_lines_is_refused_and_every_record_after_it_read(tmp_path: Path,
                                                                                    exported) -> None:
    path, _ = exported
    first = []

    def short(obj):
        if obj["type"] == "session" and not first:
            first.append(obj["id"])
            return {**obj, "events": obj["events"] + 1}  # one event line fewer than it says
        return obj

    with MemoryStore.open(Settings(home=tmp_path / "e")) as fresh:
        report = import_export(fresh, str(rewritten(path, tmp_path, short)))
        assert report.refused_count == 1
        assert f"exported Session {first[0]} has 42 of its 43 event lines" in report.refused[0]
        assert (report.imported["sessions"], report.imported["knowledge"]) == (1, 3)


def test_records_that_break_the_stores_rules_are_refused_one_by_one_in_a_line_each(tmp_path: Path,
                                                                                   exported) -> None:
    """An altered export is refused record by record with the store's own validation, never a traceback or a
    database error that stops the import: a confidence out of range, a content that is no text, an unknown origin, a
    key with a newline, versions out of order, a Session's snapshot that is no snapshot record, an event of turn 0."""
    path, _ = exported
    seen = []

    def alter(obj):
        kind = obj["type"]
        if kind == "session":
            seen.append(obj["id"])
            return {**obj, "snapshot": "not a snapshot record"} if len(seen) == 1 else obj
        if kind == "event" and obj["session"] == seen[-1] and len(seen) == 2 and obj["seq"] == 1:
            return {**obj, "turn": 0}
        if kind != "knowledge":
            return obj
        first = dict(obj["versions"][0])
        if obj["key"] == "port":
            descending = {**obj, "key": "descending", "versions": obj["versions"][::-1]}
            return [{**obj, "versions": [{**first, "confidence": 5.0}, *obj["versions"][1:]]}, descending]
        if obj["key"] == "old":
            return {**obj, "versions": [{**first, "content": 5}, *obj["versions"][1:]]}
        return [{**obj, "versions": [{**first, "origin": "hacker"}]}, {**obj, "key": "two\nlines"}]

    altered = rewritten(path, tmp_path, alter)
    with MemoryStore.open(Settings(home=tmp_path / "f")) as fresh:
        report = import_export(fresh, str(altered))
        assert report.refused_count == 7, report.refused
        assert (report.imported["sessions"], report.imported["knowledge"]) == (0, 0)
        assert all("\n" not in m and "database error" not in m for m in report.refused)
        assert fresh.list_sessions().sessions == []
        assert fresh.recall(altered.parent / "workspace", include_tombstones=True).entries == []


def test_a_summary_event_without_its_record_is_refused_not_adopted(tmp_path: Path, exported) -> None:
    """A Summary event whose provenance record the export lacks could never be verified (replay would refuse the
    whole Session): its Session is refused, nothing of it written."""
    path, _ = exported

    def unrecorded(obj):
        if obj["type"] == "session" and len(obj["summaries"]) == 2:
            return {**obj, "summaries": obj["summaries"][:1]}  # the newest Summary's record left out
        return obj

    with MemoryStore.open(Settings(home=tmp_path / "g")) as fresh:
        report = import_export(fresh, str(rewritten(path, tmp_path, unrecorded)))
        assert report.refused_count == 1 and "Summary event" in report.refused[0] and "no record" in report.refused[0]
        assert [s.title for s in fresh.list_sessions().sessions] == ["plain"]


def test_an_imported_session_keeps_where_it_came_from_through_an_export(tmp_path: Path, workspace: Path) -> None:
    """The import runs of an imported Session travel with it: in the new Home, `session_imports` names the same
    source, and importing the same history again is a no-op, a grown one appends to the same Session (not a second
    copy of the conversation)."""
    from emelex_workers.interop.importer import ImportOptions, import_source

    history = tmp_path / "agent.jsonl"
    lines = [{"emelex_history": 1, "session": "bot-7", "workspace": str(workspace)},
             {"role": "user", "text": "Deploys happen on Tuesdays.", "at": 1796126400},
             {"role": "assistant", "text": "Noted: Tuesdays.", "at": 1796126401}]
    history.write_text("".join(json.dumps(o) + "\n" for o in lines))
    with MemoryStore.open(Settings(home=tmp_path / "a")) as store:
        (first,) = import_source(store, str(history), ImportOptions())
        runs = store.session_imports(first.session_id)
        write_export(store, str(tmp_path / "export.jsonl"))
    with MemoryStore.open(Settings(home=tmp_path / "b")) as fresh:
        assert import_export(fresh, str(tmp_path / "export.jsonl")).imported["sessions"] == 1
        assert fresh.session_imports(first.session_id) == runs
        (again,) = import_source(fresh, str(history), ImportOptions())
        assert (again.outcome, again.session_id) == ("unchanged", first.session_id)
        with history.open("a") as f:
            f.write(json.dumps({"role": "user", "text": "And hotfixes any day.", "at": 1796126500}) + "\n")
        (grown,) = import_source(fresh, str(history), ImportOptions())
        assert (grown.outcome, grown.session_id, grown.created) == ("imported", first.session_id, False)
        assert len(fresh.list_sessions().sessions) == 1
    with MemoryStore.open(Settings(home=tmp_path / "c")) as other:
        (own,) = import_source(other, str(history), ImportOptions())  # the same history, imported here first
        before = other.list_sessions().sessions
        report = import_export(other, str(tmp_path / "export.jsonl"))
        assert report.refused_count == 1 and f"already imported {history} as Session {own.session_id}" in \
            report.refused[0]
        assert other.list_sessions().sessions == before
