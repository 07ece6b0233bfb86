"""JSON as this app accepts it: at most MAX_DEPTH levels of nesting and no NUL characters
(PostgreSQL text cannot hold them). NaN and Infinity parse, and services refuse them naming
the field."""

from __future__ import annotations

import json

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


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
