"""`emelex config show`: the effective settings and where each came from (default, config.toml, environment)."""

from __future__ import annotations

import typer

from emelex_memory.core.settings import setting_sources, unknown_environment

from .common import EmelexTyper, JsonFlag, echo_json, settings_of

config_app = EmelexTyper(help="Show the effective settings and where each came from.")


UNSET = {"model_threads": "unset (chosen when work starts)"}  # what an unset value means, where it means more


@config_app.command("show")
def config_show(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Print every setting's value and its source: the default, config.toml (path and line) or an EMELEX_* variable;
    then any EMELEX_* variable that is no setting (ignored), with the nearest setting's name."""
    settings = settings_of(ctx)
    sources = setting_sources(settings)
    values = {name: getattr(settings, name) for name in sources}
    values["home"] = settings.home_dir
    unknown = [{"name": name, "nearest": nearest} for name, nearest in unknown_environment(type(settings))]
    if as_json:
        echo_json("shown", {
            "config_file": str(settings.home_dir / "config.toml"),
            "settings": [{"name": n, "value": str(values[n]) if n == "home" else values[n], "source": s.source,
                          "where": s.where} for n, s in sources.items()],
            "unknown_environment": unknown,
        })
        return
    shown = {name: UNSET.get(name, "unset") if value is None else str(value) for name, value in values.items()}
    name_width = max(map(len, sources))
    value_width = max(map(len, shown.values()))
    for name, source in sources.items():
        typer.echo(f"{name:<{name_width}}  {shown[name]:<{value_width}}  {source}")
    for variable in unknown:
        hint = f"; did you mean {variable['nearest']}?" if variable["nearest"] else ""
        typer.echo(f"{variable['name']}: not a setting, ignored{hint}")
