"""Host events: the audit trail's changes as `/api/events` (server-sent events) and as
webhooks signed per the Standard Webhooks specification, delivered at least once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django_tasks_db.models import DBTaskResult
from standardwebhooks.webhooks import Webhook

from approvals import services, testing
from approvals.checks import check_task_backend
from approvals.models import AgentAccess, AgentPolicy, WebhookDelivery, WebhookSubscription

from .factories import bearer, drain, make_user, post_json, session_client, start_and_halt

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The test client reads the async stream synchronously, as a WSGI server could not.
    pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous"),
]


@pytest.fixture(autouse=True)
def quick_events(settings):
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.TOOLNEXUS_EVENTS_POLL_SECONDS = 0.05
    settings.TOOLNEXUS_EVENTS_STREAM_SECONDS = 0.4


def read_stream(client: Client, path: str = "/api/events?after=evt_0", **headers) -> list[dict]:
    """The events a stream sent before it ended (frames with data, parsed)."""
    response = client.get(path, headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/event-stream"
    text = b"".join(response).decode()  # the async stream, consumed as a server would
    frames = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            frames.append({**fields, "data": json.loads(fields["data"])})
    return frames


def decide_flow(user, *, decline: bool) -> str:
    """A demo refund halted and decided through the API, and its run finished."""
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    action = "decline" if decline else "approve"
    body = {"reason": "too much"} if decline else {}
    response = post_json(session_client(user), f"/api/requests/{request_id}/{action}", body)
    assert response.status_code == 200, response.content
    drain()
    return request_id


# -- the event stream ------------------------------------------------------------------------


def test_the_stream_tells_a_run_from_halt_to_decision_to_end_in_order():
    reviewer = make_user()
    request_id = decide_flow(reviewer, decline=True)
    frames = read_stream(session_client(reviewer))
    assert [f["event"] for f in frames] == [
        "run.pending",
        "request.created",
        "request.decided",
        "run.finished",
    ]
    decided = frames[2]["data"]
    assert decided["id"] == frames[2]["id"]
    assert decided["data"]["request_id"] == request_id
    assert decided["data"]["state"] == "declined"
    assert decided["data"]["reason"] == "too much"
    assert decided["data"]["decided_by"] == {"type": "person", "username": reviewer.username}
    assert frames[3]["data"]["data"]["run_status"] == "done"
    # ids are stable and increasing: what Last-Event-ID resumes from
    ids = [int(f["id"].removeprefix("evt_")) for f in frames]
    assert ids == sorted(ids) and len(set(ids)) == 4


def test_a_reconnect_with_last_event_id_loses_nothing_and_repeats_nothing():
    reviewer = make_user()
    decide_flow(reviewer, decline=False)
    client = session_client(reviewer)
    first = read_stream(client)
    resumed = read_stream(client, "/api/events", **{"Last-Event-ID": first[1]["id"]})
    assert [f["id"] for f in resumed] == [f["id"] for f in first[2:]]
    # without an id, a stream starts with the next event, not the past
    assert read_stream(client, "/api/events") == []


def test_the_stream_filters_by_type_and_refuses_unknown_types_and_ids():
    reviewer = make_user()
    decide_flow(reviewer, decline=False)
    client = session_client(reviewer)
    frames = read_stream(client, "/api/events?after=evt_0&types=run.finished")
    assert [f["event"] for f in frames] == ["run.finished"]
    bad = client.get("/api/events?types=run.exploded")
    assert bad.status_code == 400 and "run.exploded" in bad.json()["detail"]
    bad = client.get("/api/events", headers={"Last-Event-ID": "yesterday"})
    assert bad.status_code == 400 and "event id" in bad.json()["detail"]


def test_the_stream_never_carries_an_agent_hidden_from_the_caller(second_demo_agent):
    insiders = Group.objects.create(name="demo2 team")
    policy = AgentPolicy.objects.create(agent="demo2")
    AgentAccess.objects.create(policy=policy, group=insiders, can_decide=True)
    owner = make_user()
    owner.groups.add(insiders)
    start_and_halt(agent="demo2", user=owner)
    start_and_halt(agent="demo", user=owner)
    outsider = make_user()
    seen = read_stream(session_client(outsider), headers := "/api/events?after=evt_0")
    assert {f["data"]["data"]["agent"] for f in seen} == {"demo"}
    assert headers  # the same stream, the bearer way
    seen = read_stream(Client(), headers, **bearer(outsider))
    assert {f["data"]["data"]["agent"] for f in seen} == {"demo"}
    insider = type(owner).objects.get(pk=owner.pk)
    assert {f["data"]["data"]["agent"] for f in read_stream(session_client(insider))} == {
        "demo",
        "demo2",
    }


def test_the_stream_needs_sign_in_and_the_view_permission_and_ends_for_a_revoked_token():
    start_and_halt(user=make_user())
    assert Client().get("/api/events").status_code == 401
    assert session_client(make_user(role="nobody")).get("/api/events").status_code == 403
    watcher = make_user(role="watcher")
    token, row = services.api_token_create(user=watcher, name="stream")
    response = Client().get("/api/events?after=evt_0", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    services.api_token_revoke(token_id=row.pk, user=watcher)  # before the stream's first poll
    text = b"".join(response).decode()  # the async stream, consumed as a server would
    assert "event: closed" in text and "request.created" not in text


# -- webhooks --------------------------------------------------------------------------------


class Endpoint:
    """A host's webhook endpoint on loopback: records what arrives, fails when told to."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, dict[str, str]]] = []
        self.fail_next = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b"try later")
                    return
                outer.received.append((body, dict(self.headers)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    found = Endpoint()
    yield found
    found.close()


def subscribe(url: str, **fields) -> WebhookSubscription:
    subscription = WebhookSubscription(url=url, **fields)
    services.webhook_subscribe(subscription)
    return subscription


def test_webhooks_are_signed_per_the_standard_and_carry_each_event_once(endpoint):
    before = start_and_halt(user=make_user())  # before the subscription: never sent
    assert before.pk
    subscription = subscribe(endpoint.url, event_types=["request.created", "request.decided"])
    request_id = decide_flow(make_user(), decline=True)
    assert testing.deliver_webhooks() == 2
    assert testing.deliver_webhooks() == 0  # nothing twice
    verifier = Webhook(subscription.secret)
    events = [verifier.verify(body, headers) for body, headers in endpoint.received]
    assert [e["type"] for e in events] == ["request.created", "request.decided"]
    assert all(e["data"]["request_id"] == request_id for e in events)
    assert events[1]["data"]["reason"] == "too much"
    ids = [headers["webhook-id"] for _, headers in endpoint.received]
    assert len(set(ids)) == 2 and all(i.startswith("evt_") for i in ids)
    # a body changed on the way fails verification
    body, headers = endpoint.received[0]
    with pytest.raises(Exception, match="signature"):
        verifier.verify(body.replace(b"request", b"requests", 1), headers)
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"delivered"}


def test_a_failing_endpoint_is_retried_later_with_the_same_id_and_redelivery_works(
    endpoint, settings
):
    subscribe(endpoint.url, event_types=["request.created"])
    start_and_halt(user=make_user())
    endpoint.fail_next = 1
    assert testing.deliver_webhooks() == 1
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == "pending" and delivery.attempts == 1
    assert delivery.last_status == 503 and "try later" in delivery.last_error
    assert delivery.next_attempt_at is not None
    # the retry waits (backoff): nothing is due now, a task row waits for its time
    assert testing.deliver_webhooks() == 0
    assert DBTaskResult.objects.filter(
        task_path__endswith="deliver_webhook", status="READY", run_after__isnull=False
    ).exists()
    assert services.webhook_redeliver([delivery.pk]) == 1
    assert testing.deliver_webhooks() >= 1
    delivery.refresh_from_db()
    assert delivery.state == "delivered" and delivery.last_error == ""
    assert [h["webhook-id"] for _, h in endpoint.received] == [f"evt_{delivery.event_id}"]


def test_a_delivery_gives_up_after_its_attempts_and_never_blocks_a_run(endpoint, settings):
    settings.TOOLNEXUS_WEBHOOK_MAX_ATTEMPTS = 1
    subscribe(endpoint.url)
    endpoint.fail_next = 100
    request_id = decide_flow(make_user(), decline=False)  # the run finished regardless
    testing.deliver_webhooks()
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"failed"}
    assert request_id


