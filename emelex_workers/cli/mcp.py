"""`emelex mcp`: serve this workspace's memory to MCP clients over stdio (see docs/interop.md for the Claude Code,
Codex and Goose configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import WorkspaceOpt, settings_of


def mcp(
    ctx: typer.Context,
    workspace: WorkspaceOpt = Path("."),
    read_only: Annotated[bool, typer.Option(
        "--read-only", help="Offer only the tools that read (no remember, forget or pin).")] = False,
) -> None:
    """Serve the workspace's memory (search, recall, Knowledge, Sessions) to an MCP client over stdio; needs the
    `mcp` extra."""
    from ..interop.mcp_server import build_server, open_for_serving
    from . import version

    store, where = open_for_serving(settings_of(ctx), str(workspace), read_only=read_only)
    try:
        build_server(store, where, read_only=read_only, version=version()).run("stdio")
    except KeyboardInterrupt:
        pass
    finally:
        store.close()
