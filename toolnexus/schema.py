"""A small JSON Schema validator for tool inputs (the subset tool schemas use).

The engine stays dependency-free beyond httpx, and reviewers' edited arguments must be
checked against the tool's schema before the tool runs. Unknown keywords are ignored, as the
JSON Schema spec asks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["schema_errors"]

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def schema_errors(value: Any, schema: Mapping[str, Any] | None, path: str = "$") -> list[str]:
    """Every violation of `schema` by `value`, each naming the path (`$.amount`)."""
    if not isinstance(schema, Mapping):
        return []
    errors: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        known = [t for t in names if t in _TYPES]
        if known and not any(_TYPES[t](value) for t in known):
            errors.append(f"{path}: expected {' or '.join(known)}, got {_json_type(value)}")
            return errors
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        errors.append(f"{path}: must be one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: must be {schema['const']!r}")
    if isinstance(value, Mapping):
        errors.extend(_object_errors(value, schema, path))
    elif isinstance(value, list):
        errors.extend(_array_errors(value, schema, path))
    elif isinstance(value, str):
        errors.extend(_string_errors(value, schema, path))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        errors.extend(_number_errors(value, schema, path))
    for sub in schema.get("allOf") or []:
        errors.extend(schema_errors(value, sub, path))
    any_of = schema.get("anyOf")
    if isinstance(any_of, list) and any_of and all(schema_errors(value, s, path) for s in any_of):
        errors.append(f"{path}: matches none of the allowed shapes")
    one_of = schema.get("oneOf")
    if isinstance(one_of, list) and one_of:
        matches = sum(1 for s in one_of if not schema_errors(value, s, path))
        if matches != 1:
            errors.append(f"{path}: must match exactly one allowed shape (matched {matches})")
    return errors


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__


def _object_errors(value: Mapping[str, Any], schema: Mapping[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    for key in schema.get("required") or []:
        if key not in value:
            errors.append(f"{path}.{key}: is required")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in props:
            errors.extend(schema_errors(item, props[key], f"{path}.{key}"))
        elif extra is False:
            errors.append(f"{path}.{key}: is not an allowed property")
        elif isinstance(extra, Mapping):
            errors.extend(schema_errors(item, extra, f"{path}.{key}"))
    return errors


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _array_errors(value: list[Any], schema: Mapping[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    if isinstance(schema.get("minItems"), int) and len(value) < schema["minItems"]:
        errors.append(f"{path}: needs at least {_count(schema['minItems'], 'item')}")
    if isinstance(schema.get("maxItems"), int) and len(value) > schema["maxItems"]:
        errors.append(f"{path}: allows at most {_count(schema['maxItems'], 'item')}")
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, items, f"{path}[{i}]"))
    return errors


def _string_errors(value: str, schema: Mapping[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    if isinstance(schema.get("minLength"), int) and len(value) < schema["minLength"]:
        errors.append(f"{path}: must be at least {_count(schema['minLength'], 'character')}")
    if isinstance(schema.get("maxLength"), int) and len(value) > schema["maxLength"]:
        errors.append(f"{path}: must be at most {_count(schema['maxLength'], 'character')}")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            if not re.search(pattern, value):
                errors.append(f"{path}: does not match {pattern!r}")
        except re.error:
            pass  # a pattern Python cannot compile is the schema's fault, not the value's
    return errors


def _number_errors(value: float, schema: Mapping[str, Any], path: str) -> list[str]:
    errors: list[str] = []
    checks = (
        ("minimum", lambda b: value < b, "must be at least"),
        ("maximum", lambda b: value > b, "must be at most"),
        ("exclusiveMinimum", lambda b: value <= b, "must be more than"),
        ("exclusiveMaximum", lambda b: value >= b, "must be less than"),
    )
    for key, violated, words in checks:
        bound = schema.get(key)
        if isinstance(bound, int | float) and not isinstance(bound, bool) and violated(bound):
            errors.append(f"{path}: {words} {bound}")
    return errors
