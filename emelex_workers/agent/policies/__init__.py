"""The turn policies the agent knows: the built-in ones, those plugins register, the one a Session's snapshot records
and the one a new chat chooses for its model.

Built-in: "guided" (the small-model rules, `guided`) and "narrowed" (the rules of Sessions made with
`emelex-tools/1` and `/2`, `narrowed`). A snapshot made before
policies existed records none: one with protocol `emelex-tools/3` runs "guided", an older one "narrowed", each at
version 1, so it resumes exactly as it ran. A plugin adds a policy through the `register_policies(register)` hook
(`registered_policies`); the interface is `emelex_workers.host.policies.TurnPolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping

from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import SnapshotMismatchError
from emelex_workers.host.policies import TurnPolicy

from ..protocol import PROTOCOL_V3
from .guided import GuidedPolicy
from .narrowed import NarrowedPolicy

__all__ = ["BUILTIN", "GuidedPolicy", "NarrowedPolicy", "TurnPolicy", "policy_for", "recorded_policy"]

BUILTIN: Mapping[str, TurnPolicy] = {p.name: p for p in (GuidedPolicy(), NarrowedPolicy())}


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
    found = (BUILTIN if policies is None else policies).get(name)
    if found is None or found.version != version:
        field = "policy" if found is None else "policy.version"
        now = "none of that name" if found is None else f"version {found.version}"
        error = SnapshotMismatchError(
            f"the Session's snapshot records turn policy {name!r} version {version}, and this host provides "
            f"{now}; install the plugin (version) that provides it, or start a new Session")
        error.field = field
        raise error
    return found
