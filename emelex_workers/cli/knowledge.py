"""`emelex memory knowledge ...`: list, show, history, remember, pin, unpin and forget workspace Knowledge.

Every command works on the Knowledge of one workspace, the current directory
unless `--workspace` says otherwise; Knowledge is scoped by the directory's
identity, so another directory never sees it.
"""

from __future__ import annotations

import time

from pathlib import Path
from typing import Annotated

import typer

from emelex_memory import (
    KnowledgeEntry, KnowledgeHistoryPage, KnowledgePage, KnowledgeVersion, MemoryStore, describe_producer,
)
from emelex_memory.core.cursors import MAX_SQL_INT

from .common import (
    CursorOpt, EmelexTyper, JsonFlag, WorkspaceOpt, echo_json, echo_page, open_store, page_limit, read_listing,
    settings_of, when,
)

knowledge_app = EmelexTyper(help="Inspect and curate the current workspace's Knowledge.")

KeyArg = Annotated[str, typer.Argument(metavar="KEY", help="Knowledge key.", show_default=False)]


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
        "producer": v.producer,
        "said_at": v.said_at,
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


def said_on(ts: float) -> str:
    """The local date a statement was said, `YYYY-MM-DD`."""
    return time.strftime("%Y-%m-%d", time.localtime(ts))


def _entry_line(e: KnowledgeEntry) -> str:
    flags = ("pinned " if e.pinned else "") + ("forgotten " if e.tombstoned else "")
    text = (e.content or "").replace("\n", " ")
    return f"{e.key}  {said_on(e.head.said_at)}  v{e.head.version}  conf {e.confidence:.2f}  {flags}{text[:120]}".rstrip()


@knowledge_app.command("list")
def knowledge_list(
    ctx: typer.Context,
    workspace: WorkspaceOpt = Path("."),
    include_forgotten: Annotated[bool, typer.Option("--all", help="Include forgotten (tombstoned) entries.")] = False,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Entries per page.")] = 50,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List the workspace's Knowledge by key (none on a Home without a store yet)."""
    page = read_listing(ctx, lambda store: store.recall(workspace, cursor=cursor, limit=limit,
                                                         include_tombstones=include_forgotten), KnowledgePage([], None))
    echo_page(
        "entries", page.entries, page.next_cursor, as_json,
        as_dict=entry_dict, line=_entry_line, empty="no Knowledge in this workspace",
    )


@knowledge_app.command("show")
def knowledge_show(
    ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path("."), as_json: JsonFlag = False
) -> None:
    """Show one entry, forgotten or not, with its provenance."""
    with open_store(ctx) as store:
        e = store.get_knowledge(workspace, key)
    if as_json:
        echo_json("found", entry_dict(e))
        return
    typer.echo(f"Knowledge {e.key}")
    typer.echo(f"  state:      {'forgotten' if e.tombstoned else 'live'}{', pinned' if e.pinned else ''}")
    typer.echo(f"  said:       {when(e.head.said_at)}")
    typer.echo(f"  version:    {e.head.version} by {e.head.origin}, {when(e.head.created_at)}")
    typer.echo(f"  confidence: {e.confidence:.2f}")
    typer.echo(f"  source:     {_source_line(e.head)}")
    if e.content is not None:
        typer.echo(f"  content:    {e.content}")


@knowledge_app.command("history")
def knowledge_history(
    ctx: typer.Context,
    key: KeyArg,
    workspace: WorkspaceOpt = Path("."),
    after: Annotated[int, typer.Option(
        metavar="VERSION", min=0, max=MAX_SQL_INT, help="Show versions after this version number.")] = 0,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Versions to show.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Show an entry's immutable versions, oldest first (none on a Home without a store yet)."""
    page = read_listing(ctx, lambda store: store.knowledge_history(workspace, key, after, limit=limit),
                        KnowledgeHistoryPage([], after, True))
    if as_json:
        versions = [version_dict(v) for v in page.versions]
        echo_json("listed", {"key": key, "versions": versions, "next_cursor": page.next_cursor, "done": page.done})
        return
    if not page.versions:
        typer.echo(f"no versions of {key}" + (f" after v{after}" if after else ""))
    for v in page.versions:
        what = "TOMBSTONE" if v.tombstone else (v.content or "").replace("\n", " ")[:120]
        typer.echo(f"v{v.version:<4} said {said_on(v.said_at)}, {when(v.created_at)}  {v.origin:<12} "
                   f"conf {v.confidence:.2f}  {what}")
        typer.echo(f"      source: {_source_line(v)}")
        if v.producer:
            typer.echo(f"      by:     {describe_producer(v.producer)}")
    if not page.done:
        typer.echo(f"more: --after {page.next_cursor}")


@knowledge_app.command("remember")
def knowledge_remember(
    ctx: typer.Context,
    key: KeyArg,
    content: Annotated[str, typer.Argument(
        metavar="CONTENT", show_default=False, help="What to remember under KEY (replaces the current content).")],
    workspace: WorkspaceOpt = Path("."),
    confidence: Annotated[float, typer.Option(metavar="X", min=0.0, max=1.0, help="Confidence between 0 and 1.")] = 1.0,
    new_workspace: Annotated[bool, typer.Option(
        "--new-workspace",
        help="The directory is a new workspace, although another one was last seen at its path (not a re-clone).",
    )] = False,
    as_json: JsonFlag = False,
) -> None:
    """Remember or correct an entry: appends a new version."""
    with MemoryStore.open(settings_of(ctx)) as store:
        v = store.remember(workspace, key, content, confidence=confidence, new_workspace=new_workspace)
    if as_json:
        echo_json("remembered", {"key": key, **version_dict(v)})
    else:
        typer.echo(f"{key}: version {v.version}")


def _set_pin(ctx: typer.Context, key: str, workspace: Path, pinned: bool, as_json: bool) -> None:
    with open_store(ctx) as store:
        entry = store.pin(workspace, key) if pinned else store.unpin(workspace, key)
    outcome = "pinned" if pinned else "unpinned"
    if as_json:
        echo_json(outcome, entry_dict(entry))
    else:
        typer.echo(f"{key}: {outcome}")


@knowledge_app.command("pin")
def knowledge_pin(
    ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path("."), as_json: JsonFlag = False
) -> None:
    """Pin an entry: automatic distillation and retention leave it alone."""
    _set_pin(ctx, key, workspace, True, as_json)


@knowledge_app.command("unpin")
def knowledge_unpin(
    ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path("."), as_json: JsonFlag = False
) -> None:
    """Unpin an entry."""
    _set_pin(ctx, key, workspace, False, as_json)


@knowledge_app.command("forget")
def knowledge_forget(
    ctx: typer.Context, key: KeyArg, workspace: WorkspaceOpt = Path("."), as_json: JsonFlag = False
) -> None:
    """Forget an entry: appends a tombstone (history stays until `maintain` purges it after the grace period)."""
    with open_store(ctx) as store:
        v = store.forget(workspace, key)
    if as_json:
        echo_json("forgotten", {"key": key, **version_dict(v)})
    else:
        typer.echo(f"{key}: forgotten (tombstone version {v.version})")
