"""`emelex memory sessions list|show|delete`: Sessions and their transcripts."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated

import typer

from emelex_memory import CorruptEventError, Event, RawEvent, SessionPage, describe_producer
from emelex_memory.agent.journal import read_journal
from emelex_memory.core.cursors import MAX_SQL_INT

from .common import (
    CursorOpt,
    EmelexTyper,
    JsonFlag,
    SessionArg,
    echo_json,
    echo_page,
    error_text,
    open_store,
    page_limit,
    read_listing,
    when,
)
from .recover import journal_lines, recover

NO_MODEL = "none (a rule-based summarizer, or not recorded)"  # a Summary whose provenance names no model

sessions_app = EmelexTyper(help="List and inspect Sessions.")
sessions_app.command("recover")(recover)


def _session_dict(s) -> dict:
    return {
        "id": s.id,
        "title": s.title,
        "workspace": s.workspace.path,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "events": s.last_seq,
        "turns": s.last_turn,
        "bytes": s.event_bytes,
    }


@sessions_app.command("list")
def sessions_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Sessions per page.")] = 50,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List Sessions, newest first (none on a Home without a store yet)."""
    page = read_listing(ctx, lambda store: store.list_sessions(cursor=cursor, limit=limit), SessionPage([], None))
    width = max([len("TITLE"), *(len(s.title or "-") for s in page.sessions)])  # the workspace column lines up
    echo_page(
        "sessions", page.sessions, page.next_cursor, as_json, as_dict=_session_dict, empty="no Sessions",
        header=f"{'SESSION':<36}  {'UPDATED':<19}  TURNS  {'TITLE':<{width}}  [WORKSPACE]",
        line=lambda s: (f"{s.id:<36}  {when(s.updated_at):<19}  {s.last_turn:>5}  "
                        f"{s.title or '-':<{width}}  [{s.workspace.path}]"),
    )


@sessions_app.command("show")
def sessions_show(
    ctx: typer.Context,
    session: SessionArg,
    after: Annotated[int, typer.Option(
        metavar="SEQ", min=0, max=MAX_SQL_INT, help="Show events after this seq.")] = 0,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Events to show.")] = 50,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Every stored event, also those a Summary replaced, marked with the Summary covering each.",
    )] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show one Session and a page of its transcript: what replay shows (a Summary, then the turns after it), or
    with --raw everything stored."""
    with open_store(ctx) as store:
        s = store.get_session(store.resolve_session_id(session))
        page = store.raw_events(s.id, after, limit=limit) if raw else store.replay(s.id, after, limit=limit)
        turn = read_journal(store, s.id)
        runs = store.session_imports(s.id)
    events = [_raw_dict(e) if raw else _event_dict(e) for e in page.events]
    corrupt = [str(e["seq"]) for e in events if "payload_error" in e]
    if as_json:
        echo_json("found", {"session": _session_dict(s), "events": events, "next_cursor": page.next_cursor,
                            "agent_journal": None if turn is None else turn.to_json(),
                            "imported_from": [_import_dict(r) for r in runs]})
    else:
        typer.echo(f"Session {s.id}")
        typer.echo(f"  title:     {s.title or '-'}")
        typer.echo(f"  workspace: {s.workspace.path}")
        typer.echo(f"  created:   {when(s.created_at)}   updated: {when(s.updated_at)}")
        typer.echo(f"  history:   {s.last_seq} event{'' if s.last_seq == 1 else 's'} in {s.last_turn} "
                   f"turn{'' if s.last_turn == 1 else 's'}, {s.event_bytes} bytes")
        for line in _import_lines(runs):
            typer.echo(line)
        if raw:
            typer.echo("  raw:       every stored event; [replaced by Summary #N]: replay shows Summary #N instead")
        if turn is not None:
            for line in journal_lines(turn):
                typer.echo(line)
        for e in events:
            for line in _event_lines(e):
                typer.echo(line)
            for a in e["assets"]:
                typer.echo(f"         asset {a['digest'][:12]}  {a['size']} bytes  {a['media_kind']}")
        if not page.done:
            typer.echo(f"  more: --after {page.next_cursor}")
    if corrupt:
        message = (f"the payload of event seq {', '.join(corrupt)} of Session {s.id} is not valid JSON; "
                   "restore the database from a backup")
        typer.echo(error_text(CorruptEventError.__name__, message, as_json), err=True)
        raise typer.Exit(1)


SHOWN_RUNS = 5


def _import_dict(r) -> dict:
    """An import run (`ImportRecord`) as JSON: where the events came from."""
    return {"format": r.format, "path": r.path, "first_line": r.first_line, "last_line": r.last_line,
            "digest": r.prefix_digest, "first_seq": r.first_seq, "last_seq": r.last_seq, "skipped": r.skipped,
            "cut": r.cut, "imported_at": r.imported_at}


def _import_lines(runs: list) -> list[str]:
    """The provenance of an imported Session: one line per import run (the newest few), each with the file, the
    lines read, the events written and the digest of the file through those lines."""
    lines = []
    for r in runs[-SHOWN_RUNS:]:
        seqs = f"#{r.first_seq}-#{r.last_seq}" if r.first_seq is not None else "no events"
        lines.append(f"  imported:  {r.format} {r.path} lines {r.first_line}-{r.last_line} -> {seqs} "
                     f"(sha256 {r.prefix_digest[:16]}, {when(r.imported_at)})")
    if len(runs) > SHOWN_RUNS:
        lines.insert(0, f"  imported:  {len(runs)} runs, the newest {SHOWN_RUNS} shown (--json lists up to 1000)")
    return lines


def _event_lines(e: dict) -> list[str]:
    """The text lines of one event: a Summary's title (the range it replaces, in the kind column, so "Summary" is
    said once), its whole text and its provenance on lines of their own; any other event's payload as JSON cut to
    200 characters, with the Summary covering it."""
    at = f"  #{e['seq']:<5} turn {e['turn']:<4} "
    head = f"{at}{e['kind']:<12} "
    if "payload_error" in e:
        return [head + "<payload is not valid JSON: the database was altered; restore the database from a backup>"]
    payload = e["payload"]
    if e["kind"] == "summary" and isinstance(payload, dict) and isinstance(payload.get("text"), str):
        prov = payload.get("provenance") or {}
        source = prov.get("source") or {}
        by = f", by {describe_producer(prov['producer'])}" if isinstance(prov.get("producer"), dict) else ""
        provenance = (f"provenance: job {prov.get('job')}, model {prov.get('model') or NO_MODEL}, "
                      f"{source.get('count')} source events{by}")
        body = [f"         {line}" for line in payload["text"].splitlines() or [""]]
        return [at + _summary_title(e, source), *body, f"         {provenance}"]
    covered = f"   [replaced by Summary #{e['covered_by']}]" if e.get("covered_by") else ""
    return [head + json.dumps(payload, ensure_ascii=False)[:200] + covered]


def _summary_title(e: dict, source: dict) -> str:
    """What a Summary replaces: in the replay view everything through its covered seq (through its base Summary);
    in the raw history its base Summary's seq, its own range and its state ("Summary of #21 and #13-#25 (in
    effect)")."""
    if "summary" not in e:
        return f"Summary of #1-#{source.get('through_seq')}"
    record = e["summary"]
    if record is None:
        return "Summary without a provenance record: the database was altered; restore it from a backup"
    base = f"#{record['base_seq']} and " if record["base_seq"] is not None else ""
    state = {"compacted again": f"compacted again by #{record['replaced_by']}",
             "reverted": f"reverted {when(record['reverted_at'])}"}.get(record["state"], record["state"])
    return f"Summary of {base}#{record['first_seq']}-#{record['through_seq']} ({state})"


