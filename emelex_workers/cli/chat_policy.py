"""Which turn policy an `emelex chat` runs, and the line that says so.

A new chat runs the policy `--policy NAME` names, else the `chat_policy` setting's, else ("auto") the one its model
calls for (`policies.default_policy`: guided for a local model under 1B parameters, open for a larger or a served
one). A resumed chat runs the policy its Session recorded, whatever the default is now; a `--policy` naming another
is refused. The chat's first line names the policy, why it runs, what it constrains and, for a free-answer
policy, how tools are called.
"""

from __future__ import annotations

from collections.abc import Mapping

from emelex_memory import InstalledModel
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import InvalidInputError, SnapshotMismatchError
from emelex_workers.agent.policies import default_policy, recorded_policy
from emelex_workers.agent.protocol import PROTOCOL_NATIVE
from emelex_workers.host.policies import TurnPolicy
from emelex_workers.host.types import ToolCalling

AUTO = "auto"


class UnknownPolicyError(InvalidInputError):
    """No turn policy of that name is registered: use one the message lists (`guided`, `open`, a plugin's), or
    `auto`."""


def requested_policy(policies: Mapping[str, TurnPolicy], requested: str | None,
                     setting: str) -> tuple[TurnPolicy | None, str]:
    """The policy a new chat is asked to run and who asks: `requested` (`--policy`), else `setting` (`chat_policy`);
    None for "auto" (the model decides: `new_chat_policy`). `UnknownPolicyError` lists the registered ones for any
    other name, before anything is created."""
    name, why = (requested, "--policy") if requested not in (None, AUTO) else (setting, "the chat_policy setting")
    if name == AUTO:
        return None, why
    policy = policies.get(name)
    if policy is None:
        raise UnknownPolicyError(f"there is no turn policy named {name!r} ({why}); use one of "
                                 f"{', '.join(sorted(policies))}, or {AUTO!r}")
    return policy, why


def new_chat_policy(policies: Mapping[str, TurnPolicy], requested: tuple[TurnPolicy | None, str],
                    model: InstalledModel, binding: object) -> tuple[TurnPolicy, str]:
    """The policy of a new chat and why, in words: the `requested` one (`requested_policy`), or for "auto" the one
    `model` calls for (`policies.default_policy`, told its binding's optional `parameter_count`)."""
    policy, why = requested
    if policy is not None:
        return policy, why
    parameters = getattr(binding, "parameter_count", None) if model.kind != "served" else None
    name, why = default_policy(model, parameters)
    return policies[name], why


def resumed_chat_policy(policies: Mapping[str, TurnPolicy], requested: str | None, session_id: str,
                        stored: SessionSnapshot) -> tuple[TurnPolicy, str]:
    """The policy a resumed chat runs: the one the Session recorded (`recorded_policy`), and why. A `requested` one
    (`--policy`, not "auto") naming another is refused (`SnapshotMismatchError`, field "policy"); so is a recorded
    one this host does not provide."""
    name, version = recorded_policy(stored)
    if requested not in (None, AUTO, name):
        error = SnapshotMismatchError(
            f"Session {session_id} runs turn policy {name!r}, as it recorded; resume it without --policy (or with "
            f"--policy {name}), or start a new Session with --policy {requested}")
        error.field = "policy"
        raise error
    registered = policies.get(name)
    policy = None if registered is None else registered.at_version(version)
    if policy is None:
        error = SnapshotMismatchError(
            f"Session {session_id} runs turn policy {name!r} version {version}, which this host does not provide; "
            "install the plugin (version) it was created with, or start a new Session")
        error.field = "policy" if registered is None else "policy.version"
        raise error
    return policy, "recorded in the Session"


def policy_line(policy: TurnPolicy, why: str, snapshot: SessionSnapshot, calling: ToolCalling | None = None) -> str:
    """What the chat says of its policy: the policy and why it runs (for its first line), then a line of what it
    does and, for a free-answer policy, how tools are called (and, when a server was asked, `calling`'s finding)."""
    text = ""
    if snapshot.protocol == PROTOCOL_NATIVE:
        text = "; tools are called natively (the server's tool calling)"
    elif policy.answer_chars is None:
        found = f" ({calling.detail})" if calling is not None and not calling.native else ""
        text = f"; tools are called through a constrained JSON grammar{found}"
    return f"policy {policy.name} ({why})\n  {policy.name}: {policy.summary}{text}"
