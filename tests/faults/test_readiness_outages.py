"""/readyz against real outages: a server process reports a dead Redis, a killed worker and
an unreachable PostgreSQL as 503 naming the failed check within 10 seconds, and no answer
takes longer than its checks' deadline.

Redis is a redis-server of the test's own (killed); PostgreSQL is the machine's shared one,
reached by the server through a TCP relay of the test's own, which the test stops (the
server cannot tell that from PostgreSQL stopping; nobody else's connections are touched).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from .conftest import free_port

pytestmark = pytest.mark.faults

READY_TIMEOUT = 2.0  # the servers' TOOLNEXUS_READY_TIMEOUT
NOTICED_WITHIN = 10.0


def readyz(server) -> tuple[int, dict, float]:
    started = time.monotonic()
    response = httpx.get(server.url + "/readyz", timeout=READY_TIMEOUT + 5)
    return response.status_code, response.json(), time.monotonic() - started


def wait_ready(server, deadline: float = 20.0) -> dict:
    until = time.monotonic() + deadline
    while True:
        status, body, _ = readyz(server)
        if status == 200:
            return body
        if time.monotonic() > until:
            raise AssertionError(f"/readyz never became ready: {body}")
        time.sleep(0.2)


def noticed(server, check: str) -> dict:
    """Poll /readyz from now until it names `check` as failed; within NOTICED_WITHIN s, each
    answer within the checks' deadline."""
    since = time.monotonic()
    while True:
        status, body, took = readyz(server)
        assert took < READY_TIMEOUT + 1.5, f"/readyz took {took:.1f} s: {body}"
        if status == 503 and check in body["failed"]:
            return body
        assert time.monotonic() - since < NOTICED_WITHIN, f"{check} not reported: {body}"
        time.sleep(0.2)


class Relay:
    """A TCP relay from a local port to `target`; `stop()` closes it and every connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.stopped.is_set():
                client.close()
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone does not)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def test_a_killed_redis_and_a_killed_worker_are_reported(stack):
    port = free_port()
    redis_proc = stack.redis_server(port)
    redis_url = f"redis://127.0.0.1:{port}/0"
    settings = {
        "REDIS_URL": redis_url,
        "TOOLNEXUS_READY_TIMEOUT": str(READY_TIMEOUT),
        "TOOLNEXUS_READY_WORKER_SECONDS": "4",  # the worker beats every second (3 s lease)
    }
    server = stack.server(**settings)
    worker = stack.worker(REDIS_URL=redis_url)
    body = wait_ready(server)
    assert body["checks"]["channel_layer"]["hosts"] == 1

    assert redis_proc.kill9() == -9
    body = noticed(server, "channel_layer")
    assert body["checks"]["database"]["ok"]

    assert worker.kill9() == -9
    body = noticed(server, "worker")
    assert "no worker has beaten within 4 s" in body["checks"]["worker"]["error"]


def test_an_unreachable_database_is_reported(stack):
    parts = urlsplit(stack.db_url)
    relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432))
    try:
        credentials = parts.netloc.rpartition("@")[0]
        address = f"127.0.0.1:{relay.port}"
        through_relay = urlunsplit(
            parts._replace(netloc=f"{credentials}@{address}" if credentials else address)
        )
        server = stack.server(
            DATABASE_URL=through_relay,
            TOOLNEXUS_READY_TIMEOUT=str(READY_TIMEOUT),
            TOOLNEXUS_READY_WORKER_SECONDS="0",
        )
        wait_ready(server)
        relay.stop()
        body = noticed(server, "database")
        assert body["failed"] == ["database", "migrations", "worker"]
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
    finally:
        relay.stop()
