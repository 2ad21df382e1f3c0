"""The plugin manager: hookspecs, entry-point loading, built-ins, tracing, and calling hooks plugin by plugin.

`get_plugin_manager(settings)` adds the hookspecs, loads the `emelex`
entry-point group (unless `plugins_autoload` is off), registers the built-in
plugins that were not loaded that way, then `check_pending()`. Every failure
of a plugin becomes a one-line `PluginLoadError` / `PluginHookError` naming the
plugin and its distribution, never a traceback. Hooks are called one plugin at
a time (through pluggy, so tracing still sees them) so that a failure or a
result can be attributed to the plugin that produced it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import time
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

import pluggy

from emelex_memory import (
    EmelexError,
    InstalledModel,
    PluginError,
    PluginHookError,
    PluginLoadError,
    UnknownPluginComponentError,
)
from emelex_memory.queue.runner import describe

from ..settings import WorkerSettings
from . import hookspecs
from .types import Distiller, ModelBinding, ModelCheck, Summarizer

ENTRY_POINT_GROUP = "emelex"
# (entry-point name, module)
BUILTIN_PLUGINS = (("llamacpp", "emelex_llamacpp.plugin"), ("openai", "emelex_openai.plugin"),
                   ("tools", "emelex_tools.plugin"), ("recall", "emelex_tools.memory"))
BUILTIN_DISTRIBUTION = "emelex-memory"
BINDING_MEMBERS = ("model", "context_window", "count_tokens", "chat", "close")
MAX_MESSAGE = 300  # characters of a plugin's own error text in our one-line messages

T = TypeVar("T")


@dataclass(frozen=True)
class PluginInfo:
    """One registered plugin: its name, the distribution (and version) it came from, its module, and whether it
    is one of Emelex's own (`BUILTIN_PLUGINS`), loaded by its entry point or, when autoload is off or that entry
    point is missing, registered directly."""

    name: str
    distribution: str
    version: str
    module: str
    builtin: bool


class EmelexPluginManager(pluggy.PluginManager):
    """A pluggy `PluginManager` for project "emelex" that remembers where each plugin came from (`plugin_info`),
    which installed plugins it left out and why (`skipped`: name -> `PluginInfo` and reason), and, when tracing,
    where trace lines go (`tracer`)."""

    def __init__(self) -> None:
        """An empty manager; use `get_plugin_manager` for a loaded one."""
        super().__init__(hookspecs.PROJECT_NAME)
        self.plugin_info: dict[str, PluginInfo] = {}
        self.skipped: dict[str, tuple[PluginInfo, str]] = {}
        self.tracer: Tracer | None = None
        self.settings: WorkerSettings | None = None  # what the registration hooks are given

    def add_plugin(self, plugin: object, info: PluginInfo) -> None:
        """Register `plugin` under `info.name`, or raise `PluginLoadError` naming it and its distribution."""
        try:
            self.register(plugin, name=info.name)
        except Exception as exc:
            raise PluginLoadError(_load_message(info, exc)) from None
        self.plugin_info[info.name] = info


def _short(exc: BaseException) -> str:
    text = describe(exc)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def plugin_call(call: Callable[[], T], failed: str, keep: type[Exception] = EmelexError) -> T:
    """Run `call`, which runs plugin code (a hook, a summarizer, a distiller, a model binding), and return its result.

    Every call into a plugin goes through here. An exception of type `keep`
    (by default any `EmelexError`: a plugin's typed errors carry their retry
    rules) passes through; any other becomes one `PluginHookError` reading
    `<failed>: <exception type>: <its message, cut at MAX_MESSAGE>`, where
    `failed` names the plugin and what it was doing.
    """
    try:
        return call()
    except keep:
        raise
    except Exception as exc:
        raise PluginHookError(f"{failed}: {_short(exc)}") from None


def _load_message(info: PluginInfo, exc: BaseException) -> str:
    if info.builtin:
        way_out = "reinstall emelex-memory"
    else:
        way_out = f"fix or uninstall {info.distribution}, or set EMELEX_PLUGINS_SKIP={info.name}"
    return f"plugin {info.name!r} from {info.distribution} {info.version} failed to load: {_short(exc)}; {way_out}"


def plugin_names(value: str | None) -> list[str] | None:
    """The plugin names of a `plugins_load` / `plugins_skip` setting (comma-separated), or None when unset."""
    return None if value is None else [n for n in value.split(",") if n]


def get_plugin_manager(settings: WorkerSettings) -> EmelexPluginManager:
    """A plugin manager with the hookspecs, the `emelex` entry-point plugins (when `plugins_autoload`; only those
    `plugins_load` names when it is set; never those `plugins_skip` names) and the built-ins, checked with
    `check_pending()`. With `plugins_trace` every plugin call is written to stderr (`Tracer`).

    Raises `PluginLoadError` naming a plugin that fails to load, and `UnknownPluginComponentError` when
    `plugins_load` names a plugin no installed distribution provides."""
    pm = EmelexPluginManager()
    pm.settings = settings
    pm.add_hookspecs(hookspecs)
    if settings.plugins_trace:
        pm.tracer = Tracer(pm)
        pm.add_hookcall_monitoring(pm.tracer.before, pm.tracer.after)
    if settings.plugins_autoload:
        load_entry_points(pm, only=plugin_names(settings.plugins_load), skip=plugin_names(settings.plugins_skip) or [])
    for name, module in BUILTIN_PLUGINS:
        if not pm.has_plugin(name):
            info = PluginInfo(name, BUILTIN_DISTRIBUTION, _version(BUILTIN_DISTRIBUTION), module, True)
            try:
                plugin = importlib.import_module(module)
            except Exception as exc:
                raise PluginLoadError(_load_message(info, exc)) from None
            pm.add_plugin(plugin, info)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        info = pm.plugin_info.get(name, PluginInfo(name, "an unknown distribution", "", "", False))
        raise PluginLoadError(_load_message(info, exc)) from None
    return pm


def load_entry_points(pm: EmelexPluginManager, *, only: list[str] | None = None, skip: list[str] = ()) -> int:
    """Load and register every plugin of the `emelex` entry-point group; return how many were registered.

    A third-party plugin whose name is in `skip`, or not in `only` (when given), is not imported: it is recorded
    in `pm.skipped` with the reason. Built-in plugins always load. A name in `only` that no installed
    distribution provides is an `UnknownPluginComponentError` listing the installed ones."""
    count, seen = 0, set()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        name = dist.name if dist else "an unknown distribution"
        builtin = name == BUILTIN_DISTRIBUTION and (ep.name, ep.value) in BUILTIN_PLUGINS
        info = PluginInfo(ep.name, name, dist.version if dist else "", ep.value, builtin)
        seen.add(ep.name)
        if pm.is_blocked(ep.name):
            continue
        if not builtin and ep.name in skip:
            pm.skipped[ep.name] = (info, "left out by EMELEX_PLUGINS_SKIP")
            continue
        if not builtin and only is not None and ep.name not in only:
            pm.skipped[ep.name] = (info, "not named by EMELEX_PLUGINS_LOAD")
            continue
        if pm.has_plugin(ep.name):
            other = pm.plugin_info[ep.name]
            if other.distribution == info.distribution:
                continue
            raise PluginLoadError(
                f"plugin name {ep.name!r} is provided by both {other.distribution} and {info.distribution}; "
                "uninstall one of them"
            )
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginLoadError(_load_message(info, exc)) from None
        pm.add_plugin(plugin, info)
        count += 1
    missing = sorted(set(only or ()) - seen)
    if missing:
        installed = ", ".join(sorted(seen - {n for n, _ in BUILTIN_PLUGINS})) or "none"
        raise UnknownPluginComponentError(
            f"EMELEX_PLUGINS_LOAD names {', '.join(map(repr, missing))}, which no installed distribution provides "
            f"(installed third-party plugins: {installed}); install it or correct the name")
    return count


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(source tree)"


# -- tracing ----------------------------------------------------------------------------------------------

TRACE_PREFIX = "emelex-trace: "
BRIEF_CHARS = 60  # characters of a string argument or result a trace line shows


def brief(value: object, depth: int = 0) -> str:
    """`value` in a few words for a trace line: short values as they are, a long string cut with its length, a
    collection by its size, an event, job or model by what it is, a request by its fields."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= BRIEF_CHARS else f"{value[:BRIEF_CHARS]!r}... ({len(value)} chars)"
    kind, ident = getattr(value, "kind", None), getattr(value, "id", None)
    if isinstance(value, tuple) and hasattr(value, "payload_json"):  # an Event
        return f"<{value.kind} event seq {value.seq}>"
    if isinstance(kind, str) and isinstance(ident, str) and hasattr(value, "attempts"):  # a Job
        return f"<{kind} job {ident}>"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{len(value)} items>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and depth == 0:
        fields = (f"{f.name}={brief(getattr(value, f.name), 1)}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({', '.join(fields)})"
    if callable(value) and hasattr(value, "__name__"):
        return f"<function {value.__name__}>"
    name = getattr(value, "name", None)
    return f"<{type(value).__name__} {name}>" if isinstance(name, str) else f"<{type(value).__name__}>"


class Tracer:
    """Writes a line to stderr (`write`) as each plugin call starts and another as it ends, each prefixed
    `emelex-trace: `: the hook (or the summarizer or distiller), the plugin with its distribution, the arguments
    in brief (`brief`), then what it returned or raised and how long it took. Installed on a manager by
    `get_plugin_manager` with `plugins_trace`."""

    def __init__(self, pm: EmelexPluginManager, write: Callable[[str], object] | None = None) -> None:
        """Trace the calls of `pm`'s plugins to `write` (default: stderr)."""
        self.pm = pm
        self.write = write or sys.stderr.write
        self._started: list[float] = []

    def plugin(self, name: str) -> str:
        """`plugin 'NAME' (DISTRIBUTION VERSION)`."""
        info = self.pm.plugin_info.get(name)
        where = f" ({info.distribution} {info.version})".rstrip() if info else ""
        return f"plugin {name!r}{where}"

    def _line(self, text: str) -> None:
        try:
            self.write(f"{TRACE_PREFIX}{text}\n")
        except Exception:  # a closed or broken stderr never fails a plugin call
            pass

    def called(self, what: str, plugins: list[str], kwargs: dict[str, Any]) -> None:
        """A call of `what` on `plugins` starts with `kwargs`."""
        self._started.append(time.perf_counter())
        args = ", ".join(f"{k}={brief(v)}" for k, v in kwargs.items())
        self._line(f"{what} -> {', '.join(map(self.plugin, plugins)) or 'no plugin'}: ({args})")

    def returned(self, what: str, plugins: list[str], result: object = None, error: BaseException | None = None) -> None:
        """The call of `what` on `plugins` ended with `result`, or raised `error`."""
        took = (time.perf_counter() - self._started.pop()) * 1000 if self._started else 0.0
        ended = f"raised {type(error).__name__}: {_short(error)}" if error is not None else f"returned {brief(result)}"
        self._line(f"{what} <- {', '.join(map(self.plugin, plugins)) or 'no plugin'}: {ended} in {took:.1f} ms")

    def before(self, hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        """pluggy's `before` monitor: a hook call starts."""
        self.called(f"hook {hook_name}", [i.plugin_name for i in hook_impls], kwargs)

    def after(self, outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        """pluggy's `after` monitor: a hook call ended."""
        error = outcome.exception
        result = None if error is not None else outcome.get_result()
        if isinstance(result, list) and len(hook_impls) == 1:  # one plugin's answer (pluggy drops a None)
            result = result[0] if result else None
        self.returned(f"hook {hook_name}", [i.plugin_name for i in hook_impls], result, error)


def traced(pm: EmelexPluginManager | None, what: str, plugin: str, kwargs: dict[str, Any],
           call: Callable[[], T]) -> T:
    """`call()`, traced as a call of `what` on `plugin` with `kwargs` when `pm` traces (see `Tracer`)."""
    tracer = pm.tracer if pm is not None else None
    if tracer is None:
        return call()
    tracer.called(what, [plugin], kwargs)
    try:
        result = call()
    except BaseException as exc:
        tracer.returned(what, [plugin], error=exc)
        raise
    tracer.returned(what, [plugin], result)
    return result


# -- calling hooks plugin by plugin ------------------------------------------------------------------------


def hook_order(pm: EmelexPluginManager, hook: str) -> list[Any]:
    """The implementations of `hook` in the order pluggy calls them (tryfirst and last registered first)."""
    return list(reversed(getattr(pm.hook, hook).get_hookimpls()))


def call_one(pm: EmelexPluginManager, hook: str, impl: Any, **kwargs: Any) -> Any:
    """Call hook `hook` on the plugin of `impl` alone, through pluggy; return what pluggy returns.

    Any exception but a `PluginError` becomes `PluginHookError` naming the plugin.
    """
    others = [p for p in pm.get_plugins() if p is not impl.plugin]
    return plugin_call(lambda: pm.subset_hook_caller(hook, others)(**kwargs),
                       f"plugin {impl.plugin_name!r} failed in hook {hook}", keep=PluginError)


@dataclass(frozen=True)
class Registered:
    """A summarizer or distiller and the plugin that registered it."""

    plugin: str
    component: Summarizer | Distiller


def _collect(pm: EmelexPluginManager, hook: str, kind: type) -> dict[str, Registered]:
    found: dict[str, Registered] = {}
    for impl in hook_order(pm, hook):

        def register(component: object, plugin: str = impl.plugin_name) -> None:
            if not isinstance(component, kind) or not isinstance(component.name, str) or not component.name:
                raise PluginHookError(f"plugin {plugin!r} registered {component!r}, not a named {kind.__name__}")
            if component.name in found:
                both = [pm.plugin_info.get(p) for p in (found[component.name].plugin, plugin)]
                dists = sorted({i.distribution for i in both if i is not None and not i.builtin})
                way_out = (f"uninstall {' or '.join(dists)}, or leave one out with EMELEX_PLUGINS_SKIP" if dists
                           else "uninstall one of them")
                raise PluginHookError(
                    f"{kind.__name__.lower()} {component.name!r} is registered by both "
                    f"{_origin(pm, found[component.name].plugin)} and {_origin(pm, plugin)}; {way_out}"
                )
            found[component.name] = Registered(plugin, component)

        call_one(pm, hook, impl, register=register, settings=pm.settings)
    return found


def _origin(pm: EmelexPluginManager, plugin: str) -> str:
    info = pm.plugin_info.get(plugin)
    return f"plugin {plugin!r} from {info.distribution} {info.version}" if info else f"plugin {plugin!r}"


def summarizers(pm: EmelexPluginManager) -> dict[str, Registered]:
    """Every registered summarizer by name."""
    return _collect(pm, "register_summarizers", Summarizer)


def distillers(pm: EmelexPluginManager) -> dict[str, Registered]:
    """Every registered distiller by name."""
    return _collect(pm, "register_distillers", Distiller)


def choose(found: dict[str, Registered], name: str, what: str) -> Registered:
    """The component called `name`, or `UnknownPluginComponentError` listing what is available."""
    try:
        return found[name]
    except KeyError:
        known = ", ".join(sorted(found)) or "none"
        raise UnknownPluginComponentError(
            f"no {what} named {name!r} is registered (available: {known}); install its plugin or set "
            f"EMELEX_{what.upper()} to one of them"
        ) from None


def accepts_keyword(call: Callable[..., Any], name: str) -> bool:
    """True when `call` takes a keyword argument `name` (by name, or through `**kwargs`): how the host finds out
    whether a binding offers an optional keyword (`chat`'s `on_token`, `stream_chat`'s `on_progress`)."""
    try:
        params = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def is_model_binding(obj: object) -> bool:
    """True when `obj` has every member of `ModelBinding`, checked without running properties (which may load)."""
    return all(inspect.getattr_static(obj, name, None) is not None for name in BINDING_MEMBERS)


def check_model(pm: EmelexPluginManager, model: InstalledModel, settings: WorkerSettings) -> ModelCheck | None:
    """Ask plugins, first come first served, to try `model` here (the `check_model` hook); None when none answers.

    Raises `PluginHookError` when one fails or answers with something that is not a `ModelCheck`.
    """
    for impl in hook_order(pm, "check_model"):
        check = call_one(pm, "check_model", impl, model=model, settings=settings)
        if check is None:
            continue
        if not isinstance(check, ModelCheck):
            raise PluginHookError(
                f"plugin {impl.plugin_name!r} answered check_model with a {type(check).__name__}, not a ModelCheck")
        return check
    return None


def bind_model(pm: EmelexPluginManager, model: InstalledModel, settings: WorkerSettings,
               stop: threading.Event | None = None) -> tuple[str, ModelBinding]:
    """Ask plugins, first come first served, for a binding of `model`; return (plugin name, binding). `stop` is the
    event the binding checks while it loads and runs the model (see the hook; default: one never set).

    Raises `UnknownPluginComponentError` when no plugin answers and
    `PluginHookError` when one fails or answers with something that is not
    a `ModelBinding`.
    """
    for impl in hook_order(pm, "model_binding"):
        binding = call_one(pm, "model_binding", impl, model=model, settings=settings,
                           stop=threading.Event() if stop is None else stop)
        if binding is None:
            continue
        if not is_model_binding(binding):
            raise PluginHookError(
                f"plugin {impl.plugin_name!r} answered model_binding with a {type(binding).__name__}, "
                "not a ModelBinding"
            )
        return impl.plugin_name, binding
    raise UnknownPluginComponentError(
        f"no plugin can run model {model.name!r} ({model.model_file.name}); install a plugin that binds it"
    )
