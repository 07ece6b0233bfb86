"""JSON as this app accepts it: at most MAX_DEPTH levels of nesting and no NUL characters
(PostgreSQL text cannot hold them). NaN and Infinity parse, and services refuse them naming
the field.

People's input deeper than that is refused; a model's is not (it is what the model sent):
`cut_deep` keeps a request's JSON columns (its data, its calls' input, the journal's record)
and the transcript as pages show it within the limit, the parts below it replaced by
TOO_DEEP, while the call's raw arguments text keeps the value whole. The stored transcript
itself is the model's own (the run resumes from it): in Anthropic's shape a call's input is an
object there, kept whole."""

from __future__ import annotations

import json
from typing import Any

# Arguments, answers and schemas are shallow; a deeper value is an attack on the parser or on
# every recursive walk after it (each would end in RecursionError, a 500).
MAX_DEPTH = 64


def strict_json_loads(raw: bytes | str):
    """Parse JSON the way every entry point does (API bodies, page forms); ValueError with a
    readable message for anything refused."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    if _depth_exceeds(value, MAX_DEPTH):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    if _has_nul(value):
        raise ValueError("NUL characters are not allowed")
    return value


def _depth_exceeds(value, limit: int) -> bool:
    """Whether containers nest deeper than `limit` (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


TOO_DEEP = f"… nested more than {MAX_DEPTH} levels deep: cut here (the raw arguments keep it whole)"


def cut_deep(value: Any, limit: int = MAX_DEPTH) -> tuple[Any, bool]:
    """`value` with every container nested deeper than `limit` replaced by TOO_DEEP, and
    whether anything was cut (iterative: a value too deep for recursion is cut too)."""
    if not _depth_exceeds(value, limit):
        return value, False
    top: list[Any] = [None]
    stack: list[tuple[Any, int, Any, Any]] = [(value, 1, top, 0)]
    while stack:
        item, depth, parent, key = stack.pop()
        if isinstance(item, (dict, list)) and depth > limit:
            parent[key] = TOO_DEEP
        elif isinstance(item, dict):
            parent[key] = copy = dict.fromkeys(item)  # keys in their order, values below
            stack.extend((child, depth + 1, copy, k) for k, child in item.items())
        elif isinstance(item, list):
            parent[key] = copy = [None] * len(item)
            stack.extend((child, depth + 1, copy, i) for i, child in enumerate(item))
        else:
            parent[key] = item
    return top[0], True


def holds_cut(value: Any) -> bool:
    """Whether `value` (as stored) had parts cut by `cut_deep`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item == TOO_DEEP:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
