"""A JSON schema as a GBNF grammar (llama.cpp's grammar language), written here so that every literal is escaped.

A model server that takes a JSON schema converts it with a converter of its own, and the converters of
llama-cpp-python (every release so far) and of older llama-server builds escape a literal's quotes but not its
backslashes: an `enum` or `const` string holding a `"`, a `\\` (or, in llama-cpp-python's, any character JSON
writes as `\\uXXXX`) becomes a grammar llama.cpp cannot parse, and llama-cpp-python's server then dies. Both servers
also take a grammar as it is (the request's `grammar` field), so a binding can send this one instead.

`schema_to_gbnf` covers the schemas a chat round is generated under (`emelex_workers/agent/schema.py`'s subset and
a round's narrowing of it): objects of `properties` (required ones first, in their order, then the optional ones),
strings (with `maxLength`/`minLength`, an `enum`, or a `pattern` of literals, classes, groups, alternatives and
quantifiers), `const`, `anyOf`, arrays with `minItems`/`maxItems`, integers, numbers and booleans. Whitespace
between tokens is at most one space. Anything else raises ValueError.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["gbnf_literal", "needs_escaped_literals", "schema_to_gbnf"]

_PRIMITIVES = {
    "space": '" "?',
    "char": r'[^"\\] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])',  # as JSON permits
    # (a raw control character too: the agent reads rounds leniently)
    "boolean": '("true" | "false") space',
    "integer": '("-"? ([0-9] | [1-9] [0-9]{0,15})) space',
    "number": '("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,4})? space',
}
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_METACHARS = set("()[]{}|*+?.\\^$")


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal: quotes, backslashes, newlines, returns and tabs escaped."""
    return '"' + "".join(_ESCAPES.get(char, char) for char in text) + '"'


def needs_escaped_literals(schema: Any) -> bool:
    """Whether `schema` holds a string literal (an `enum` value, a `const`) that llama-cpp-python's own converter
    writes into a grammar llama.cpp cannot parse: one whose JSON text (ASCII) holds a backslash (a `"`, a `\\`, a
    control or a non-ASCII character)."""
    if isinstance(schema, dict):
        literals = [schema["const"]] if "const" in schema else list(schema.get("enum", ()))
        if any(isinstance(v, str) and "\\" in json.dumps(v) for v in literals):
            return True
        return any(needs_escaped_literals(v) for k, v in schema.items() if k not in ("const", "enum"))
    if isinstance(schema, list):
        return any(needs_escaped_literals(v) for v in schema)
    return False


def schema_to_gbnf(schema: dict) -> str:
    """The GBNF grammar (root rule `root`) of the JSON values `schema` admits (see the module docstring)."""
    writer = _Writer()
    writer.rules["root"] = writer.value(schema)
    return "\n".join(f"{name} ::= {body}" for name, body in writer.rules.items()) + "\n"


