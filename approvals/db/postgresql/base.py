"""Django's PostgreSQL backend, with pooled connections checked without a round trip.

With psycopg's pool, Django checks a connection each time it takes one from the pool
(CONN_HEALTH_CHECKS): an empty statement to the server and back. A process takes a
connection for every request, task and `database_sync_to_async` call, so the check was one
statement in every worker step and several per decision across the servers
(bench/vs_langgraph.py, bench/decision_latency.py).

This backend looks instead: a connection resting in the pool has nothing to read, so when
its socket is readable the server has spoken unasked (its goodbye when a backend is
terminated or the server restarts, or the connection's end). Only then is the empty
statement sent, and a connection that fails it is dropped and the next one taken, as the
pool's own check would. A connection cut without a word from the server (a network that
drops its packets) is found when it is used, as the empty statement would find it.

    DATABASES = {"default": {"ENGINE": "approvals.db.postgresql", "CONN_HEALTH_CHECKS": False,
                             "OPTIONS": {"pool": {...}}, ...}}

CONN_HEALTH_CHECKS=False turns the pool's own check off; this one is on whenever the pool
is. Without a pool the backend is Django's.
"""

from __future__ import annotations

import logging
import select
from typing import Any

from django.db.backends.postgresql import base

log = logging.getLogger(__name__)


def has_spoken(conn: Any) -> bool:
    """Whether an idle connection's socket has anything to read (or is gone)."""
    if conn.closed:
        return True
    try:
        fd = conn.fileno()
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        readable, _, _ = select.select([fd], [], [], 0)
        return bool(readable)
    except (OSError, ValueError):
        return True


def usable(conn: Any) -> bool:
    """A pooled connection at checkout: unspoken, or it still answers an empty statement."""
    if not has_spoken(conn):
        return True
    from psycopg_pool import ConnectionPool

    try:
        ConnectionPool.check_connection(conn)
    except Exception as exc:
        log.info("a pooled connection failed its check: %s", exc)
        conn.close()
        return False
    return True


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        if self.pool is None:
            return connection
        # Every connection in the pool may have been cut at once (a restart): once the pool
        # has dropped as many as it holds, the next is one it opened since.
        attempts = self.pool.max_size + 1
        for attempt in range(attempts):
            # The pool the connection came from, as Django's own close returns it there.
            pool = connection._pool
            try:
                ok = usable(connection)
            except BaseException:
                pool.putconn(connection)
                raise
            if ok:
                return connection
            pool.putconn(connection)  # closed: the pool drops it and opens another
            if attempt + 1 < attempts:
                connection = super().get_new_connection(conn_params)
        raise self.Database.OperationalError(
            f"none of {attempts} pooled connections answered the server's check"
        )
