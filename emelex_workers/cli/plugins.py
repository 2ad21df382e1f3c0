"""`emelex plugins list`: what plugins are loaded, from which distribution, and what they provide."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..host.manager import distillers, get_plugin_manager, hook_order, summarizers
from .common import EmelexTyper, JsonFlag, echo_json, settings_of

plugins_app = EmelexTyper(help="Inspect the plugins Emelex loads.")


@plugins_app.command("list")
def plugins_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List loaded plugins with their distribution, hooks, summarizers and distillers."""
    settings = settings_of(ctx)
    pm = get_plugin_manager(settings)
    sums, dists = summarizers(pm), distillers(pm)
    rows = []
    for name, info in sorted(pm.plugin_info.items()):
        plugin = pm.get_plugin(name)
        hooks = sorted(c.name for c in pm.get_hookcallers(plugin) or [])
        rows.append({
            "name": name, "distribution": info.distribution, "version": info.version, "module": info.module,
            "builtin": info.builtin, "hooks": hooks,
            "summarizers": sorted(k for k, r in sums.items() if r.plugin == name),
            "distillers": sorted(k for k, r in dists.items() if r.plugin == name),
            "binds_models": any(i.plugin_name == name for i in hook_order(pm, "model_binding")),
        })
    skipped = [{"name": name, "distribution": info.distribution, "version": info.version, "module": info.module,
                "reason": reason} for name, (info, reason) in sorted(pm.skipped.items())]
    if as_json:
        echo_json("listed", {"autoload": settings.plugins_autoload, "plugins": rows, "skipped": skipped})
        return
    for r in rows:
        origin = f"{r['distribution']} {r['version']}".strip()
        origin += " (built-in)" if r["builtin"] else ""
        typer.echo(f"{r['name']}  from {origin}  [{r['module']}]")
        typer.echo(f"    hooks: {', '.join(r['hooks']) or '-'}")
        typer.echo(f"    summarizers: {', '.join(r['summarizers']) or '-'}")
        typer.echo(f"    distillers: {', '.join(r['distillers']) or '-'}")
    for s in skipped:
        typer.echo(f"{s['name']}  from {s['distribution']} {s['version']}  [{s['module']}]  not loaded: {s['reason']}")
    if not rows:
        typer.echo("no plugins loaded")


@plugins_app.command("new")
def plugins_new(
    name: Annotated[str, typer.Argument(metavar="NAME",
                                        help="The plugin's name: its entry point, summarizer and distiller.")],
    directory: Annotated[Path, typer.Option("--directory", "-d", metavar="DIR",
                                            help="Where to create the package's folder.")] = Path("."),
    as_json: JsonFlag = False,
) -> None:
    """Create a plugin package from the template: a summarizer, a distiller and a tool, with tests."""
    from ..plugin_template import new_plugin

    target = new_plugin(name, directory)
    if as_json:
        files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        echo_json("created", {"name": name, "directory": str(target), "files": files})
        return
    typer.echo(f"created {target}: a summarizer, a distiller and a tool named {name!r}, with tests")
    typer.echo(f"next: cd {target} && pip install -e . && python -m pytest tests && emelex plugins list")
