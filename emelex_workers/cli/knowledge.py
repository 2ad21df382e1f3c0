"""`emelex memory knowledge ...`: list, show, history, remember, pin, unpin and forget workspace Knowledge.

Every command works on the Knowledge of one workspace, the current directory
unless `--workspace` says otherwise; Knowledge is scoped by the directory's
identity, so another directory never sees it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from emelex_memory import KnowledgeEntry, KnowledgeVersion, MemoryStore, Settings

from .pages import echo_page

knowledge_app = typer.Typer(help="Inspect and curate the current workspace's Knowledge.", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
WorkspaceOpt = Annotated[Path, typer.Option("--workspace", "-w", help="Workspace directory (default: current).")]
KeyArg = Annotated[str, typer.Argument(help="Knowledge key.")]


def _settings(ctx: typer.Context) -> Settings:
    return ctx.find_root().obj


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def version_dict(v: KnowledgeVersion) -> dict:
    """A version as plain JSON-ready data."""
    source = None
    if v.source:
        s = v.source
        source = {
            "session": s.session_id,
            "first_seq": s.first_seq,
            "last_seq": s.last_seq,
            "digest": s.digest,
            "session_deleted": s.session_deleted,
        }
    return {
        "version": v.version,
        "tombstone": v.tombstone,
        "content": v.content,
        "confidence": v.confidence,
        "origin": v.origin,
        "source": source,
        "created_at": v.created_at,
    }


def entry_dict(e: KnowledgeEntry) -> dict:
    """An entry as plain JSON-ready data."""
    return {
        "key": e.key,
        "pinned": e.pinned,
        "created_at": e.created_at,
        "updated_at": e.updated_at,
        "head": version_dict(e.head),
    }


def _source_line(v: KnowledgeVersion) -> str:
    if v.source is None:
        return "-"
    s = v.source
    gone = " (Session deleted)" if s.session_deleted else ""
    return f"Session {s.session_id} seq {s.first_seq}..{s.last_seq} sha256 {s.digest[:12]}{gone}"


def _entry_line(e: KnowledgeEntry) -> str:
    flags = ("pinned " if e.pinned else "") + ("forgotten " if e.tombstoned else "")
    text = (e.content or "").replace("\n", " ")
    return f"{e.key}  v{e.head.version}  conf {e.confidence:.2f}  {flags}{text[:120]}".rstrip()


@knowledge_app.command("list")
def knowledge_list(
    ctx: typer.Context,
    workspace: WorkspaceOpt = Path("."),
    include_forgotten: Annotated[bool, typer.Option("--all", help="Include forgotten (tombstoned) entries.")] = False,
    limit: Annotated[int, typer.Option(help="Entries per page.")] = 50,
    cursor: Annotated[Optional[str], typer.Option(help="next_cursor printed by the previous page.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the workspace's Knowledge by key."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        page = store.recall(workspace, cursor=cursor, limit=limit, include_tombstones=include_forgotten)
    echo_page(
        "entries", page.entries, page.next_cursor, as_json,
        as_dict=entry_dict, line=_entry_line, empty="no Knowledge in this workspace",
    )


@knowledge_app.command("show")
def knowledge_show(
    ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path("."), as_json: JsonFlag = False
) -> None:
    """Show one entry, forgotten or not, with its provenance."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        e = store.get_knowledge(workspace, key)
    if as_json:
        typer.echo(json.dumps(entry_dict(e)))
        return
    typer.echo(f"Knowledge {e.key}")
    typer.echo(f"  state:      {'forgotten' if e.tombstoned else 'live'}{', pinned' if e.pinned else ''}")
    typer.echo(f"  version:    {e.head.version} by {e.head.origin}, {_when(e.head.created_at)}")
    typer.echo(f"  confidence: {e.confidence:.2f}")
    typer.echo(f"  source:     {_source_line(e.head)}")
    if e.content is not None:
        typer.echo(f"  content:    {e.content}")


@knowledge_app.command("history")
def knowledge_history(
    ctx: typer.Context,
    key: KeyArg,
    workspace: WorkspaceOpt = Path("."),
    after: Annotated[int, typer.Option(help="Show versions after this version number.")] = 0,
    limit: Annotated[int, typer.Option(help="Versions to show.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Show an entry's immutable versions, oldest first."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        page = store.knowledge_history(workspace, key, after, limit=limit)
    if as_json:
        versions = [version_dict(v) for v in page.versions]
        typer.echo(json.dumps({"key": key, "versions": versions, "next_cursor": page.next_cursor, "done": page.done}))
        return
    for v in page.versions:
        what = "TOMBSTONE" if v.tombstone else (v.content or "").replace("\n", " ")[:120]
        typer.echo(f"v{v.version:<4} {_when(v.created_at)}  {v.origin:<12} conf {v.confidence:.2f}  {what}")
        typer.echo(f"      source: {_source_line(v)}")
    if not page.done:
        typer.echo(f"more: --after {page.next_cursor}")


@knowledge_app.command("remember")
def knowledge_remember(
    ctx: typer.Context,
    key: KeyArg,
    content: Annotated[str, typer.Argument(help="What to remember under KEY (replaces the current content).")],
    workspace: WorkspaceOpt = Path("."),
    confidence: Annotated[float, typer.Option(help="Confidence between 0 and 1.")] = 1.0,
    new_workspace: Annotated[bool, typer.Option(
        "--new-workspace",
        help="The directory is a new workspace, although another one was last seen at its path (not a re-clone).",
    )] = False,
) -> None:
    """Remember or correct an entry: appends a new version."""
    with MemoryStore.open(_settings(ctx)) as store:
        v = store.remember(workspace, key, content, confidence=confidence, new_workspace=new_workspace)
    typer.echo(f"{key}: version {v.version}")


@knowledge_app.command("pin")
def knowledge_pin(ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path(".")) -> None:
    """Pin an entry: automatic distillation and retention leave it alone."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        store.pin(workspace, key)
    typer.echo(f"{key}: pinned")


@knowledge_app.command("unpin")
def knowledge_unpin(ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path(".")) -> None:
    """Unpin an entry."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        store.unpin(workspace, key)
    typer.echo(f"{key}: unpinned")


@knowledge_app.command("forget")
def knowledge_forget(ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path(".")) -> None:
    """Forget an entry: appends a tombstone (history stays until `maintain` purges it after the grace period)."""
    with MemoryStore.open(_settings(ctx), create=False) as store:
        v = store.forget(workspace, key)
    typer.echo(f"{key}: forgotten (tombstone version {v.version})")
