"""`emelex memory ...`: Sessions, doctor and explicit re-initialisation."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Annotated, Optional

import typer

from emelex_memory import CorruptEventError, Event, MemoryStore, Settings
from emelex_memory.doctor import DOCTOR_ASSET_ENTRIES, diagnose

from .assets import assets_app
from .jobs import compact, jobs_app
from .knowledge import knowledge_app
from .maintain import maintain
from .pages import echo_page
from .work import work
from .workspaces import workspaces_app

memory_app = typer.Typer(help="Inspect and maintain the memory store.", no_args_is_help=True)
sessions_app = typer.Typer(help="List and inspect Sessions.", no_args_is_help=True)
memory_app.add_typer(sessions_app, name="sessions")
memory_app.add_typer(knowledge_app, name="knowledge")
memory_app.add_typer(workspaces_app, name="workspaces")
memory_app.command("maintain")(maintain)
memory_app.add_typer(assets_app, name="assets")
memory_app.add_typer(jobs_app, name="jobs")
memory_app.command("compact")(compact)
memory_app.command("work")(work)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]


def _settings(ctx: typer.Context) -> Settings:
    return ctx.find_root().obj


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


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
    limit: Annotated[int, typer.Option(help="Sessions per page.")] = 50,
    cursor: Annotated[Optional[str], typer.Option(help="next_cursor printed by the previous page.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List Sessions, newest first."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        page = store.list_sessions(cursor=cursor, limit=limit)
    echo_page(
        "sessions", page.sessions, page.next_cursor, as_json, as_dict=_session_dict, empty="no Sessions",
        line=lambda s: f"{s.id}  {_when(s.updated_at)}  {s.last_turn:>5} turns  {s.title or '-'}  [{s.workspace.path}]",
    )


@sessions_app.command("show")
def sessions_show(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="Session ID.")],
    after: Annotated[int, typer.Option(help="Show events after this seq.")] = 0,
    limit: Annotated[int, typer.Option(help="Events to show.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Show one Session and a page of its transcript."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        s = store.get_session(session)
        page = store.replay(session, after, limit=limit)
    events = [_event_dict(e) for e in page.events]
    if as_json:
        typer.echo(json.dumps({"session": _session_dict(s), "events": events, "next_cursor": page.next_cursor}))
    else:
        typer.echo(f"Session {s.id}")
        typer.echo(f"  title:     {s.title or '-'}")
        typer.echo(f"  workspace: {s.workspace.path}")
        typer.echo(f"  created:   {_when(s.created_at)}   updated: {_when(s.updated_at)}")
        typer.echo(f"  history:   {s.last_seq} events in {s.last_turn} turns, {s.event_bytes} bytes")
        for e in events:
            if "payload_error" in e:
                text = "<payload is not valid JSON: the database was altered; restore the database from a backup>"
            else:
                text = json.dumps(e["payload"], ensure_ascii=False)[:200]
            typer.echo(f"  #{e['seq']:<5} turn {e['turn']:<4} {e['kind']:<12} {text}")
            for a in e["assets"]:
                typer.echo(f"         asset {a['digest'][:12]}  {a['size']} bytes  {a['media_kind']}")
        if not page.done:
            typer.echo(f"  more: --after {page.next_cursor}")
    corrupt = [str(e["seq"]) for e in events if "payload_error" in e]
    if corrupt:
        typer.echo(f"error: the payload of event seq {', '.join(corrupt)} of Session {s.id} is not valid JSON; "
                   "restore the database from a backup", err=True)
        raise typer.Exit(1)


def _event_dict(e: Event) -> dict:
    """An event for `sessions show`; a payload that is not valid JSON is null, with `payload_error` saying so."""
    out = {"seq": e.seq, "turn": e.turn, "kind": e.kind, "payload": None, "created_at": e.created_at,
           "assets": [{"digest": a.digest, "size": a.size, "media_kind": a.media_kind} for a in e.assets]}
    try:
        out["payload"] = e.payload
    except CorruptEventError as exc:
        out["payload_error"] = str(exc)
    return out


@sessions_app.command("delete")
def sessions_delete(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(help="Session ID.")],
    yes: Annotated[bool, typer.Option("--yes", help="Delete without asking.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete a Session with its transcript, jobs and the assets only it used; Knowledge keeps its audit fields.

    Not forensic erasure: freed pages and WAL bytes remain until `emelex memory maintain --vacuum`.
    """
    with MemoryStore.open(_settings(ctx), create=False) as store:
        if not yes:
            s = store.get_session(session)
            typer.confirm(f"Delete Session {s.id} ({s.last_seq} events, {s.title or 'untitled'})?", abort=True)
        d = store.delete_session(session)
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(d)))
        return
    typer.echo(
        f"deleted Session {d.session_id}: {d.events} events, {d.jobs} jobs, {d.asset_entries} assets "
        f"({d.asset_bytes} bytes freed); {d.knowledge_versions_detached} Knowledge versions keep its ID for audit"
    )


@memory_app.command("doctor")
def doctor(
    ctx: typer.Context,
    max_assets: Annotated[int, typer.Option(
        "--max-assets", min=1, help="Asset entries to re-hash at most (the check says how many of how many)."
    )] = DOCTOR_ASSET_ENTRIES,
    as_json: JsonFlag = False,
) -> None:
    """Check Home, file modes, pragmas, connection settings, schema, integrity, transcripts, payloads and a bounded
    number of asset files; exit 1 when anything is wrong."""
    report = diagnose(_settings(ctx), max_asset_entries=max_assets)
    if report.no_store and not as_json:  # nothing to check: one line, like every other command here
        typer.echo(f"error: {report.checks[0].detail}", err=True)
        raise typer.Exit(1)
    if as_json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in report.checks]
        typer.echo(json.dumps({"healthy": report.healthy, "checks": checks, "facts": report.facts}, default=str))
    else:
        for key, value in report.facts.items():
            typer.echo(f"{key}: {value}")
        for c in report.checks:
            typer.echo(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        typer.echo("healthy" if report.healthy else "NOT healthy: fix the FAIL lines above")
    if not report.healthy:
        raise typer.Exit(1)


@memory_app.command("reinit")
def reinit(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: start a new, empty store after a deletion.")] = False,
) -> None:
    """Start a new store where the database was deleted. Refuses while a database file exists."""
    settings = _settings(ctx)
    moved = MemoryStore.reinitialize(settings, confirm=yes)
    for path in moved:
        typer.echo(f"moved leftover {path.name.split('.orphaned')[0]} aside to {path}")
    MemoryStore.open(settings).close()
    typer.echo(f"created a new, empty store at {settings.database_path}")