class _Writer:
    """Collects a grammar's rules; each distinct body gets one generated name."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._named: dict[str, str] = {}

    def rule(self, body: str) -> str:
        """The name of a rule with `body` (made once)."""
        if body not in self._named:
            name = f"r{len(self._named) + 1}"
            self._named[body] = name
            self.rules[name] = body
        return self._named[body]

    def primitive(self, name: str) -> str:
        """The name of a primitive rule (space, char, ...), added with what it uses."""
        if name not in self.rules:
            body = _PRIMITIVES[name]
            for used in ("space", "char"):
                if used != name and used in body.split():
                    self.primitive(used)
            self.rules[name] = body
        return name

    def value(self, schema: dict) -> str:
        """The body of a rule for one value of `schema`."""
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, not {schema!r}")
        if "const" in schema:
            return f"{gbnf_literal(json.dumps(schema['const'], ensure_ascii=False))} {self.primitive('space')}"
        if "anyOf" in schema:
            return " | ".join(self.rule(self.value(option)) for option in schema["anyOf"])
        if "enum" in schema:
            values = " | ".join(gbnf_literal(json.dumps(v, ensure_ascii=False)) for v in schema["enum"])
            return f"({values}) {self.primitive('space')}"
        kind = schema.get("type")
        if kind == "object":
            return self._object(schema)
        if kind == "array":
            return self._array(schema)
        if kind == "string":
            return self._string(schema)
        if kind in ("boolean", "integer", "number"):
            return self.primitive(kind)
        raise ValueError(f"no grammar for a schema of type {kind!r}")

    def _object(self, schema: dict) -> str:
        properties = schema.get("properties", {})
        required = [name for name in schema.get("required", []) if name in properties]
        optional = [name for name in properties if name not in required]
        space = self.primitive("space")
        pairs = {name: self.rule(f'{gbnf_literal(json.dumps(name, ensure_ascii=False))} {space} ":" {space} '
                                 f"{self.rule(self.value(properties[name]))}") for name in properties}
        parts = ['"{"', space]
        if required:
            parts.append(f' "," {space} '.join(pairs[name] for name in required))
            parts += [f'("," {space} {pairs[name]})?' for name in optional]
        elif optional:
            parts.append(f"{self._some_of([pairs[name] for name in optional], space)}?")
        return " ".join([*parts, '"}"', space])

    def _some_of(self, pairs: list[str], space: str) -> str:
        """A rule for any non-empty, in-order selection of `pairs`, separated by commas."""
        options = []
        for start, pair in enumerate(pairs):
            rest = pairs[start + 1:]
            options.append(f'{pair} ("," {space} {self._some_of(rest, space)})?' if rest else pair)
        return self.rule(" | ".join(options))

    def _array(self, schema: dict) -> str:
        space = self.primitive("space")
        item = self.rule(self.value(schema["items"]))
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        more = _repeat(f'"," {space} {item}', max(low - 1, 0), None if high is None else high - 1)
        items = f"{item} {more}" if low >= 1 else f"({item} {more})?"
        return f'"[" {space} {items} "]" {space}'

    def _string(self, schema: dict) -> str:
        space = self.primitive("space")
        if "pattern" in schema:
            return f'"\\"" {_pattern(schema["pattern"])} "\\"" {space}'
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        return f'"\\"" {_repeat(self.primitive("char"), low, high)} "\\"" {space}'


def _repeat(item: str, low: int, high: int | None) -> str:
    """`item` (a rule or a sequence) `low` to `high` (None: any number of) times, the optional ones as nested
    optional groups, "(a (a (a)?)?)?": llama.cpp samples these faster than its own {m,n}."""
    required = " ".join([f"({item})"] * low)
    if high is None:
        return f"{required} ({item})*".strip()
    optional = ""
    for _ in range(high - low):
        optional = f"({item} {optional})?" if optional else f"({item})?"
    return f"{required} {optional}".strip()


def _pattern(pattern: str) -> str:
    """A regular expression (anchored with ^ and $) as a GBNF expression matching the same strings, as the JSON text
    inside the quotes: literals, classes without quotes or backslashes, groups, alternatives, ?, *, + and {m,n}."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        raise ValueError(f"a pattern must be anchored with ^ and $: {pattern!r}")
    items: list[str] = []
    body, index = pattern[1:-1], 0
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body) and not body[index + 1].isalnum():
            items.append(gbnf_literal(json.dumps(body[index + 1])[1:-1]))  # an escaped metacharacter
            index += 2
        elif char == "[" and (end := body.find("]", index + 2)) > 0 and not {'"', "\\"} & set(body[index:end]):
            items.append(body[index:end + 1])
            index = end + 1
        elif char == "{" and items and (end := body.find("}", index)) > 0:
            items[-1] += body[index:end + 1]
            index = end + 1
        elif char in "?*+" and items:
            items[-1] += char
            index += 1
        elif char in "()|":
            items.append(char)
            index += 1
        elif char in _METACHARS:
            raise ValueError(f"unsupported {char!r} in pattern {pattern!r}")
        else:
            items.append(gbnf_literal(json.dumps(char, ensure_ascii=False)[1:-1]))
            index += 1
    return " ".join(items)
