"""approvals.management.head_deadline on Twisted's own HTTP channel, with a test clock."""

from __future__ import annotations

import functools

from twisted.internet import task
from twisted.internet.testing import StringTransport
from twisted.web import http

from approvals.management.head_deadline import HeadDeadline, HeadTimedRequest


class _Request(HeadTimedRequest):
    """Daphne's request without its server: the app's part is the test's."""

    handled: list = []

    def __init__(self, *args, deadline, **kwargs):
        self.head_deadline = deadline
        http.Request.__init__(self, *args, **kwargs)
        self.application_queue = None
        self.client_addr = None
        self.server = type("Server", (), {"protocol_disconnected": lambda self, p: None})()

    def process(self):
        self.handled.append(self)


def _connection(seconds: float):
    clock, aborted = task.Clock(), []
    deadline = HeadDeadline(seconds, reactor=clock)
    channel = http.HTTPChannel()
    channel.requestFactory = functools.partial(_Request, deadline=deadline)
    transport = StringTransport()
    transport.abortConnection = lambda: aborted.append(True)
    deadline.transport = transport
    channel.makeConnection(transport)
    deadline.start()
    _Request.handled = []
    return clock, channel, aborted


def test_a_head_that_trickles_is_aborted_at_the_deadline():
    clock, channel, aborted = _connection(2)
    channel.dataReceived(b"GET /a HTTP/1.1\r\n")
    for n in range(3):  # a line every 0.9 s: the idle timer alone would never fire
        clock.advance(0.9)
        channel.dataReceived(f"X-{n}: 1\r\n".encode())
    assert aborted


def test_a_pipelined_request_is_not_cut_off_while_it_is_answered():
    clock, channel, aborted = _connection(2)
    channel.dataReceived(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    first = _Request.handled[0]
    first.write(b"one")
    first.finish()  # Twisted reads the buffered second request here
    assert len(_Request.handled) == 2
    clock.advance(10)  # the second request's answer takes long: its head was in long ago
    assert not aborted
    second = _Request.handled[1]
    second.write(b"two")
    second.finish()
    clock.advance(2.1)  # then nothing comes: the next head is overdue
    assert aborted
