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

import importlib
import inspect
import sys
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
    """A pluggy `PluginManager` for project "emelex" that remembers where each plugin came from."""

    def __init__(self) -> None:
        """An empty manager; use `get_plugin_manager` for a loaded one."""
        super().__init__(hookspecs.PROJECT_NAME)
        self.plugin_info: dict[str, PluginInfo] = {}

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
    return (
        f"plugin {info.name!r} from {info.distribution} {info.version} failed to load: {_short(exc)}; fix or "
        f"uninstall {info.distribution}, or set EMELEX_PLUGINS_AUTOLOAD=0"
    )


def get_plugin_manager(settings: WorkerSettings) -> EmelexPluginManager:
    """A plugin manager with the hookspecs, the `emelex` entry-point plugins (when `plugins_autoload`) and the
    built-ins, checked with `check_pending()`. With `plugins_trace` every hook call is written to stderr."""
    pm = EmelexPluginManager()
    pm.add_hookspecs(hookspecs)
    if settings.plugins_trace:
        pm.trace.root.setwriter(lambda line: sys.stderr.write(f"emelex-trace: {line}"))
        pm.enable_tracing()
    if settings.plugins_autoload:
        load_entry_points(pm)
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


def load_entry_points(pm: EmelexPluginManager) -> int:
    """Load and register every plugin of the `emelex` entry-point group; return how many were registered."""
    count = 0
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        name = dist.name if dist else "an unknown distribution"
        builtin = name == BUILTIN_DISTRIBUTION and (ep.name, ep.value) in BUILTIN_PLUGINS
        info = PluginInfo(ep.name, name, dist.version if dist else "", ep.value, builtin)
        if pm.is_blocked(ep.name):
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
    return count


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(source tree)"


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
                raise PluginHookError(
                    f"{kind.__name__.lower()} {component.name!r} is registered by both "
                    f"{found[component.name].plugin!r} and {plugin!r}; uninstall one of them"
                )
            found[component.name] = Registered(plugin, component)

        call_one(pm, hook, impl, register=register)
    return found


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