def _raw_dict(r: RawEvent) -> dict:
    """An event of the raw history: `_event_dict` plus the seq of the Summary covering it and a Summary's record."""
    return {**_event_dict(r.event), "covered_by": r.covered_by,
            "summary": None if r.summary is None else dataclasses.asdict(r.summary)}


def _event_dict(e: Event) -> dict:
    """An event for `sessions show`; a payload that is not valid JSON is null, with `payload_error` saying so."""
    out = {"seq": e.seq, "turn": e.turn, "kind": e.kind, "payload": None, "created_at": e.created_at,
           "assets": [{"digest": a.digest, "size": a.size, "media_kind": a.media_kind} for a in e.assets]}
    try:
        out["payload"] = e.payload
    except CorruptEventError as exc:
        out["payload_error"] = str(exc)
    return out


def _confirm(question: str, session_id: str, as_json: bool) -> None:
    """Ask `question` on stderr (stdout carries only the result, e.g. its JSON) until the answer is yes or no, saying
    what to type after any other answer; return on yes; on no, an empty answer or the end of input, say that nothing
    was deleted and exit 1."""
    while True:
        typer.echo(f"{question} [y/N]: ", nl=False, err=True)
        line = sys.stdin.readline()
        answer = line.strip().lower()
        if answer in ("y", "yes"):
            return
        if answer in ("", "n", "no"):
            if not line:
                typer.echo(err=True)
            typer.echo(error_text("Aborted", "not confirmed; nothing was deleted", as_json), err=True)
            raise typer.Exit(1)
        typer.echo(f"answer y to delete Session {session_id} or n to keep it (not {answer!r})", err=True)


@sessions_app.command("delete")
def sessions_delete(
    ctx: typer.Context,
    session: SessionArg,
    yes: Annotated[bool, typer.Option("--yes", help="Delete without asking.")] = False,
    discard_journal: Annotated[bool, typer.Option(
        "--discard-journal", help="Delete even with an open agent journal (its record of possibly-run tools).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete a Session with its transcript, jobs and the assets only it used; Knowledge keeps its audit fields.

    Asks first (on stderr, so --json output stays one JSON object on stdout), unless --yes.

    Refused while the Session has an open agent journal: run `emelex memory sessions recover` first, or pass
    --discard-journal.

    Not forensic erasure: freed pages and WAL bytes remain until `emelex memory maintain --vacuum`.
    """
    with open_store(ctx) as store:
        session = store.resolve_session_id(session)
        if not yes:
            s = store.get_session(session)
            _confirm(f"Delete Session {s.id} ({s.last_seq} events, {s.title or 'untitled'})?", s.id, as_json)
        d = store.delete_session(session, discard_journal=discard_journal)
    if as_json:
        echo_json("deleted", dataclasses.asdict(d))
        return
    left = (f", {d.assets_left} asset{'' if d.assets_left == 1 else 's'} left for `emelex memory maintain` after the "
            "grace period" if d.assets_left else "")
    typer.echo(
        f"deleted Session {d.session_id}: {d.events} events, {d.jobs} jobs, {d.asset_entries} assets "
        f"({d.asset_bytes} bytes freed){left}; {d.knowledge_versions_detached} Knowledge versions keep its ID for audit"
    )
