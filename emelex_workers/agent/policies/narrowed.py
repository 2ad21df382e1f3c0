"""The "narrowed" turn policy: the rules every Session made with `emelex-tools/1` or `emelex-tools/2` runs by.

A round offers the enabled tools; each path argument a tool declares (`ToolSpec.workspace_paths`) is restricted to
what exists in the workspace at that round (`workspace.narrow_path`, from the turn's walk); a tool whose only
argument is an enum loses the values already called in the turn (since the last call that may have changed the
workspace), and a tool with no admissible argument left is not offered; the answer is free, at most
`MAX_ANSWER_CHARS` characters; a round whose results all repeat ones already in the turn forces an answer. The
"guided" policy adds the small-model rules on top of these.
"""

from __future__ import annotations

from emelex_memory.agent.snapshot import ToolAuthority
from emelex_workers.host.policies import GRAMMAR_PROTOCOL, TurnPolicy, TurnState, WorkspaceEntries, call_key

from ..protocol import MAX_ANSWER_CHARS
from ..workspace import narrow_path

_ENUM_ONLY = {"type", "enum", "description", "title"}


class NarrowedPolicy(TurnPolicy):
    """Arguments narrowed to what exists and to what the turn has not done yet; a free, bounded answer; an answer
    forced after a round that learned nothing (see the module docstring)."""

    name = "narrowed"
    version = 1
    summary = ("path arguments narrowed to what exists, no call offered twice; a free answer of at most "
               f"{MAX_ANSWER_CHARS} characters (the rules of Sessions made with emelex-tools/1 and /2)")
    round_tokens = 512
    chain_limit = 4
    calls_per_batch = 2
    answer_chars = MAX_ANSWER_CHARS
    forces_repeat = True

    def protocol(self, native: bool) -> str:
        """Always the constrained JSON union of `emelex-tools/2`: its narrowing is a grammar's."""
        return GRAMMAR_PROTOCOL

    def arguments(self, turn: TurnState, tool: ToolAuthority) -> dict | None:
        """`tool`'s schema with each declared path argument narrowed to what exists (a required one with nothing to
        name leaves the tool out, an optional one is dropped), then, for a tool whose only argument is an enum, the
        values already called left out; None when nothing admissible is left (or a tool without arguments was
        already called)."""
        schema = tool.input_schema
        properties = dict(schema.get("properties", {}))
        required = schema.get("required", [])
        paths = turn.spec(tool.name).workspace_paths
        entries = turn.walk.entries() if turn.walk is not None and (paths or self._spells(turn, tool)) else None
        for name, kind in paths.items() if entries is not None else ():
            if name not in properties:
                continue
            narrowed = narrow_path(properties[name], kind, entries)
            named = self._named_paths(turn, tool, kind, properties[name], narrowed) if narrowed is not None else []
            if named:
                properties[name] = {"type": "string", "enum": named}
            elif narrowed is not None:
                properties[name] = narrowed
            elif name in required:
                return None
            else:
                del properties[name]
        self._spell_out(turn, tool, properties, entries)
        if len(properties) == 1:
            (name, only), = properties.items()
            if "enum" in only and set(only) <= _ENUM_ONLY:
                left = [v for v in only["enum"] if call_key(tool.name, {name: v}) not in turn.done]
                if left:
                    properties[name] = {**only, "enum": left}
                elif name in required:
                    return None
                else:
                    del properties[name]
        if not properties and call_key(tool.name, {}) in turn.done:
            return None
        return {**schema, "properties": properties}

    def _named_paths(self, turn: TurnState, tool: ToolAuthority, kind: str, schema: dict, narrowed: dict) -> list[str]:
        """The paths a path argument of `tool` of `kind` (recorded `schema`) is restricted to instead of `narrowed`
        (none here: `narrowed` stands)."""
        return []

    def _spells(self, turn: TurnState, tool: ToolAuthority) -> bool:
        """Whether `_spell_out` narrows `tool`'s arguments by what the workspace holds (never here)."""
        return False

    def _spell_out(self, turn: TurnState, tool: ToolAuthority, properties: dict[str, dict],
                   entries: WorkspaceEntries | None) -> None:
        """Narrow `properties` (a copy, changed in place) to what the request spells out (nothing here)."""
