"""JSON as this app accepts it: no NUL characters (PostgreSQL text cannot hold them). NaN and
Infinity parse, and services refuse them naming the field."""

from __future__ import annotations

import json


def strict_json_loads(raw: bytes | str):
    """JSON as the API accepts it: no NUL characters in strings (PostgreSQL refuses them).
    NaN and Infinity parse, and services refuse them naming the field."""
    value = json.loads(raw)
    if _has_nul(value):
        raise ValueError("NUL characters are not allowed")
    return value


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
