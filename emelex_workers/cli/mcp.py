"""`emelex mcp`: serve this workspace's memory to MCP clients over stdio (see docs/interop.md for the Claude Code,
Codex and Goose configuration)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from .common import WorkspaceOpt, settings_of

INTERRUPTED = 130  # the exit status of a program Ctrl-C stopped
GRACE_S = 2.0  # how long a call under way may take to finish once Ctrl-C stopped the server


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
    if sys.stdin.isatty():
        typer.echo(f"emelex mcp: serving the memory of {where} to an MCP client over stdin and stdout; this is not a "
                   "prompt: let your agent start it (`claude mcp add emelex -- emelex mcp`). Ctrl-C stops it.",
                   err=True)
    signal.signal(signal.SIGINT, _interrupted)
    try:
        build_server(store, where, read_only=read_only, version=version()).run("stdio")
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED) from None
    finally:
        store.close()


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C: stop serving. The SDK's reader thread may be blocked on standard input until a line comes, which
    would hold the exit; past a short grace the process ends without it (a call under way is one store transaction:
    it commits whole or leaves nothing)."""
    timer = threading.Timer(GRACE_S, os._exit, (INTERRUPTED,))
    timer.daemon = True
    timer.start()
    raise KeyboardInterrupt
