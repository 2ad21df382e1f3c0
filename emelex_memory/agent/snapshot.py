"""Execution snapshots: the resolved semantic configuration and the exact tool authority of an agent Session.

A `SessionSnapshot` is created once, for an empty Session, and never changes
or compacts. Its digest is the SHA-256 of its canonical JSON (sorted keys, no
whitespace, UTF-8; tools ordered by name), so neither key order nor the order
tools were registered in changes it, and any change of any field does.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any

from ..errors import InvalidInputError

SNAPSHOT_FORMAT = 1  # bumped only if the canonical JSON layout itself changes
APPROVALS = ("always", "never")
CONTEXT_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
OPTIONAL_FIELDS = ("model_identity", "context", "policy")  # left out of the JSON when None / empty
POLICY_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of `value`: sorted keys, no whitespace, UTF-8, finite numbers only."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"an execution snapshot must be plain JSON: {exc}") from None


@dataclass(frozen=True)
class ToolAuthority:
    """What a Session may do with one tool: its name, description, input schema, approval policy ("always": every
    call needs the user's approval; "never": it runs unasked) and the plugin (name and version) that provides it."""

    name: str
    description: str
    input_schema: dict
    approval: str
    plugin: str
    plugin_version: str

    def __post_init__(self) -> None:
        for name in ("name", "description", "plugin", "plugin_version"):
            if not isinstance(getattr(self, name), str):
                raise InvalidInputError(f"tool authority field {name!r} must be a string")
        if self.approval not in APPROVALS:
            raise InvalidInputError(f"tool {self.name!r}: approval must be one of {APPROVALS}, got {self.approval!r}")
        if not isinstance(self.input_schema, dict):
            raise InvalidInputError(f"tool {self.name!r}: input_schema must be a JSON object")

    def to_json(self) -> dict[str, Any]:
        """The authority as a JSON object."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class SessionSnapshot:
    """The immutable execution configuration of an agent Session; see the module docstring.

    `protocol` is the tool-call protocol version, `template_digest` the
    SHA-256 of the chat template the binding renders with, `round_tokens` the
    token limit of one model round, `chain_limit` the most tool rounds in one
    turn and `calls_per_batch` the most calls in one round. `context` names
    the context sources whose notes the Session records before its first
    model round, in order (see `emelex_workers.agent.context`); empty, it is
    left out of the JSON, so a snapshot made before the field existed keeps
    its digest. `policy` is the turn policy the Session runs, `{"name",
    "version"}` (see `emelex_workers.host.policies`); None (left out of the
    JSON) for a Session made before policies, whose protocol implies it.
    Construction orders `tools` by name and refuses two tools of one name.
    """

    model_reference: str
    model_snapshot_id: str
    protocol: str
    template_digest: str
    context_size: int
    temperature: float
    seed: int
    round_tokens: int
    chain_limit: int
    calls_per_batch: int
    system_prompt: str
    tools: tuple[ToolAuthority, ...]
    model_identity: dict | None = None
    context: tuple[str, ...] = ()
    policy: dict | None = None

    def __post_init__(self) -> None:
        for name in ("model_reference", "model_snapshot_id", "protocol", "template_digest", "system_prompt"):
            if not isinstance(getattr(self, name), str):
                raise InvalidInputError(f"snapshot field {name!r} must be a string")
        for name in ("context_size", "seed", "round_tokens", "chain_limit", "calls_per_batch"):
            value = getattr(self, name)
            if type(value) is not int or value < (0 if name == "seed" else 1):
                raise InvalidInputError(f"snapshot field {name!r} must be a positive integer, got {value!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidInputError(f"snapshot temperature must be a finite number >= 0, got {self.temperature!r}")
        object.__setattr__(self, "temperature", float(self.temperature))
        if self.model_identity is not None:
            if not isinstance(self.model_identity, dict):
                raise InvalidInputError("snapshot model_identity must be a JSON object or None")
            canonical_json(self.model_identity)
        context = tuple(self.context) if isinstance(self.context, (list, tuple)) else None
        if context is None or any(not isinstance(c, str) or not CONTEXT_NAME.match(c) for c in context) \
                or len(set(context)) != len(context):
            raise InvalidInputError(f"snapshot context must be distinct source names ([a-z][a-z0-9_]*), got "
                                    f"{self.context!r}")
        object.__setattr__(self, "context", context)
        if self.policy is not None and not (
                isinstance(self.policy, dict) and set(self.policy) == {"name", "version"}
                and isinstance(self.policy["name"], str) and POLICY_NAME.match(self.policy["name"])
                and type(self.policy["version"]) is int and self.policy["version"] >= 1):
            raise InvalidInputError(f'snapshot policy must be {{"name": [a-z][a-z0-9_]*, "version": 1 or more}}, got '
                                    f"{self.policy!r}")
        tools = tuple(sorted(self.tools, key=lambda t: t.name))
        if any(not isinstance(t, ToolAuthority) for t in tools):
            raise InvalidInputError("snapshot tools must be ToolAuthority values")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"snapshot tools have duplicate names: {names}")
        object.__setattr__(self, "tools", tools)

    def to_json(self) -> dict[str, Any]:
        """The snapshot as a JSON object (tools as a list ordered by name), with its format number."""
        value: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        value["tools"] = [t.to_json() for t in self.tools]
        if self.model_identity is None:
            del value["model_identity"]
        value["context"] = list(self.context)
        if not self.context:
            del value["context"]
        if self.policy is None:
            del value["policy"]
        value["format"] = SNAPSHOT_FORMAT
        return value

    def canonical_json(self) -> bytes:
        """The canonical JSON bytes the digest is taken over."""
        return canonical_json(self.to_json())

    @property
    def digest(self) -> str:
        """The lowercase hex SHA-256 of `canonical_json()`."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> SessionSnapshot:
        """Rebuild a snapshot from `to_json()` output; raises `InvalidInputError` for anything else."""
        try:
            if value.get("format") != SNAPSHOT_FORMAT:
                raise InvalidInputError(f"unknown snapshot format {value.get('format')!r}")
            data = {f.name: value[f.name] for f in fields(cls) if f.name not in OPTIONAL_FIELDS}
            data["model_identity"] = value.get("model_identity")
            data["context"] = value.get("context", ())
            data["policy"] = value.get("policy")
            data["tools"] = tuple(ToolAuthority(**t) for t in value["tools"])
        except (AttributeError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"a stored execution snapshot is malformed ({exc!r})") from None
        return cls(**data)

    def tool(self, name: str) -> ToolAuthority | None:
        """The authority of tool `name`, or None when the snapshot has no such tool."""
        return next((t for t in self.tools if t.name == name), None)

    def differing_field(self, other: SessionSnapshot) -> str | None:
        """The first field in which `other` differs, as a path such as `"temperature"`,
        `"model_identity.digest"`, `"tools[read_file].description"` or `"tools[read_file].input_schema.properties.path.type"`;
        None when both are identical (equal digests)."""
        for f in fields(self):
            if f.name == "tools":
                continue
            if f.name in ("model_identity", "policy") and isinstance(getattr(self, f.name), dict) \
                    and isinstance(getattr(other, f.name), dict):
                path = _json_difference(getattr(self, f.name), getattr(other, f.name))
                if path is not None:
                    return f"{f.name}{path}"
                continue
            if canonical_json(getattr(self, f.name)) != canonical_json(getattr(other, f.name)):
                return f.name
        mine = {t.name: t for t in self.tools}
        theirs = {t.name: t for t in other.tools}
        for name in sorted(mine.keys() | theirs.keys()):
            if name not in mine or name not in theirs:
                return f"tools[{name}]"
            a, b = mine[name].to_json(), theirs[name].to_json()
            for key in sorted(a):
                if key == "input_schema":
                    path = _json_difference(a[key], b[key])
                    if path is not None:
                        return f"tools[{name}].input_schema{path}"
                elif a[key] != b[key]:
                    return f"tools[{name}].{key}"
        return None


    def field_value(self, path: str) -> Any:
        """The value at a `differing_field` path (`"seed"`, `"model_identity.digest"`,
        `"tools[read_file].input_schema.properties.path"`, `"format"`); None where the snapshot has nothing there."""
        if path.startswith("tools["):
            name, _, rest = path[len("tools["):].partition("]")
            tool = self.tool(name)
            value: Any = None if tool is None else tool.to_json()
        else:
            field, _, rest = path.partition(".")
            rest = f".{rest}" if rest else ""
            value = self.to_json().get(field)
        for key, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", rest):
            if key:
                value = value.get(key) if isinstance(value, dict) else None
            else:
                value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        return value


def identity_changes(stored: SessionSnapshot, current: SessionSnapshot) -> list[tuple[str, Any, Any]]:
    """Every `model_identity` field (a path such as `"model_identity.digest"`) in which `current` differs from
    `stored`, with its stored and its current value, in path order; [] when the identities are equal."""
    return [(f"model_identity{path}", stored.field_value(f"model_identity{path}"),
             current.field_value(f"model_identity{path}"))
            for path in _json_differences(stored.model_identity, current.model_identity)]


def _json_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The path of every place where two JSON values differ (as `_json_difference` finds the first)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [found for key in sorted(a.keys() | b.keys())
                for found in ([f"{path}.{key}"] if key not in a or key not in b
                              else _json_differences(a[key], b[key], f"{path}.{key}"))]
    first = _json_difference(a, b, path)
    return [] if first is None else [first]


def _json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The path (".key" / "[i]" steps) of the first place where two JSON values differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if key not in a or key not in b:
                return f"{path}.{key}"
            found = _json_difference(a[key], b[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _json_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None if len(a) == len(b) else f"{path}[{min(len(a), len(b))}]"
    return None if canonical_json(a) == canonical_json(b) else path
