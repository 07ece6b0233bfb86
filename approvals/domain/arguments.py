"""Checks on what reviewers and hosts send: reasons, typed results, edited arguments."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from toolnexus.schema import schema_errors

from .exceptions import InvalidInput

MAX_REASON_CHARS = 2_000
MAX_OUTPUT_CHARS = 100_000
DEFAULT_REASON = "declined"


def clean_reason(reason: Any) -> str:
    if reason is None:
        return DEFAULT_REASON
    if not isinstance(reason, str):
        raise InvalidInput("reason: must be a string")
    reason = reason.strip()
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidInput(f"reason: must be at most {MAX_REASON_CHARS} characters")
    return reason or DEFAULT_REASON


def clean_output(output: Any, field: str = "output") -> str:
    if not isinstance(output, str):
        raise InvalidInput(f"{field}: must be a string")
    if len(output) > MAX_OUTPUT_CHARS:
        raise InvalidInput(f"{field}: must be at most {MAX_OUTPUT_CHARS} characters")
    return output


def input_problems(value: Any, schema: Mapping[str, Any] | None) -> list[str]:
    """What is wrong with edited arguments, each naming the argument."""
    problems = [
        p.replace("$.", "", 1).replace("$", "input", 1) for p in schema_errors(value, schema)
    ]
    if bad := non_finite(value, "input"):
        problems.append(f"{bad.removeprefix('input.')}: must be a finite number")
    return problems


def non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity inside a JSON-like value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, Mapping):
        items = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((found for p, v in items if (found := non_finite(v, p))), None)


def validated_input(value: Any, schema: Mapping[str, Any] | None, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{field}: must be an object")
    if bad := non_finite(value, field):
        raise InvalidInput(f"{bad}: must be a finite number (no NaN or Infinity)")
    problems = schema_errors(dict(value), schema)
    if problems:
        raise InvalidInput(f"{field}: " + "; ".join(p.replace("$", field, 1) for p in problems))
    return dict(value)


def diff(original: dict[str, Any], edited: dict[str, Any]) -> list[dict[str, Any]]:
    """Changed keys, for the confirmation step: what the reviewer is about to approve."""
    rows = []
    for key in list(original) + [k for k in edited if k not in original]:
        before, after = original.get(key), edited.get(key)
        if key not in edited:
            rows.append({"key": key, "before": before, "after": None, "change": "removed"})
        elif key not in original:
            rows.append({"key": key, "before": None, "after": after, "change": "added"})
        elif before != after:
            rows.append({"key": key, "before": before, "after": after, "change": "changed"})
    return rows
