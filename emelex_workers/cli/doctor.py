"""`emelex memory doctor` and `emelex memory reinit`: the store's health checks, and explicit re-initialisation."""

from __future__ import annotations

from typing import Annotated

import typer

from emelex_memory import MemoryStore
from emelex_memory.maintenance.doctor import DOCTOR_ASSET_ENTRIES, diagnose

from .common import JsonFlag, echo_json, settings_of

# Facts a check line already prints (in text; JSON keeps them).
SHOWN_BY_CHECKS = ("pragmas", "connection_settings", "model_threads")


def doctor(
    ctx: typer.Context,
    max_assets: Annotated[int, typer.Option(
        "--max-assets", metavar="N", min=1,
        help="Asset entries to re-hash at most (the check says how many of how many).",
    )] = DOCTOR_ASSET_ENTRIES,
    as_json: JsonFlag = False,
) -> None:
    """Check Home, file modes, pragmas, connection settings, schema, integrity, transcripts, payloads, the search
    index and a bounded number of asset files; exit 1 when anything is wrong.

    Also says how many model threads the worker and chat would use here and why (chosen from the usable, idle
    cores unless `model_threads` is set; see `emelex_workers/models/threads.py`), and asks the plugins to try the default model here (llama.cpp: a few
    tokens generated in a child process)."""
    from ..models.threads import thread_choice

    settings = settings_of(ctx)
    report = diagnose(settings, max_asset_entries=max_assets)
    if report.no_store and not as_json:  # nothing to check: one line, like every other command here
        typer.echo(f"error: {report.checks[0].detail}", err=True)
        raise typer.Exit(1)
    if not report.no_store:
        choice = thread_choice(settings)
        report.facts["model_threads"] = choice.as_dict()
        report.add("model threads", True, choice.detail())  # advice: a busy machine is no fault of the store
        report.add(*_model_check(settings))
    if as_json:
        checks = [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in report.checks]
        echo_json("healthy" if report.healthy else "unhealthy",
                  {"healthy": report.healthy, "checks": checks, "facts": report.facts})
    else:
        for key, value in report.facts.items():
            if key not in SHOWN_BY_CHECKS:
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


def _model_check(settings) -> tuple[str, bool, str]:
    """Whether the worker's model (the installed `default_model`) runs on this machine, asked of the plugins
    through the `check_model` hook (the built-in llama.cpp plugin generates a few tokens in a child process,
    afresh: doctor never trusts a remembered pass). A model that cannot be found, or that no plugin checks, is
    reported as not checked; a plugin that fails while loading or checking (`PluginError`) as a failed check."""
    from emelex_memory import EmelexError, PluginError

    from ..host.manager import check_model, get_plugin_manager
    from ..models import ModelManager

    try:
        with ModelManager(settings) as manager:
            model = manager.default()
        check = check_model(get_plugin_manager(settings), model, settings)
    except PluginError as exc:
        return "model", False, str(exc)
    except EmelexError as exc:
        return "model", True, f"not checked: {exc}"
    if check is None:
        return "model", True, f"not checked: no installed plugin checks model {model.name!r}"
    return check.name, check.ok, check.detail
