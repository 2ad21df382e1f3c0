"""`emelex memory doctor` and `emelex memory reinit`: the store's health checks, and explicit re-initialisation."""

from __future__ import annotations

from typing import Annotated

import typer

from emelex_memory import MemoryStore
from emelex_memory.maintenance.doctor import DOCTOR_ASSET_ENTRIES, diagnose

from .common import JsonFlag, echo_json, settings_of


def doctor(
    ctx: typer.Context,
    max_assets: Annotated[int, typer.Option(
        "--max-assets", metavar="N", min=1,
        help="Asset entries to re-hash at most (the check says how many of how many).",
    )] = DOCTOR_ASSET_ENTRIES,
    as_json: JsonFlag = False,
) -> None:
    """Check Home, file modes, pragmas, connection settings, schema, integrity, transcripts, payloads, the search
    index and a bounded number of asset files; exit 1 when anything is wrong."""
    report = diagnose(settings_of(ctx), max_asset_entries=max_assets)
    if report.no_store and not as_json:  # nothing to check: one line, like every other command here
        typer.echo(f"error: {report.checks[0].detail}", err=True)
        raise typer.Exit(1)
    if as_json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in report.checks]
        echo_json("healthy" if report.healthy else "unhealthy",
                  {"healthy": report.healthy, "checks": checks, "facts": report.facts})
    else:
        for key, value in report.facts.items():
            typer.echo(f"{key}: {value}")
        for c in report.checks:
            typer.echo(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        typer.echo("healthy" if report.healthy else "NOT healthy: fix the FAIL lines above")
    if not report.healthy:
        raise typer.Exit(1)


def reinit(
    ctx: typer.Context,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: start a new, empty store after a deletion.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Start a new store where the database was deleted. Refuses while a database file exists."""
    settings = settings_of(ctx)
    moved = MemoryStore.reinitialize(settings, confirm=yes)
    MemoryStore.open(settings).close()
    if as_json:
        echo_json("created", {"database": str(settings.database_path), "moved_aside": [str(p) for p in moved]})
        return
    for path in moved:
        typer.echo(f"moved leftover {path.name.split('.orphaned')[0]} aside to {path}")
    typer.echo(f"created a new, empty store at {settings.database_path}")
