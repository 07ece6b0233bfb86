"""Work that must answer within a deadline even when what it waits on hangs (a database or a
Redis that no longer answers): run in a small pool of threads of its own, waited for at most
`timeout` seconds. Work still running past its deadline is left to end by its own driver
timeouts; the pool is small, so a hung dependency ties up a few threads, never a request."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from django.db import connections

T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=6, thread_name_prefix="toolnexus-probe")


def _closing(fn: Callable[[], T]) -> Callable[[], T]:
    def run() -> T:
        try:
            return fn()
        finally:
            connections.close_all()  # this thread's: back to the pool, or closed

    return run


def submit(fn: Callable[[], T]) -> Future[T]:
    """Start `fn` in a probe thread (its database connections are closed when it ends)."""
    return _pool.submit(_closing(fn))
