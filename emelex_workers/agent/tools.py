"""Tools as plugins: the registry of the tools plugins offer, and running one call.

A plugin implements the `register_tools(register)` hook and calls
`register(ToolSpec(...))` once per tool (the types are in
`emelex_workers.host.tools`). `registered_tools(pm)` collects
them, checking each spec (name pattern, bounded description, an input schema
in the subset the grammar converter enforces, an approval policy) and that
names are unique across plugins. The approval policy is the plugin's
declaration and Emelex's rule: an "always" tool never runs without the
user's approval, whatever the model says. `run_tool` runs one call: a
tool's own exception becomes an error output, and output over the tool's
`max_output_bytes` is stored as a content-addressed asset that the output
names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from emelex_memory import EmelexError, PluginHookError
from emelex_memory.agent.snapshot import ToolAuthority
from emelex_workers.host.manager import EmelexPluginManager, call_one, hook_order
from emelex_workers.host.tools import (
    REQUEST_SPAN_KINDS,
    WORKSPACE_PATH_KINDS,
    ToolInvocation,
    ToolOutput,
    ToolSpec,
    bounded,
)

from .schema import check_schema

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")
MAX_DESCRIPTION = 1024  # characters
MAX_OUTPUT_BYTES = 16 * 1024 * 1024  # the largest max_output_bytes a tool may declare
MAX_ERROR_TEXT = 2048  # bytes of an error output built from an exception
PREVIEW_BYTES = 1024  # bytes of an oversized output kept in the text that names its asset
APPROVALS = ("always", "never")


@dataclass(frozen=True)
class RegisteredTool:
    """A checked `ToolSpec` and the plugin (and the plugin's distribution version) that registered it."""

    spec: ToolSpec
    plugin: str
    plugin_version: str

    def authority(self) -> ToolAuthority:
        """The tool's exact authority as a Session snapshot records it."""
        spec = self.spec
        return ToolAuthority(spec.name, spec.description, spec.input_schema, spec.approval, self.plugin,
                             self.plugin_version)


def spec_problem(spec: object) -> str | None:
    """None when `spec` is a valid `ToolSpec`; otherwise what is wrong with it, as a sentence."""
    if not isinstance(spec, ToolSpec):
        return f"{type(spec).__name__} is not a ToolSpec"
    if not isinstance(spec.name, str) or not NAME_PATTERN.match(spec.name):
        return f"tool name {spec.name!r} does not match [a-z][a-z0-9_]{{0,47}}"
    if not isinstance(spec.description, str) or not 1 <= len(spec.description) <= MAX_DESCRIPTION:
        return f"tool {spec.name!r} needs a description of 1 to {MAX_DESCRIPTION} characters"
    if spec.approval not in APPROVALS:
        return f"tool {spec.name!r} has approval {spec.approval!r}; use \"always\" or \"never\""
    if not callable(spec.run):
        return f"tool {spec.name!r} has a run that is not callable"
    if type(spec.max_output_bytes) is not int or not 1 <= spec.max_output_bytes <= MAX_OUTPUT_BYTES:
        return f"tool {spec.name!r} needs a max_output_bytes between 1 and {MAX_OUTPUT_BYTES}"
    problem = (check_schema(spec.input_schema) or _request_problem(spec)
               or _arguments_problem(spec, "workspace_paths", WORKSPACE_PATH_KINDS, "path kind"))
    return f"tool {spec.name!r}: {problem}" if problem else None


def _arguments_problem(spec: ToolSpec, field: str, kinds: tuple[str, ...], noun: str) -> str | None:
    """What is wrong with `spec.<field>`, a mapping of string properties of its input schema (already checked) to
    one of `kinds` (a `noun`), or None."""
    declared = getattr(spec, field)
    if not isinstance(declared, Mapping):
        return f"{field} must be a mapping of argument name to {noun}"
    properties = spec.input_schema.get("properties", {})
    for name, kind in declared.items():
        if kind not in kinds:
            return f"{field}[{name!r}] is {kind!r}, not a {noun}; use one of {', '.join(kinds)}"
        if not isinstance(properties.get(name), dict) or properties[name].get("type") != "string":
            return f"{field} names {name!r}, which is not a string property of input_schema"
    return None


def _request_problem(spec: ToolSpec) -> str | None:
    """What is wrong with `spec.requested_by` or `spec.request_spans` (its input schema already checked), or None."""
    verbs = spec.requested_by
    if not isinstance(verbs, frozenset) or not all(isinstance(v, str) and v.isalpha() and v.islower() for v in verbs):
        return "requested_by must be a frozenset of lowercase words"
    return _arguments_problem(spec, "request_spans", REQUEST_SPAN_KINDS, "span kind")


def registered_tools(pm: EmelexPluginManager) -> dict[str, RegisteredTool]:
    """Every tool registered through the `register_tools` hook, by name.

    Raises `PluginHookError` naming the plugin for an invalid spec or a
    failing hook, and naming both plugins when two register the same name.
    """
    found: dict[str, RegisteredTool] = {}
    for impl in hook_order(pm, "register_tools"):
        plugin = impl.plugin_name
        info = pm.plugin_info.get(plugin)

        def register(spec: object, plugin: str = plugin, version: str = info.version if info else "") -> None:
            if problem := spec_problem(spec):
                raise PluginHookError(f"plugin {plugin!r} registered an invalid tool: {problem}")
            assert isinstance(spec, ToolSpec)
            if spec.name in found:
                raise PluginHookError(
                    f"tool {spec.name!r} is registered by both {found[spec.name].plugin!r} and {plugin!r}; "
                    "uninstall one of them"
                )
            found[spec.name] = RegisteredTool(spec, plugin, version)

        call_one(pm, "register_tools", impl, register=register)
    return found


def output_bytes(text: str | dict) -> bytes:
    """The bytes an output's text is measured and stored as: UTF-8, or canonical JSON for an object."""
    if isinstance(text, str):
        return text.encode("utf-8", "surrogatepass")
    return json.dumps(text, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def run_tool(tool: RegisteredTool, invocation: ToolInvocation) -> ToolOutput:
    """Run one call of `tool`; never raises for the tool's own failure.

    An exception (or a result that is not a `ToolOutput`) becomes
    `ToolOutput(is_error=True)` with a bounded text naming it. Output over the
    tool's `max_output_bytes` is stored with `put_asset` and replaced by a text
    naming the asset (digest and size) with a short preview; when the store is
    missing or refuses, the text says so and keeps the preview only.
    """
    try:
        output = tool.spec.run(invocation)
    except Exception as exc:
        return ToolOutput(bounded(f"tool {tool.spec.name!r} failed: {type(exc).__name__}: {exc}", MAX_ERROR_TEXT),
                          is_error=True)
    if not isinstance(output, ToolOutput) or not isinstance(output.text, str | dict):
        return ToolOutput(f"tool {tool.spec.name!r} returned a {type(output).__name__}, not a ToolOutput",
                          is_error=True)
    data = output_bytes(output.text)
    if len(data) <= tool.spec.max_output_bytes:
        return output
    preview = bounded(data[:PREVIEW_BYTES].decode("utf-8", "ignore"), PREVIEW_BYTES)
    kind = "text/plain" if isinstance(output.text, str) else "application/json"
    problem = "this agent has no store to keep it in" if invocation.store is None else None
    if invocation.store is not None:
        try:
            ref = invocation.store.put_asset(data, kind)
        except EmelexError as exc:
            problem = bounded(str(exc), 200)
    if problem is not None:
        note = f"the output ({len(data)} bytes) was over {tool.spec.max_output_bytes} bytes and could not be " \
               f"stored ({problem}); its first bytes:\n{preview}"
        return ToolOutput(note, is_error=True, assets=output.assets)
    note = f"the output ({len(data)} bytes) was over {tool.spec.max_output_bytes} bytes and is stored as asset " \
           f"sha256:{ref.digest} ({kind}); its first bytes:\n{preview}"
    return ToolOutput(note, is_error=output.is_error, assets=(*output.assets, ref))
