"""Finding a chat Session again: its title from its first message, the chat Sessions of a workspace (newest first)
for `emelex chat --continue` and for the list a bare `--resume` chooses from, and the last turns a resumed chat
prints before its prompt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_memory.sessions.identity import Session, WorkspaceIdentity

from .common import when

TITLE_CHARS = 60  # of a title taken from a first message
SCAN_SESSIONS = 1000  # Sessions looked through, newest first, for those of a workspace
CHOICES = 10  # Sessions a bare --resume offers
LAST_TURNS = 3  # turns a resumed chat prints
TURN_LINES = 6  # lines of one answer it prints


def title_of(message: str) -> str:
    """A Session's title from its first message: its words on one line, cut at a word to `TITLE_CHARS` characters
    (marked with "...")."""
    text = " ".join(message.split())
    if len(text) <= TITLE_CHARS:
        return text
    cut = text[:TITLE_CHARS - 3].rsplit(" ", 1)[0] or text[:TITLE_CHARS - 3]
    return cut + "..."


def workspace_chats(store: MemoryStore, workspace: Path, limit: int) -> list[Session]:
    """The chat Sessions of `workspace` (those with an execution snapshot), most recently updated first, at most
    `limit`, found among the newest `SCAN_SESSIONS` Sessions."""
    here = WorkspaceIdentity.inspect(workspace)
    found, cursor, seen = [], None, 0
    while seen < SCAN_SESSIONS:
        page = store.list_sessions(cursor=cursor, limit=min(200, SCAN_SESSIONS - seen))
        seen += len(page.sessions)
        found += [s for s in page.sessions
                  if (s.workspace.device, s.workspace.inode) == (here.device, here.inode)]
        cursor = page.next_cursor
        if cursor is None or not page.sessions:
            break
    found.sort(key=lambda s: s.updated_at, reverse=True)
    return [s for s in found if journal.stored_snapshot(store, s.id) is not None][:limit]


def session_line(number: int, session: Session) -> str:
    """One Session of a choice list: its number, last update, turns, title and ID."""
    return (f"  {number:>2}. {when(session.updated_at)}  {session.last_turn:>3} turn"
            f"{'' if session.last_turn == 1 else 's'}  {session.title or '(untitled)'}  [{session.id[:8]}]")


def choose_session(sessions: list[Session], ask: Callable[[str], str | None], say: Callable[[str], None]) -> str | None:
    """Let the person choose one of `sessions` by number (`ask` reads an answer; None or an empty one chooses
    none): its ID, or None."""
    say("recent chat Sessions in this workspace:")
    for number, session in enumerate(sessions, 1):
        say(session_line(number, session))
    while True:
        answer = ask(f"resume which one? [1-{len(sessions)}, Enter for none]: ")
        if answer is None or not answer.strip():
            return None
        if answer.strip().isdigit() and 1 <= int(answer) <= len(sessions):
            return sessions[int(answer) - 1].id
        say(f"please answer a number from 1 to {len(sessions)}, or Enter for none")


def last_turns(store: MemoryStore, session_id: str, turns: int = LAST_TURNS) -> list[str]:
    """The lines a resumed chat prints of its last `turns` turns: each message typed ("> ..."), how many tool calls
    it made, and its answer (at most `TURN_LINES` lines) or how it ended; with a line saying how many earlier
    turns there are."""
    events = list(store.replay(session_id).events)
    grouped: list[list] = []
    for event in events:
        if event.kind == "user":
            grouped.append([event])
        elif grouped:
            grouped[-1].append(event)
    shown = []
    for group in grouped[-turns:]:
        shown.append(f"> {group[0].payload.get('text', '')}")
        calls = sum(len(e.payload.get("calls", [])) for e in group if e.kind == "tool_calls")
        if calls:
            shown.append(f"  ({calls} tool call{'' if calls == 1 else 's'})")
        answer = next((e.payload.get("text") for e in group if e.kind == "assistant"), None)
        failed = next((e.payload for e in group if e.kind == "turn_failed"), None)
        if answer is not None:
            lines = answer.splitlines() or [""]
            shown += lines[:TURN_LINES] + ([f"  ... ({len(lines) - TURN_LINES} more lines)"]
                                           if len(lines) > TURN_LINES else [])
        elif failed is not None:
            shown.append(f"[turn {failed.get('reason', 'failed')}: {failed.get('diagnostic', '')}]")
    if not shown:
        return []
    earlier = len(grouped) - min(turns, len(grouped))
    head = f"--- the last {min(turns, len(grouped))} of {len(grouped)} turns of this Session ---" if earlier else \
        "--- this Session so far ---"
    return [head, *shown, "---"]
