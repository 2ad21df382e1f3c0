"""`emelex memory maintain`: bounded housekeeping, retention and WAL/VACUUM maintenance."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from emelex_memory import MaintenanceError, MaintenanceReport

from .common import JsonFlag, echo_json, error_text, open_store

_LINES = (
    ("leases_failed", "stale Session leases marked failed"),
    ("jobs_rescued", "expired worker claims rescued"),
    ("sessions_deleted", "idle Sessions deleted"),
    ("knowledge_tombstoned", "Knowledge entries tombstoned by retention"),
    ("knowledge_purged", "tombstoned Knowledge entries deleted after the grace period"),
    ("versions_pruned", "old Knowledge versions pruned"),
    ("model_states_removed", "saved model states removed (over the bound)"),
    ("asset_entries_removed", "unreferenced asset entries removed"),
    ("asset_files_removed", "asset files removed"),
    ("asset_bytes_freed", "asset bytes freed"),
)


def maintain(
    ctx: typer.Context,
    vacuum: Annotated[bool, typer.Option("--vacuum", help="Also rewrite the database, dropping free pages.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Report what would be done (file removal is not predicted); change nothing."
    )] = False,
    as_json: JsonFlag = False,
) -> None:
    """Fail stale leases, apply retention, prune versions, collect assets, optimize and truncate the WAL.

    Every step is capped (`maintain_batch`) and commits on its own; run again while it says more remains,
    or after a step failed (the steps completed before it are listed). Never touches live leases or pinned
    Knowledge. Retention periods are settings (see docs/knowledge.md).
    """
    failure = None
    with open_store(ctx) as store:
        try:
            report = store.maintain(vacuum=vacuum, dry_run=dry_run)
        except MaintenanceError as exc:
            failure, report = exc, exc.report
    if failure is not None:
        typer.echo(error_text(type(failure).__name__, str(failure), as_json), err=True)
    if as_json:
        outcome = "failed" if failure is not None else "dry-run" if dry_run else "maintained"
        echo_json(outcome, dataclasses.asdict(report))
    elif failure is not None:
        typer.echo(f"completed: {', '.join(report.steps_completed) or 'no step'}")
    else:
        _print(report, dry_run)
    if failure is not None:
        raise typer.Exit(1)


def _print(report: MaintenanceReport, dry_run: bool) -> None:
    """The report of a completed run (or dry run), one count per line."""
    if dry_run:
        typer.echo("dry run: nothing was changed; a real run would do this (file removal is not predicted):")
    for field, label in _LINES:
        value = getattr(report, field)
        if value is None:
            typer.echo(f"{'-':>8}  {label}: not predicted by a dry run")
        else:
            typer.echo(f"{value:>8}  {label}")
    if not dry_run:
        done = [name for name, flag in (("optimized", report.optimized), ("vacuumed", report.vacuumed)) if flag]
        wal = "WAL truncated" if report.wal_truncated else "WAL not truncated (readers busy; run again later)"
        typer.echo(f"database: {', '.join(done)}; {wal}")
    if report.more:
        typer.echo("more remains: run `emelex memory maintain` again")