def test_an_unreachable_endpoint_is_an_error_on_the_delivery_not_a_crash(settings):
    subscribe("http://127.0.0.1:9/nothing-listens")
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    delivery = WebhookDelivery.objects.first()
    assert delivery.state == "pending" and delivery.attempts == 1
    assert "ConnectError" in delivery.last_error


def test_check_w003_warns_when_the_webhooks_queue_is_not_allowed(settings):
    settings.TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
    (warning,) = check_task_backend()
    assert warning.id == "approvals.W003"
    settings.TASKS = {
        "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default", "webhooks"]}
    }
    assert check_task_backend() == []


def test_the_admin_makes_a_subscription_with_a_secret_and_redelivers(endpoint):
    start_and_halt(user=make_user())  # an event from before: the new subscription skips it
    admin = session_client(make_user(role="superuser"))
    page = admin.get("/admin/approvals/webhooksubscription/add/")
    assert page.status_code == 200
    secret = page.context["adminform"].form.initial["secret"]
    assert secret.startswith("whsec_")
    response = admin.post(
        "/admin/approvals/webhooksubscription/add/",
        {
            "url": endpoint.url,
            "description": "shop",
            "event_types": ["run.pending"],
            "active": "on",
            "secret": secret,
        },
    )
    assert response.status_code == 302, response.content
    bad = admin.post(
        "/admin/approvals/webhooksubscription/add/",
        {"url": "ftp://example.com/x", "secret": secret, "active": "on"},
    )
    assert bad.status_code == 200 and WebhookSubscription.objects.count() == 1
    start_and_halt(user=make_user())
    assert testing.deliver_webhooks() == 1
    delivery = WebhookDelivery.objects.get()
    assert delivery.state == "delivered"
    log = admin.get("/admin/approvals/webhookdelivery/")
    assert log.status_code == 200 and f"evt_{delivery.event_id}".encode() in log.content
    done = admin.post(
        "/admin/approvals/webhookdelivery/",
        {"action": "redeliver", "_selected_action": [delivery.pk]},
    )
    assert done.status_code == 302
    assert testing.deliver_webhooks() == 1
    assert len(endpoint.received) == 2  # the same event twice, by request
    assert {h["webhook-id"] for _, h in endpoint.received} == {f"evt_{delivery.event_id}"}
    # a reviewer without staff rights sees none of it
    reviewer = session_client(make_user())
    assert reviewer.get("/admin/approvals/webhookdelivery/").status_code == 302


@pytest.mark.parametrize(
    "query",
    ["after=evt_99999999999999999999999", "after=evt_-1", "types=%00", "types=run.finished,,x"],
)
def test_bad_stream_parameters_are_400_with_a_reason(query):
    response = session_client(make_user()).get(f"/api/events?{query}")
    assert response.status_code == 400
    assert response.json()["detail"]
