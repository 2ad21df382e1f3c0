"""The JSON-schema subset tool inputs may use: one the grammar converter accepts and a validator for it.

`check_schema(schema)` accepts only what `LlamaGrammar.from_json_schema`
turns into a grammar faithfully: objects with `properties`, `required` and
`additionalProperties: false`, strings with a `maxLength` of at most 1000 (bounded, so
a model cannot run away inside one; llama.cpp refuses longer repetitions), arrays with a `maxItems`, integers,
numbers, booleans, `enum`, `const` and `anyOf`. Numeric `minimum`/`maximum`
are refused because the converter ignores them. `validate(value, schema)`
checks a value against a schema that passed `check_schema` (or a round's
narrowed schema, which may add a string `pattern`) and returns the first
problem as a sentence, or None.
"""

from __future__ import annotations

import re
from typing import Any

MAX_STRING_LENGTH = 1000  # llama.cpp refuses a grammar repeating a character rule much more often
MAX_ARRAY_ITEMS = 1_000
MAX_DEPTH = 8
_COMMON = {"description", "title"}
_KEYS = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "string": {"type", "maxLength", "minLength", "enum", "pattern"},
    "array": {"type", "items", "maxItems", "minItems"},
    "integer": {"type", "enum"},
    "number": {"type"},
    "boolean": {"type"},
}
_PY_TYPES = {"string": str, "object": dict, "array": list, "boolean": bool}


def check_schema(schema: object, where: str = "input_schema", depth: int = 0) -> str | None:
    """None when `schema` is in the supported subset (the top level must be an object); else what is wrong."""
    if depth == 0 and not (isinstance(schema, dict) and schema.get("type") == "object"):
        return f"{where} must be a JSON-schema object with \"type\": \"object\""
    if depth > MAX_DEPTH:
        return f"{where} nests deeper than {MAX_DEPTH} levels"
    if not isinstance(schema, dict):
        return f"{where} is not a JSON object"
    if "const" in schema:
        extra = set(schema) - {"const"} - _COMMON
        return f"{where} has {sorted(extra)[0]!r} next to const" if extra else None
    if "anyOf" in schema:
        options = schema["anyOf"]
        if set(schema) - {"anyOf"} - _COMMON or not isinstance(options, list) or not options:
            return f"{where}.anyOf must be the only keyword and a non-empty list"
        for n, option in enumerate(options):
            if problem := check_schema(option, f"{where}.anyOf[{n}]", depth + 1):
                return problem
        return None
    kind = schema.get("type")
    if kind not in _KEYS:
        return f"{where} has type {kind!r}; use one of {', '.join(sorted(_KEYS))}"
    extra = set(schema) - _KEYS[kind] - _COMMON
    if extra:
        return f"{where} uses {sorted(extra)[0]!r}, which the grammar converter does not enforce"
    if kind == "string":
        return _check_string(schema, where)
    if kind == "array":
        if not isinstance(schema.get("maxItems"), int) or not 1 <= schema["maxItems"] <= MAX_ARRAY_ITEMS:
            return f"{where} needs an integer maxItems between 1 and {MAX_ARRAY_ITEMS}"
        return check_schema(schema.get("items"), f"{where}.items", depth + 1)
    if kind == "object":
        return _check_object(schema, where, depth)
    return None


def _check_string(schema: dict, where: str) -> str | None:
    if "enum" in schema:
        values = schema["enum"]
        ok = isinstance(values, list) and values and all(isinstance(v, str) for v in values)
        return None if ok else f"{where}.enum must be a non-empty list of strings"
    if not isinstance(schema.get("maxLength"), int) or not 1 <= schema["maxLength"] <= MAX_STRING_LENGTH:
        return f"{where} needs an integer maxLength between 1 and {MAX_STRING_LENGTH} (strings must be bounded)"
    if "pattern" in schema:
        return f"{where} uses 'pattern', which the grammar converter does not combine with maxLength"
    return None


def _check_object(schema: dict, where: str, depth: int) -> str | None:
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return f"{where}.properties must be an object"
    if schema.get("additionalProperties", False) is not False:
        return f"{where} must set additionalProperties to false (or leave it out)"
    required = schema.get("required", [])
    if not isinstance(required, list) or any(r not in properties for r in required):
        return f"{where}.required must list names of its properties"
    for name, sub in properties.items():
        if problem := check_schema(sub, f"{where}.properties.{name}", depth + 1):
            return problem
    return None


def validate(value: Any, schema: dict, where: str = "arguments") -> str | None:
    """The first way `value` breaks `schema` (a schema `check_schema` accepts), as a sentence; None when valid."""
    if "const" in schema:
        return None if value == schema["const"] and type(value) is type(schema["const"]) else \
            f"{where} must be {schema['const']!r}"
    if "anyOf" in schema:
        if any(validate(value, option, where) is None for option in schema["anyOf"]):
            return None
        return f"{where} matches none of the allowed forms"
    kind = schema["type"]
    if not _is_type(value, kind):
        return f"{where} must be of type {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {', '.join(map(str, schema['enum']))}"
    if kind == "string":
        if len(value) > schema.get("maxLength", MAX_STRING_LENGTH) or len(value) < schema.get("minLength", 0):
            return f"{where} must be {schema.get('minLength', 0)} to {schema.get('maxLength')} characters long"
        if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
            return f"{where} must match {schema['pattern']}"
    elif kind == "array":
        if not schema.get("minItems", 0) <= len(value) <= schema["maxItems"]:
            return f"{where} must have {schema.get('minItems', 0)} to {schema['maxItems']} items"
        for n, item in enumerate(value):
            if problem := validate(item, schema["items"], f"{where}[{n}]"):
                return problem
    elif kind == "object":
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                return f"{where} is missing {name!r}"
        for name, item in value.items():
            if name not in properties:
                return f"{where} has an unknown field {name!r}"
            if problem := validate(item, properties[name], f"{where}.{name}"):
                return problem
    return None


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return type(value) is int
    if kind == "number":
        return type(value) in (int, float)
    return type(value) is _PY_TYPES[kind]
