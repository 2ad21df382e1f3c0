"""`emelex memory workspaces ...`: list the known workspaces, show one with its rebind history, and rebind one to a
directory (audited)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from emelex_memory import WorkspaceInfo, WorkspacePage
from emelex_memory.core.cursors import MAX_SQL_INT

from .common import CursorOpt, EmelexTyper, JsonFlag, echo_json, echo_page, given_path, open_store, page_limit, read_listing, when

workspaces_app = EmelexTyper(help="List known workspaces; rebind one whose directory was replaced (e.g. re-cloned).")
WorkspaceIdArg = Annotated[int, typer.Argument(  # an ID below 1 is a usage error (exit 2), like a non-integer
    metavar="WORKSPACE_ID", min=1, max=MAX_SQL_INT, show_default=False, help="ID from `workspaces list`.")]


def _line(w: WorkspaceInfo) -> str:
    return (f"{w.id:>4}  {w.status:<10} {w.sessions:>4} Sessions  {w.knowledge:>4} Knowledge  {w.rebinds:>3} rebinds  "
            f"{w.path or '(path unknown)'}")


def _identity(path: str | None, device: int, inode: int, generation: int | None, birth_ns: int | None) -> str:
    return (f"{path or '(path unknown)'} (device {device}, inode {inode}, generation "
            f"{'-' if generation is None else generation}, birth {'-' if birth_ns is None else birth_ns})")


@workspaces_app.command("list")
def workspaces_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Workspaces per page.")] = 50,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List known workspaces: ID, whether the path still is that directory (present), another one (replaced) or
    nothing (missing), and their Session and live Knowledge counts (none on a Home without a store yet)."""
    page = read_listing(ctx, lambda store: store.list_workspaces(cursor=cursor, limit=limit), WorkspacePage([], None))
    echo_page("workspaces", page.workspaces, page.next_cursor, as_json,
              as_dict=dataclasses.asdict, line=_line, empty="no known workspaces")


@workspaces_app.command("show")
def workspaces_show(
    ctx: typer.Context,
    workspace_id: WorkspaceIdArg,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Rebind records per page.")] = 50,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Show one workspace: its identity, status and counts, and its rebind history (who, when, from what), oldest
    first."""
    with open_store(ctx) as store:
        w = store.get_workspace(workspace_id)
        page = store.workspace_rebinds(workspace_id, cursor=cursor, limit=limit)
    if as_json:
        rebinds = [dataclasses.asdict(r) for r in page.rebinds]
        echo_json("workspace", {"workspace": dataclasses.asdict(w), "rebinds": rebinds, "next_cursor": page.next_cursor})
        return
    typer.echo(f"workspace {w.id}: {w.status}, {w.sessions} Sessions, {w.knowledge} Knowledge, {w.rebinds} rebinds")
    typer.echo(f"  directory: {_identity(w.path, w.device, w.inode, w.generation, w.birth_ns)}")
    typer.echo(f"  known since {when(w.created_at)}")
    for r in page.rebinds:
        retired = f"; retired the empty workspace {r.retired}" if r.retired else ""
        typer.echo(f"  rebound {when(r.rebound_at)} by {r.rebound_by}{retired}")
        typer.echo(f"    from {_identity(r.old_path, r.old_device, r.old_inode, r.old_generation, r.old_birth_ns)}")
        typer.echo(f"    to   {_identity(r.new.path, r.new.device, r.new.inode, r.new.generation, r.new.birth_ns)}")
    if page.next_cursor:
        typer.echo(f"  more: --cursor {page.next_cursor}")


@workspaces_app.command("rebind")
def workspaces_rebind(
    ctx: typer.Context,
    workspace_id: WorkspaceIdArg,
    directory: Annotated[Path, typer.Argument(
        metavar="DIRECTORY", show_default=False, parser=given_path, help="The directory that now is this workspace.")],
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the directory takes over the workspace.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Make DIRECTORY workspace WORKSPACE_ID: its Sessions resume and its Knowledge is recalled there. Recorded with
    who, when and both identities. Refused while one of its Sessions is leased or DIRECTORY is another workspace."""
    with open_store(ctx) as store:
        r = store.rebind_workspace(workspace_id, directory, confirm=yes)
    if as_json:
        echo_json("rebound" if r.changed else "unchanged", dataclasses.asdict(r))
    elif r.changed:
        retired = f"; the empty workspace {r.retired} it was until now is retired" if r.retired else ""
        typer.echo(f"workspace {r.workspace_id} is now {r.new.path} (was {r.old_path or 'unknown'}); "
                   f"recorded as rebound by {r.rebound_by}{retired}")
    else:
        typer.echo(f"workspace {r.workspace_id} already is {r.new.path}; nothing to rebind")
