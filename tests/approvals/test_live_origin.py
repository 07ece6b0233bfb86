"""approvals.live.origin: a live page's socket opens from the socket's own origin only
(scheme, host and port), not from another site, another port of the same host, a "null"
origin or a Host outside ALLOWED_HOSTS."""

from __future__ import annotations

import logging

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from toolnexus_web.asgi import application

from .factories import TIMEOUT, user_of
from .factories import session_cookie as _session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


async def test_foreign_origin_is_refused():
    reviewer = await user_of("reviewer")
    cookie = await database_sync_to_async(_session_cookie)(reviewer)
    comm = WebsocketCommunicator(
        application,
        "/ws/inbox/",
        headers=[(b"origin", b"http://evil.example"), (b"cookie", f"sessionid={cookie}".encode())],
    )
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert not connected
    await comm.disconnect()


async def _connects_from(origin: bytes, host: bytes) -> bool:
    reviewer = await user_of("reviewer")
    cookie = await database_sync_to_async(_session_cookie)(reviewer)
    comm = WebsocketCommunicator(
        application,
        "/ws/inbox/",
        headers=[(b"origin", origin), (b"host", host), (b"cookie", f"sessionid={cookie}".encode())],
    )
    connected, _ = await comm.connect(timeout=TIMEOUT)
    await comm.disconnect()
    return connected


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        (b"http://testserver:3000", b"testserver"),  # another port of the same host
        (b"http://testserver", b"testserver:8000"),
        (b"http://evil.example", b"testserver"),
        (b"null", b"testserver"),
        (b"http://evil.example", b"evil.example"),  # a Host not in ALLOWED_HOSTS
    ],
)
async def test_an_origin_other_than_the_sockets_own_is_refused(origin, host):
    assert not await _connects_from(origin, host)


@pytest.mark.parametrize(
    ("origin", "host"),
    [(b"http://testserver:8000", b"testserver:8000"), (b"https://testserver", b"testserver:443")],
)
async def test_the_sockets_own_origin_with_its_port_is_accepted(origin, host):
    assert await _connects_from(origin, host)


# -- ALLOWED_HOSTS as Django applies it, and a refusal that says why -------------------------


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        (b"http://127.0.0.1:8000", b"127.0.0.1:8000"),
        (b"http://localhost:8000", b"localhost:8000"),
        (b"http://[::1]:8000", b"[::1]:8000"),
    ],
)
async def test_with_debug_on_and_no_allowed_hosts_loopback_pages_connect(settings, origin, host):
    """startproject's settings (DEBUG on, ALLOWED_HOSTS = []): Django serves the pages on the
    loopback names, so their sockets connect too. Before, every socket got 403."""
    settings.DEBUG = True
    settings.ALLOWED_HOSTS = []
    assert await _connects_from(origin, host)


async def test_with_debug_on_and_no_allowed_hosts_other_names_are_refused(settings, caplog):
    settings.DEBUG = True
    settings.ALLOWED_HOSTS = []
    with caplog.at_level(logging.WARNING, logger="approvals.live.origin"):
        assert not await _connects_from(b"http://shop.example", b"shop.example")
    (record,) = [r for r in caplog.records if r.name == "approvals.live.origin"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "refused" in message and "'http://shop.example'" in message
    assert "'shop.example' is not in ALLOWED_HOSTS (empty: with DEBUG on" in message


@pytest.mark.parametrize(
    ("debug", "allowed", "origin", "host", "reason"),
    [
        (False, [], b"http://127.0.0.1:8000", b"127.0.0.1:8000", "ALLOWED_HOSTS is empty"),
        (False, ["shop.example"], b"http://evil.example", b"evil.example", "not in ALLOWED_HOSTS"),
        (False, ["shop.example"], b"http://shop.example:3000", b"shop.example", "another host"),
        (False, ["shop.example"], b"null", b"shop.example", "not an http(s) page"),
    ],
)
async def test_a_refused_socket_is_logged_with_its_reason(
    settings, caplog, debug, allowed, origin, host, reason
):
    settings.DEBUG = debug
    settings.ALLOWED_HOSTS = allowed
    with caplog.at_level(logging.WARNING, logger="approvals.live.origin"):
        assert not await _connects_from(origin, host)
    messages = [r.getMessage() for r in caplog.records if r.name == "approvals.live.origin"]
    assert len(messages) == 1 and reason in messages[0], messages
    assert repr(origin.decode()) in messages[0] and repr(host.decode()) in messages[0]


async def test_an_accepted_socket_logs_nothing(caplog):
    with caplog.at_level(logging.DEBUG, logger="approvals.live.origin"):
        assert await _connects_from(b"http://testserver", b"testserver")
    assert not [r for r in caplog.records if r.name == "approvals.live.origin"]
