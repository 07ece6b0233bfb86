"""Structured logs: who and what a log line is about, from a context, not from each call.

While a web request or a worker's step is handled, `bind()` (or the `bound()` block) puts
the run id, the request id and the user into a context variable; `ContextFilter`, on the
handler, copies them onto every record logged meanwhile, in that thread or task. The text
format ignores them (the default: lines read as before); the JSON format
(`TOOLNEXUS_LOG_FORMAT=json`) writes them as fields.

Only ids and a username go into the context: never a call's arguments, an answer or a
token, so no log line carries them unless its own message does (and the app's messages
name ids, not values).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

# The fields a context may carry, in the order JSON lines show them.
# `user` is a username; `user_id` names a user where reading their name would cost a query
# (a worker's step names who decided by id).
FIELDS = ("run_id", "request_id", "user", "user_id")

FORMATS = ("text", "json")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "toolnexus_log_context", default=None
)


def current() -> dict[str, Any]:
    """The fields bound now (a copy)."""
    return dict(_context.get() or {})


def _merged(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = set(fields) - set(FIELDS)
    if unknown:  # a typo would silently log nothing: say so at once
        raise TypeError(f"log context fields are {', '.join(FIELDS)}, not {sorted(unknown)}")
    merged = current()
    merged.update({k: v for k, v in fields.items() if v not in (None, "")})
    return merged


def bind(**fields: Any) -> None:
    """Add fields to the context for the rest of the enclosing `scope()` or `bound()` block
    (empty values are left out). Outside one it does nothing: a binding with no end would
    stay on the thread, and name the next request's lines too (a project without the
    middleware)."""
    merged = _merged(fields)
    if _context.get() is not None:
        _context.set(merged)


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """These fields (besides those bound already) on every record logged in the block."""
    token = _context.set(_merged(fields))
    try:
        yield
    finally:
        _context.reset(token)


@contextmanager
def scope() -> Iterator[None]:
    """A fresh context for one unit of work (a web request): whatever `bind()` adds inside is
    gone when the block ends."""
    token = _context.set({})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Copies the bound fields onto each record (a field the call gave in `extra` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_context.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class JsonFormatter(_JsonFormatter):
    """One JSON object a line: time, level, logger, message, then the context's fields and
    any `extra` (python-json-logger adds every non-standard record attribute)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("fmt", "%(asctime)s %(levelname)s %(name)s %(message)s")
        kwargs.setdefault(
            "rename_fields", {"asctime": "time", "levelname": "level", "name": "logger"}
        )
        super().__init__(*args, **kwargs)


def check_format(value: str) -> str:
    """TOOLNEXUS_LOG_FORMAT, checked: a wrong value stops the start with a clear error."""
    cleaned = (value or "text").strip().lower()
    if cleaned not in FORMATS:
        raise ValueError(f"TOOLNEXUS_LOG_FORMAT must be text or json, not {value!r}")
    return cleaned
