"""A deadline for a request's head on `serve`'s connections (TOOLNEXUS_HTTP_HEADER_TIMEOUT).

Daphne's idle timeout starts again with every byte received, so a client sending one header
line every few seconds held its connection open for as long as it liked. Here a connection
must finish each request's head (request line and headers) within the deadline: counted from
the connection's start for its first request, and from the end of the previous response for
each next one on a kept-alive connection. Past it the connection is aborted.

Twisted's own hooks do the work: the timer is the reactor's, started when the connection is
made, stopped by the request once its headers are all in (`gotLength`,
which Twisted calls then), started again when a response is finished."""

from __future__ import annotations

import functools
import logging
from typing import Any

from daphne.http_protocol import WebRequest

log = logging.getLogger(__name__)


class HeadDeadline:
    """One connection's timer."""

    def __init__(self, seconds: float, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        self.seconds = seconds
        self.transport: Any = None  # the connection's, given when it is made
        self.call: Any = None

    def start(self) -> None:
        self.stop()
        self.call = self.reactor.callLater(self.seconds, self._expire)

    def stop(self) -> None:
        if self.call is not None and self.call.active():
            self.call.cancel()
        self.call = None

    def _expire(self) -> None:
        self.call = None
        transport = self.transport
        if transport is None or getattr(transport, "disconnected", False):
            return
        log.info(
            "closing a connection from %s: its request head took over %s s",
            transport.getPeer(),
            self.seconds,
        )
        transport.abortConnection()


class HeadTimedRequest(WebRequest):
    def __init__(self, *args: Any, deadline: HeadDeadline, **kwargs: Any) -> None:
        self.head_deadline = deadline
        super().__init__(*args, **kwargs)

    def gotLength(self, length: int | None) -> None:
        self.head_deadline.stop()  # the head is in: the body and the app have timeouts of their own
        super().gotLength(length)

    def finish(self) -> None:
        # The next request's head is due from now. Started before Twisted's finish(), which
        # reads a pipelined request already buffered (its gotLength stops the timer again).
        if getattr(getattr(self, "channel", None), "persistent", False):
            self.head_deadline.start()
        super().finish()

    def connectionLost(self, reason: Any) -> None:
        self.head_deadline.stop()
        super().connectionLost(reason)


def limit_request_heads(factory: Any, seconds: float) -> None:
    """Make each connection `factory` (Daphne's HTTP factory) builds from now on finish its
    request heads within `seconds` (0 or None: no limit)."""
    if not seconds:
        return
    build = factory.buildProtocol

    def build_with_deadline(addr: Any) -> Any:
        protocol = build(addr)
        if protocol is None:
            return None
        deadline = HeadDeadline(seconds)
        protocol.requestFactory = functools.partial(HeadTimedRequest, deadline=deadline)
        make_connection = protocol.makeConnection

        def make_timed_connection(transport: Any) -> None:
            deadline.transport = transport
            deadline.start()
            make_connection(transport)

        protocol.makeConnection = make_timed_connection
        return protocol

    factory.buildProtocol = build_with_deadline
