"""`emelex chat` recalls workspace Knowledge at a new Session's first turn, says how many notes, lists them with
their sources on /memory, replays them unchanged on resume; `--no-recall` is recorded in the snapshot, so the
Session (resumed too) has neither the notes nor the memory tools. Real subprocesses on the scripted binding."""

from __future__ import annotations

import datetime as dt

import re

from pathlib import Path

from emelex_memory import MemoryStore
from emelex_memory.search.service import day
from emelex_memory.agent import journal
from emelex_workers.settings import WorkerSettings

from ...support.agent import answer
from .test_chat_cli import chat, env, events  # noqa: F401 - env is a fixture
from .test_chat_screen import STATS

__all__ = ["env"]


def session_of(home: Path):
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        return session.id, journal.stored_snapshot(store, session.id)


def knowledge(home: Path, workspace: Path, *entries: tuple[str, str], pin: str | None = None) -> None:
    with MemoryStore.open(WorkerSettings(home=home), create=True) as store:
        for key, content in entries:
            store.remember(workspace, key, content)
        if pin:
            store.pin(workspace, pin)


def said_on(home: Path, workspace: Path, key: str) -> str:
    """The (UTC) date `/memory` shows for the note of `key`: when its statement was said."""
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        return day(store.get_knowledge(workspace, key).head.said_at)


def test_a_new_chat_recalls_says_how_many_and_memory_lists_them(env, home, workspace, tmp_path) -> None:
    knowledge(home, workspace, ("style", "Use tabs in the Makefile"), ("deploy", "We deploy with make release"),
              ("weather", "It rained on Tuesday"), pin="style")
    out = chat(env, workspace, "how do we deploy?\n/memory\n/exit\n", [answer("with make release")],
               tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert re.search(r"with make release\n\[recalled 2 notes from earlier Sessions; /memory lists them\]\n"
                     r"\[[0-9.]+ s, 1 round\b[^\n]*\]\n", out.stdout), out.stdout
    assert "2 notes recalled at the first turn (from earlier Sessions; they may be outdated):" in out.stdout
    style_day = said_on(home, workspace, "style")
    assert f"  style v1, pinned  from no Session (remembered by hand), said {style_day}\n    Use tabs in the Makefile" \
        in out.stdout
    deploy_day = said_on(home, workspace, "deploy")
    assert f"  deploy v1  from no Session (remembered by hand), said {deploy_day}\n    We deploy with make release" \
        in out.stdout
    kinds = [k for k, _ in events(home)]
    assert kinds == ["context", "context", "user", "assistant", "audit"]  # the workspace map, then the notes
    (_, workspace_note), (_, note) = events(home)[:2]
    assert workspace_note["source"] == "workspace_map"
    assert note["source"] == "recall" and [n["key"] for n in note["notes"]] == ["style", "deploy"]
    _, snapshot = session_of(home)
    assert snapshot.context == ("workspace_map", "recall")
    assert {"recall", "remember"} <= {t.name for t in snapshot.tools}


def test_a_resumed_chat_shows_the_notes_it_recalled_whatever_knowledge_holds_now(env, home, workspace,
                                                                                 tmp_path) -> None:
    knowledge(home, workspace, ("deploy", "We deploy with make release"))
    deploy_day = said_on(home, workspace, "deploy")
    first = chat(env, workspace, "how do we deploy?\n/exit\n", [answer("ok")], tmp_path / "effects")
    assert first.returncode == 0, first.stderr
    session, _ = session_of(home)
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        store.remember(workspace, "deploy", "We deploy with the pipeline now")
    resumed = chat(env, workspace, "/memory\nand now?\n/exit\n", [answer("fine")], tmp_path / "effects",
                   "--resume", session)
    assert resumed.returncode == 0, resumed.stderr
    assert f"  deploy v1  from no Session (remembered by hand), said {deploy_day}\n    We deploy with make release" \
        in resumed.stdout
    assert "pipeline" not in resumed.stdout and "recalled" not in resumed.stdout.split("1 note recalled")[1]
    assert [k for k, _ in events(home)].count("context") == 2  # recorded once: the map and the notes


def test_no_recall_is_recorded_and_a_resumed_session_keeps_it(env, home, workspace, tmp_path) -> None:
    knowledge(home, workspace, ("deploy", "We deploy with make release"), pin="deploy")
    out = chat(env, workspace, "how do we deploy?\n/memory\n/tools\n/exit\n", [answer("no idea")],
               tmp_path / "effects", "--no-recall")
    assert out.returncode == 0, out.stderr
    assert "recalled" not in out.stdout
    assert "this Session was started with --no-recall: it recalls no notes and has no memory tools" in out.stdout
    assert " remember " not in out.stdout and " recall " not in out.stdout
    session, snapshot = session_of(home)
    assert snapshot.context == ("workspace_map",) and not {"recall", "remember"} & {t.name for t in snapshot.tools}
    resumed = chat(env, workspace, "/memory\nagain\n/exit\n", [answer("still no idea")], tmp_path / "effects",
                   "--resume", session)
    assert resumed.returncode == 0, resumed.stderr
    assert "started with --no-recall" in resumed.stdout
    assert [k for k, _ in events(home)] == ["context", *["user", "assistant", "audit"] * 2]  # the map only
    refused = chat(env, workspace, "", [], tmp_path / "effects", "--resume", session, "--no-recall")
    assert refused.returncode != 0 and "a resumed Session keeps the choice it was started with" in refused.stderr


def test_a_new_chat_with_nothing_to_recall_says_so_and_records_nothing(env, home, workspace, tmp_path) -> None:
    knowledge(home, workspace, ("weather", "It rained on Tuesday"))
    out = chat(env, workspace, "how do we deploy?\n/memory\n/exit\n", [answer("no idea")], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "[no notes recalled from earlier Sessions]" in out.stdout
    said = out.stdout.splitlines()  # what the turn recalled comes before the line that ends the turn, never after it
    recalled = said.index("[no notes recalled from earlier Sessions]")
    assert said[recalled - 1].endswith("no idea") and STATS.fullmatch(said[recalled + 1])
    assert "this Session recalled no notes" in out.stdout
    assert [k for k, _ in events(home)] == ["context", "user", "assistant", "audit"]  # the workspace map only


def test_a_new_chat_recalls_a_past_turn_with_its_date_and_memory_lists_it(env, home, workspace, tmp_path) -> None:
    first = chat(env, workspace, "note that the ferry to the island leaves at nine\n/exit\n", [answer("noted")],
                 tmp_path / "first")
    assert first.returncode == 0, first.stderr
    earlier, _ = session_of(home)
    out = chat(env, workspace, "when does the ferry to the island leave?\n/memory\n/exit\n", [answer("at nine")],
               tmp_path / "second")
    assert out.returncode == 0, out.stderr
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    titled = '"note that the ferry to the island leaves at nine"'  # a chat Session is titled by its first message
    assert re.search(rf"  turn 1 of Session {earlier[:8]} {titled} \({today}, event \d+, user\)\n"
                     r"    note that the ferry to the island leaves at nine\n", out.stdout), out.stdout
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        newest = store.list_sessions().sessions[0].id
        (note,) = [e.payload for e in store.replay(newest).events if e.kind == "context"
                   and e.payload["source"] == "recall"]
    assert f"- [{today}, Session {titled}] user: note that the ferry to the island leaves at nine" in note["text"]
