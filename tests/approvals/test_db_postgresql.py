"""approvals.db.postgresql: a pooled connection is checked at checkout by looking at its
socket; only one the server spoke on is sent the empty statement, and one that fails it is
replaced before any query of the caller's."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest
from django.db import OperationalError, connection, connections
from psycopg_pool import ConnectionPool

from approvals.db.postgresql import base as backend

on_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only")


def _fake(sock: socket.socket, *, closed: bool = False) -> SimpleNamespace:
    return SimpleNamespace(closed=closed, fileno=sock.fileno)


def test_an_idle_socket_has_not_spoken_and_one_with_data_or_its_end_has():
    ours, theirs = socket.socketpair()
    try:
        assert not backend.has_spoken(_fake(ours))
        theirs.sendall(b"E")  # what a terminated backend sends before it closes
        assert backend.has_spoken(_fake(ours))
        ours.recv(1)
        assert not backend.has_spoken(_fake(ours))
        theirs.close()  # the end of the connection is readable too
        assert backend.has_spoken(_fake(ours))
    finally:
        ours.close()
        theirs.close()


def test_a_closed_connection_has_spoken():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert backend.has_spoken(_fake(ours, closed=True))


@pytest.fixture
def pooled():
    """A wrapper of this backend on the test database with a pool of two connections (its
    own, outside `connections`: the pool is what is tested)."""
    settings_dict = {
        **connections.settings["default"],
        "ENGINE": "approvals.db.postgresql",
        "CONN_HEALTH_CHECKS": False,
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            **connections.settings["default"].get("OPTIONS", {}),
            "pool": {"min_size": 2, "max_size": 2, "timeout": 10},
        },
    }
    wrapper = backend.DatabaseWrapper(settings_dict, alias="pool_probe")
    try:
        yield wrapper
    finally:
        wrapper.close()
        wrapper.close_pool()


def _backend_pid(wrapper) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _checks(monkeypatch) -> list:
    calls: list = []
    real = ConnectionPool.check_connection
    monkeypatch.setattr(
        ConnectionPool, "check_connection", staticmethod(lambda c: (calls.append(c), real(c)))
    )
    return calls


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_a_healthy_pooled_connection_is_taken_without_a_round_trip(pooled, monkeypatch):
    calls = _checks(monkeypatch)
    for _ in range(3):
        _backend_pid(pooled)
        pooled.close()  # back to the pool, as each request or task ends
    assert calls == []
    assert pooled.pool.get_stats().get("connections_lost", 0) == 0


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_a_pooled_connection_whose_backend_was_terminated_is_replaced_at_checkout(
    pooled, monkeypatch
):
    pooled.pool.open(wait=True)  # both connections open: a checkout takes one of them
    pids = {_backend_pid(pooled)}
    pooled.close()
    with pooled.pool.connection() as held:  # the other idle one, so the pool has both
        pids.add(held.execute("SELECT pg_backend_pid()").fetchone()[0])
    assert len(pids) == 2
    with connection.cursor() as cursor:  # another session terminates both, as a restart would
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(pids)]
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until both backends are gone (their sockets closed)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [list(pids)]
            )
            if cursor.fetchone()[0] == 0:
                break
        time.sleep(0.05)
    calls = _checks(monkeypatch)
    pid = _backend_pid(pooled)  # the caller's first query works
    assert pid not in pids
    assert len(calls) >= 1  # only the connections that had spoken were sent the statement


@on_postgres
@pytest.mark.django_db(transaction=True)
def test_when_no_pooled_connection_answers_the_checkout_fails_and_keeps_none(pooled, monkeypatch):
    pooled.ensure_connection()
    pooled.close()
    monkeypatch.setattr(backend, "has_spoken", lambda conn: True)
    monkeypatch.setattr(
        ConnectionPool,
        "check_connection",
        staticmethod(lambda conn: (_ for _ in ()).throw(OSError("no answer"))),
    )
    with pytest.raises(OperationalError, match="none of 3 pooled connections"):
        pooled.ensure_connection()
    monkeypatch.undo()
    assert pooled.pool.get_stats()["pool_size"] <= 2  # none was kept out of the pool
    assert _backend_pid(pooled) > 0  # the pool opened new ones: the next checkout works
