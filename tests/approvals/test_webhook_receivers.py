"""Webhooks against a real receiver on loopback that verifies every delivery with the
`standardwebhooks` library: one that answers 500, one slower than the delivery's timeout,
one that closes the connection, one that is down and comes back, and a healthy one beside
failing ones. Each delivery is at least once, under the same event id on every attempt."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from approvals import services, testing
from approvals.execution import webhooks
from approvals.models import WebhookDelivery, WebhookSubscription

from .factories import make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 0.3  # the delivery's timeout in these tests (TOOLNEXUS_WEBHOOK_TIMEOUT_SECONDS)
ATTEMPTS = 3  # TOOLNEXUS_WEBHOOK_MAX_ATTEMPTS


@pytest.fixture(autouse=True)
def quick_deliveries(settings):
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.TOOLNEXUS_WEBHOOK_TIMEOUT_SECONDS = TIMEOUT
    settings.TOOLNEXUS_WEBHOOK_MAX_ATTEMPTS = ATTEMPTS


@pytest.fixture
def no_backoff(monkeypatch):
    """A failed attempt's retry is due at once (the backoff is not a setting)."""
    monkeypatch.setattr(webhooks, "backoff", lambda attempts: timedelta(0))


class Receiver:
    """A host's endpoint on 127.0.0.1. Every POST is verified with the subscription's secret
    (a forged one is answered 400 and kept in `forged`), then answered as `script` says,
    one answer per attempt ("ok" once the script is used up):

    "500": HTTP 500 with "boom <n>"; "slow": nothing until well after the timeout, then 200;
    "close": the connection closed without an answer; "trickle": 200 and its headers at
    once, then the body a byte at a time, each byte within the timeout, the whole after it.
    """

    def __init__(self, name: str, *script: str, log: list | None = None) -> None:
        self.name = name
        self.script = list(script)
        self.secret = ""  # the subscription's, once it is made
        self.attempts: list[tuple[str, dict, str]] = []  # (webhook-id, event, answer)
        self.forged: list[Exception] = []
        self.log = log if log is not None else []  # (name, webhook-id, answer), shared
        self.released = threading.Event()  # set at close: a slow answer ends
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = dict(self.headers)
                try:
                    event = Webhook(outer.secret).verify(body, headers)
                except Exception as exc:
                    outer.forged.append(exc)
                    self.send_response(400)
                    self.end_headers()
                    return
                answer = outer.script.pop(0) if outer.script else "ok"
                outer.attempts.append((headers["webhook-id"], event, answer))
                outer.log.append((outer.name, headers["webhook-id"], answer))
                if answer == "ok":
                    self.send_response(204)
                    self.end_headers()
                elif answer == "500":
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(f"boom {len(outer.attempts)}".encode())
                elif answer == "slow":
                    outer.released.wait(20 * TIMEOUT)
                    self._answer_late()
                elif answer == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Length", "20")
                    self.end_headers()
                    self.wfile.flush()
                    for _ in range(20):
                        if outer.released.wait(TIMEOUT / 3):
                            break
                        self._answer_late(b".")
                elif answer == "close":
                    self.close_connection = True  # and not a byte of an answer
                else:
                    raise AssertionError(answer)

            def _answer_late(self, data: bytes | None = None) -> None:
                try:  # the sender may have hung up by now
                    if data is None:
                        self.send_response(200)
                        self.end_headers()
                    else:
                        self.wfile.write(data)
                        self.wfile.flush()
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        return Handler

    def start(self) -> None:
        """Listen (again, on the same port after `stop`)."""
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Down: the port refuses connections until `start`."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def close(self) -> None:
        self.released.set()
        self.stop()

    def ids(self) -> list[str]:
        return [webhook_id for webhook_id, _, _ in self.attempts]


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.close()


@pytest.fixture
def receiver(receivers):
    """`receiver(name, *script)`: a Receiver subscribed to request.created."""

    def make(name: str, *script: str, log: list | None = None) -> Receiver:
        found = Receiver(name, *script, log=log)
        receivers.append(found)
        subscription = WebhookSubscription(url=found.url, event_types=["request.created"])
        services.webhook_subscribe(subscription)
        found.secret = subscription.secret
        return found

    return make


def delivery_of(found: Receiver) -> WebhookDelivery:
    return WebhookDelivery.objects.get(subscription__url=found.url)


def assert_one_event_on_every_attempt(found: Receiver, delivery: WebhookDelivery) -> None:
    assert found.forged == []
    assert found.ids() == [f"evt_{delivery.event_id}"] * len(found.attempts)
    assert len({repr(event) for _, event, _ in found.attempts}) == 1
    assert found.attempts[0][1]["type"] == "request.created"


def test_a_receiver_answering_500_is_retried_then_marked_failed_with_its_last_error(
    receiver, no_backoff
):
    host = receiver("host", *["500"] * 10)
    start_and_halt(user=make_user())
    assert testing.deliver_webhooks() == ATTEMPTS  # every retry, none beyond the last
    assert testing.deliver_webhooks() == 0
    delivery = delivery_of(host)
    assert delivery.state == "failed" and delivery.attempts == ATTEMPTS
    assert delivery.last_status == 500
    assert delivery.last_error == f"HTTP 500: boom {ATTEMPTS}"
    assert delivery.next_attempt_at is None and delivery.delivered_at is None
    assert len(host.attempts) == ATTEMPTS
    assert_one_event_on_every_attempt(host, delivery)


