"""Which worker is running the current task: runs are held under its id (their lease)."""

from __future__ import annotations

import threading

_current = threading.local()


def current_worker_id() -> str:
    return getattr(_current, "worker_id", "adhoc")


def set_current_worker_id(worker_id: str) -> None:
    _current.worker_id = worker_id
