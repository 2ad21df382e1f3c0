"""The turn policies the agent knows: the built-in ones, those plugins register, the one a Session's snapshot records
and the one a new chat chooses for its model.

Built-in: "guided" (the small-model rules, `guided`), "open" (the model's own words and every enabled tool, `open`)
and "narrowed" (the rules of Sessions made with `emelex-tools/1` and `/2`, `narrowed`). A snapshot made before
policies existed records none: one with protocol `emelex-tools/3` runs "guided", an older one "narrowed", each at
version 1, so it resumes exactly as it ran. A plugin adds a policy through the `register_policies(register)` hook
(`registered_policies`); the interface is `emelex_workers.host.policies.TurnPolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping

from emelex_memory import InstalledModel, PluginHookError
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import SnapshotMismatchError
from emelex_workers.host.manager import EmelexPluginManager, call_one, hook_order
from emelex_workers.host.policies import POLICY_NAME, TurnPolicy

from ..protocol import PROTOCOL_V3
from .guided import GuidedPolicy
from .narrowed import NarrowedPolicy
from .open import OpenPolicy

__all__ = ["BUILTIN", "SMALL_MODEL_PARAMETERS", "GuidedPolicy", "NarrowedPolicy", "OpenPolicy", "TurnPolicy",
           "default_policy", "policy_for", "recorded_policy", "registered_policies"]

BUILTIN: Mapping[str, TurnPolicy] = {p.name: p for p in (GuidedPolicy(), OpenPolicy(), NarrowedPolicy())}
SMALL_MODEL_PARAMETERS = 1_000_000_000  # a local model with fewer parameters gets "guided" by default


def recorded_policy(snapshot: SessionSnapshot) -> tuple[str, int]:
    """The policy (name, version) `snapshot` runs: the one it records, else the one its protocol implies (a
    Session made before policies: "guided" for `emelex-tools/3`, "narrowed" for the older versions)."""
    if snapshot.policy is not None:
        return snapshot.policy["name"], snapshot.policy["version"]
    return (GuidedPolicy.name if snapshot.protocol == PROTOCOL_V3 else NarrowedPolicy.name), 1


def policy_for(snapshot: SessionSnapshot, policies: Mapping[str, TurnPolicy] | None = None) -> TurnPolicy:
    """The policy of `policies` (default: the built-in ones) that `snapshot` records (`recorded_policy`);
    `SnapshotMismatchError` (field "policy", or "policy.version") when this host does not provide it."""
    name, version = recorded_policy(snapshot)
    registered = (BUILTIN if policies is None else policies).get(name)
    found = None if registered is None else registered.at_version(version)
    if found is None:
        field = "policy" if registered is None else "policy.version"
        now = "none of that name" if registered is None else f"version {registered.version}"
        error = SnapshotMismatchError(
            f"the Session's snapshot records turn policy {name!r} version {version}, and this host provides "
            f"{now}; install the plugin (version) that provides it, or start a new Session")
        error.field = field
        raise error
    return found


def registered_policies(pm: EmelexPluginManager) -> dict[str, TurnPolicy]:
    """The built-in policies and every one plugins register through the `register_policies` hook, by name.

    Raises `PluginHookError` naming the plugin for something that is not a `TurnPolicy` with a valid name
    ([a-z][a-z0-9_]{0,47}) and a positive integer version, and naming both for a name registered twice (a built-in
    one's included)."""
    found: dict[str, TurnPolicy] = dict(BUILTIN)
    owners = {name: "emelex (built-in)" for name in found}
    for impl in hook_order(pm, "register_policies"):

        def register(policy: object, plugin: str = impl.plugin_name) -> None:
            if not isinstance(policy, TurnPolicy) or not isinstance(policy.name, str) \
                    or not POLICY_NAME.match(policy.name) or type(policy.version) is not int or policy.version < 1:
                raise PluginHookError(f"plugin {plugin!r} registered {policy!r}, not a TurnPolicy instance with a name "
                                      "matching [a-z][a-z0-9_]{0,47} and a version of 1 or more")
            if policy.name in found:
                raise PluginHookError(f"turn policy {policy.name!r} is registered by both {owners[policy.name]!r} "
                                      f"and {plugin!r}; uninstall one of them")
            found[policy.name], owners[policy.name] = policy, plugin

        call_one(pm, "register_policies", impl, register=register)
    return found


def default_policy(model: InstalledModel, parameters: int | None) -> tuple[str, str]:
    """The policy a new chat on `model` runs unless told otherwise, and why, in words: "open" for a served model;
    for a local one, "guided" when it has fewer than `SMALL_MODEL_PARAMETERS` parameters (`parameters`, as its
    binding reports them) or its size is unknown, else "open"."""
    if model.kind == "served":
        return OpenPolicy.name, "a served model"
    if parameters is None:
        return GuidedPolicy.name, f"{model.name} does not say how many parameters it has"
    size = f"{model.name} has {_count(parameters)} parameters"
    if parameters < SMALL_MODEL_PARAMETERS:
        return GuidedPolicy.name, f"{size}, under {_count(SMALL_MODEL_PARAMETERS)}"
    return OpenPolicy.name, f"{size}, {_count(SMALL_MODEL_PARAMETERS)} or more"


def _count(n: int) -> str:
    """A parameter count as people write it, rounded down to one decimal: "134.5M", "1B", "7.2B"."""
    for size, unit in ((10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            return f"{n * 10 // size / 10:.1f}".removesuffix(".0") + unit
    return str(n)