def test_a_receiver_slower_than_the_timeout_is_timed_out_retried_then_marked_failed(
    receiver, no_backoff
):
    host = receiver("host", *["slow"] * 10)
    start_and_halt(user=make_user())
    began = time.monotonic()
    assert testing.deliver_webhooks() == ATTEMPTS
    # each attempt ended at its timeout, not when the receiver got round to answering
    assert time.monotonic() - began < ATTEMPTS * TIMEOUT + 2
    delivery = delivery_of(host)
    assert delivery.state == "failed" and delivery.attempts == ATTEMPTS
    assert delivery.last_status is None and "Timeout" in delivery.last_error
    assert len(host.attempts) == ATTEMPTS
    assert_one_event_on_every_attempt(host, delivery)


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_timeout(receiver, no_backoff):
    host = receiver("host", "trickle")
    start_and_halt(user=make_user())
    began = time.monotonic()
    assert testing.deliver_webhooks(max_tasks=1) == 1
    # every byte came within the timeout, the whole answer long after it: the attempt is
    # one timeout long, or a receiver could hold the delivery worker as long as it liked
    assert time.monotonic() - began < TIMEOUT + 1.5
    delivery = delivery_of(host)
    assert delivery.state == "pending" and delivery.attempts == 1
    assert delivery.last_status is None and "Timeout" in delivery.last_error
    assert testing.deliver_webhooks() == 1  # the retry, answered at once
    delivery.refresh_from_db()
    assert delivery.state == "delivered"
    assert_one_event_on_every_attempt(host, delivery)


def test_a_receiver_closing_the_connection_unanswered_is_retried_then_marked_failed(
    receiver, no_backoff
):
    host = receiver("host", *["close"] * 10)
    start_and_halt(user=make_user())
    assert testing.deliver_webhooks() == ATTEMPTS
    delivery = delivery_of(host)
    assert delivery.state == "failed" and delivery.attempts == ATTEMPTS
    assert delivery.last_status is None
    assert "RemoteProtocolError" in delivery.last_error
    assert len(host.attempts) == ATTEMPTS
    assert_one_event_on_every_attempt(host, delivery)


def test_a_receiver_down_then_restarted_gets_the_event_later_under_the_same_id(
    receiver, no_backoff
):
    host = receiver("host", "500")
    start_and_halt(user=make_user())
    assert testing.deliver_webhooks(max_tasks=1) == 1  # answered 500
    host.stop()
    assert testing.deliver_webhooks(max_tasks=1) == 1  # nobody listens
    delivery = delivery_of(host)
    assert delivery.state == "pending" and delivery.attempts == 2
    assert "ConnectError" in delivery.last_error
    host.start()
    assert testing.deliver_webhooks() == 1
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.attempts == 3
    assert delivery.last_status == 204 and delivery.last_error == ""
    # at least once: the 500'd attempt and the delivered one carry one id and one event
    assert [answer for _, _, answer in host.attempts] == ["500", "ok"]
    assert_one_event_on_every_attempt(host, delivery)
    assert testing.deliver_webhooks() == 0


def test_failing_and_slow_receivers_never_hold_up_a_healthy_one(receiver):
    log: list[tuple[str, str, str]] = []
    # subscribed first: their deliveries are queued ahead of the healthy one's
    slow = receiver("slow", *["slow"] * 10, log=log)
    broken = receiver("broken", *["500"] * 10, log=log)
    closing = receiver("closing", *["close"] * 10, log=log)
    healthy = receiver("healthy", log=log)
    start_and_halt(user=make_user())
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    # the healthy receiver has both events, each delivered in its own task
    assert [answer for _, _, answer in healthy.attempts] == ["ok", "ok"]
    assert set(
        WebhookDelivery.objects.filter(subscription__url=healthy.url).values_list(
            "state", flat=True
        )
    ) == {"delivered"}
    # the others were tried once each; their retries wait for their backoff in the queue,
    # behind nothing and holding nothing: no attempt ran twice before the healthy one's
    for failing in (slow, broken, closing):
        assert len(failing.attempts) == 2 and len(set(failing.ids())) == 2
        for delivery in WebhookDelivery.objects.filter(subscription__url=failing.url):
            assert delivery.state == "pending" and delivery.attempts == 1
            assert delivery.next_attempt_at > timezone.now()
    assert len(log) == 8 and len(set(log)) == 8


def test_a_slow_receiver_holds_one_delivery_worker_while_another_delivers(receiver, settings):
    """Two delivery workers (TOOLNEXUS_WEBHOOK_WORKERS): the slow receiver's delivery, queued
    first, holds one of them for its timeout; the healthy receiver gets its event from the
    other meanwhile. With one worker it would wait out the slow attempt."""
    from approvals.execution.worker import delivery_workers

    settings.TOOLNEXUS_WEBHOOK_TIMEOUT_SECONDS = 4.0
    settings.TOOLNEXUS_WEBHOOK_WORKERS = 2
    settings.TOOLNEXUS_WEBHOOK_DISPATCH_SECONDS = 0.05
    slow = receiver("slow", "slow")
    healthy = receiver("healthy")
    start_and_halt(user=make_user())
    workers = delivery_workers()
    assert len(workers) == 2 and [w.maintenance_every > 0 for w in workers] == [True, False]
    threads = [threading.Thread(target=w.run_forever, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 3.0  # well inside the slow attempt's 4 s
        while time.monotonic() < deadline and not healthy.attempts:
            time.sleep(0.05)
        assert [answer for _, _, answer in healthy.attempts] == ["ok"]
        assert [answer for _, _, answer in slow.attempts] == ["slow"]  # still in flight
        assert delivery_of(slow).attempts == 0
    finally:
        slow.released.set()
        for w in workers:
            w.stop.set()
        for thread in threads:
            thread.join(timeout=10)
