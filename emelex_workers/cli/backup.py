"""`emelex memory backup DEST` / `backup --verify DEST` and `emelex memory restore SRC`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from emelex_memory.maintenance.backup import RESTORED_MODELS, backup_store, restore_backup, verify_backup

from .common import JsonFlag, echo_json, given_path, open_store, settings_of


def _say(what: str, report, as_json: bool) -> None:
    if as_json:
        data = dataclasses.asdict(report)
        data["path"] = str(report.path)
        echo_json(what.split()[0], data)
        return
    typer.echo(f"{what} {report.path}: database {report.database_bytes} bytes (sha256 {report.database_sha256[:12]}), "
               f"{report.counts.get('events', 0)} events, {report.assets} assets ({report.asset_bytes} bytes"
               f"{f', {report.assets_copied} copied' if what == 'backed up to' else ''}), {report.models} model manifests")


def backup(
    ctx: typer.Context,
    dest: Annotated[Path, typer.Argument(metavar="DEST", parser=given_path, help="A new or empty directory outside Emelex Home, or an earlier backup.")],
    verify: Annotated[bool, typer.Option("--verify", help="Only re-check the backup at DEST; change nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Write a consistent, verified copy of the store, its assets and model manifests to DEST (incremental).

    Other processes may keep writing meanwhile. The manifest with every digest is written last: a backup
    without it (interrupted) is refused by --verify and restore.
    """
    if verify:
        _say("verified", verify_backup(dest), as_json)
        return
    with open_store(ctx) as store:
        _say("backed up to", backup_store(store, dest), as_json)


def restore(
    ctx: typer.Context,
    src: Annotated[Path, typer.Argument(metavar="SRC", parser=given_path, help="A complete backup made by `emelex memory backup`.")],
    as_json: JsonFlag = False,
) -> None:
    """Verify the backup at SRC, then restore it into Emelex Home, which must be empty (never over a store)."""
    settings = settings_of(ctx)
    report = restore_backup(src, settings)
    _say("restored from", report, as_json)
    if report.models and not as_json:
        typer.echo(f"  the model manifests are in {settings.home_dir / RESTORED_MODELS} for reference; a backup holds "
                   "no model files: install the models again (`emelex models install`, or `models add-server`)")
