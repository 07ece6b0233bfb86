"""approvals.live.origin: a live page's socket opens from the socket's own origin only
(scheme, host and port), not from another site, another port of the same host, a "null"
origin or a Host outside ALLOWED_HOSTS."""

from __future__ import annotations

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
