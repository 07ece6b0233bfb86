"""Which worker is running the current task: runs are held under its id (their lease)."""

from __future__ import annotations

import threading

_current = threading.local()

# A run's holder is "<worker>:<12 hex digits>" in a 64-character column.
_OWNER_LENGTH = 64 - 13


def lease_owner(worker_id: str) -> str:
    """The part of a worker's id its runs' holders start with (long ids are cut short)."""
    return worker_id[:_OWNER_LENGTH]


def current_worker_id() -> str:
    return getattr(_current, "worker_id", "adhoc")


def set_current_worker_id(worker_id: str) -> None:
    _current.worker_id = worker_id
