"""Web Push: a browser's subscription (the page's POST, its checks, CSRF, removing one),
delivery through a stand-in push service on loopback (an encrypted POST signed with VAPID,
read back here with the browser's own keys), a push service's 410 / 500, push off without
keys, the service worker's script and the key-pair command."""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import http_ece
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from django.core.management import call_command
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals import checks, testing
from approvals.domain.push import make_vapid_keys
from approvals.execution import notifications
from approvals.models import (
    NotificationDelivery,
    NotificationPreference,
    WebPushSubscription,
)

from .factories import make_user, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = make_vapid_keys()  # a real pair, made once for the module
SUBJECT = "mailto:ops@example.test"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture(autouse=True)
def pushing(settings):
    settings.TOOLNEXUS_NOTIFICATIONS = True
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.TOOLNEXUS_PUBLIC_BASE_URL = "https://approvals.example.test"
    settings.TOOLNEXUS_VAPID_PUBLIC_KEY = KEYS.public_key
    settings.TOOLNEXUS_VAPID_PRIVATE_KEY = KEYS.private_key
    settings.TOOLNEXUS_VAPID_SUBJECT = SUBJECT
    settings.TOOLNEXUS_PUSH_TTL_SECONDS = 600
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    testing.deliver_webhooks()  # the cursor starts now: nothing before it is ever sent


class Browser:
    """What a browser holds for one subscription: its ECDH key pair and auth secret."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)
        point = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        self.p256dh = b64url(point)

    def subscription(self, endpoint: str) -> dict:
        return {"endpoint": endpoint, "keys": {"p256dh": self.p256dh, "auth": b64url(self.auth)}}

    def read(self, body: bytes) -> dict:
        plain = http_ece.decrypt(
            body, private_key=self.key, auth_secret=self.auth, version="aes128gcm"
        )
        return json.loads(plain)


class PushService:
    """A push service on loopback: records each POST and answers with the next status."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.answers: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = outer.answers.pop(0) if outer.answers else 201
                outer.received.append({"path": self.path, "headers": self.headers, "body": body})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def endpoint(self, name: str = "device-1") -> str:
        return f"{self.origin}/push/{name}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[PushService]:
    stub = PushService()
    yield stub
    stub.close()


def subscribe(client, data, **headers):
    return client.post(
        "/notifications/push/subscribe/",
        data=data if isinstance(data, str | bytes) else json.dumps(data),
        content_type="application/json",
        **headers,
    )


def pushed_reviewer(service: PushService, browser: Browser, name: str = "device-1"):
    """A reviewer who turned push on in one browser (through the page's endpoint)."""
    user = make_user()
    answer = subscribe(session_client(user), browser.subscription(service.endpoint(name)))
    assert answer.status_code == 200, answer.content
    return user


def verify_vapid(header: str, audience: str) -> dict:
    """The Authorization header `vapid t=<JWT>,k=<public key>`: signed by the server's
    private key (ES256) for this push service's origin; returns the claims."""
    scheme, _, params = header.partition(" ")
    assert scheme == "vapid"
    fields = dict(part.strip().split("=", 1) for part in params.split(","))
    assert fields["k"] == KEYS.public_key
    signed, _, signature = fields["t"].rpartition(".")
    raw = unb64url(signature)
    der = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), unb64url(KEYS.public_key))
    public.verify(der, signed.encode(), ec.ECDSA(hashes.SHA256()))  # raises when forged
    claims = json.loads(unb64url(signed.split(".")[1]))
    assert claims["aud"] == audience and claims["sub"] == SUBJECT
    assert claims["exp"] > timezone.now().timestamp()
    return claims


# -- subscribing --------------------------------------------------------------------------------


def test_a_subscription_is_stored_for_its_person_and_updated_by_endpoint(service):
    browser = Browser()
    user = make_user()
    client = session_client(user)
    answer = subscribe(
        client, browser.subscription(service.endpoint()), HTTP_USER_AGENT="Firefox on a phone"
    )
    assert answer.status_code == 200
    row = WebPushSubscription.objects.get()
    assert (row.user, row.endpoint, row.p256dh) == (user, service.endpoint(), browser.p256dh)
    assert row.user_agent == "Firefox on a phone"
    # Turning push on in a browser turns the person's push preference on.
    assert NotificationPreference.objects.get(user=user).push_enabled
    # The same browser again (new keys): one row, updated.
    again = Browser()
    assert subscribe(client, again.subscription(service.endpoint())).status_code == 200
    assert WebPushSubscription.objects.get().p256dh == again.p256dh
    # Another account signing in on that browser takes the endpoint over: a browser is never
    # told someone else's requests.
    other = make_user()
    assert (
        subscribe(session_client(other), again.subscription(service.endpoint())).status_code == 200
    )
    assert WebPushSubscription.objects.get().user == other
    page = session_client(other).get("/notifications/").content.decode()
    assert "Turn on push on this device" in page and "Remove" in page
    assert 'src="/static/approvals/push.js"' in page
    assert "Send a test push" in page


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("{not json", "the body is not JSON"),
        ("[1, 2]", "the body must be a JSON object"),
        ({"keys": {}}, "endpoint is missing"),
        ({"endpoint": "https://push.example.test/x"}, "keys is missing"),
        (
            {"endpoint": "https://push.example.test/x", "keys": {"auth": "AAAA"}},
            "keys.p256dh is missing",
        ),
        ("http-endpoint", "endpoint must be an https URL"),
        ("ftp-endpoint", "endpoint must be an https URL"),
        ("short-p256dh", "keys.p256dh must be 65 bytes"),
        ("long-auth", "keys.auth must be 16 bytes"),
        ("bad-base64", "keys.auth is not base64url"),
        ("huge-endpoint", "endpoint is longer than 1000 characters"),
        ("huge-body", "the body is over 4096 bytes"),
    ],
)
def test_a_bad_subscription_is_refused_with_the_reason(body, said):
    browser = Browser()
    good = browser.subscription("https://push.example.test/x")
    cases = {
        "http-endpoint": {**good, "endpoint": "http://push.example.test/x"},
        "ftp-endpoint": {**good, "endpoint": "ftp://127.0.0.1/x"},
        "short-p256dh": {**good, "keys": {**good["keys"], "p256dh": b64url(b"\x04" * 33)}},
        "long-auth": {**good, "keys": {**good["keys"], "auth": b64url(b"a" * 32)}},
        "bad-base64": {**good, "keys": {**good["keys"], "auth": "!!!!"}},
        "huge-endpoint": {**good, "endpoint": "https://push.example.test/" + "x" * 1000},
        "huge-body": {**good, "padding": "x" * 5000},
    }
    answer = subscribe(
        session_client(make_user()),
        cases[body] if isinstance(body, str) and body in cases else body,
    )
    assert answer.status_code == 400
    assert said in answer.json()["error"]
    assert not WebPushSubscription.objects.exists()


def test_subscribing_needs_a_sign_in_and_the_csrf_token(service):
    browser = Browser()
    data = json.dumps(browser.subscription(service.endpoint()))
    assert subscribe(session_client(), data).json() == {"error": "sign in first"}
    strict = session_client(make_user(), enforce_csrf_checks=True)
    strict.get("/notifications/")  # sets the CSRF cookie, as the page does
    assert subscribe(strict, data).status_code == 403
    assert not WebPushSubscription.objects.exists()
    token = strict.cookies["csrftoken"].value
    assert subscribe(strict, data, HTTP_X_CSRFTOKEN=token).status_code == 200
    assert WebPushSubscription.objects.count() == 1


def test_a_person_removes_their_own_browser_and_nobody_elses(service):
    owner = pushed_reviewer(service, Browser())
    row = WebPushSubscription.objects.get()
    stranger = session_client(make_user())
    assert stranger.post(f"/notifications/push/{row.pk}/remove/").status_code == 404
    assert WebPushSubscription.objects.filter(pk=row.pk).exists()
    removed = session_client(owner).post(f"/notifications/push/{row.pk}/remove/", follow=True)
    assert "That browser no longer gets push." in removed.content.decode()
    assert not WebPushSubscription.objects.exists()


# -- delivery -----------------------------------------------------------------------------------


def test_a_new_request_is_pushed_encrypted_and_signed_with_vapid(service):
    browser = Browser()
    reviewer = pushed_reviewer(service, browser)
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    testing.deliver_webhooks()
    assert len(service.received) == 1
    post = service.received[0]
    assert post["path"] == "/push/device-1"
    assert post["headers"]["TTL"] == "600"
    assert post["headers"]["Content-Encoding"] == "aes128gcm"
    verify_vapid(post["headers"]["Authorization"], audience=service.origin)
    assert b"A-1001" not in post["body"]  # encrypted: only the browser reads it
    payload = browser.read(post["body"])
    assert payload["title"] == "New request: demo wants refund"
    assert payload["body"].startswith("demo: refund (") and "A-1001" in payload["body"]
    assert payload["url"] == f"https://approvals.example.test/requests/{row.request_id}/"
    assert payload["icon"] == "https://approvals.example.test/static/approvals/icon.svg"
    delivery = NotificationDelivery.objects.get()
    assert (delivery.channel, delivery.state, delivery.user) == ("push", "delivered", reviewer)
    assert delivery.target == service.endpoint()
    assert WebPushSubscription.objects.get().last_success_at is not None


def test_a_push_about_one_request_has_approve_and_decline_buttons_with_signed_links(service):
    browser = Browser()
    reviewer = pushed_reviewer(service, browser)
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    testing.deliver_webhooks()
    payload = browser.read(service.received[0]["body"])
    actions = payload["actions"]
    assert [(a["action"], a["title"]) for a in actions] == [
        ("approve", "Approve"),
        ("decline", "Decline…"),
    ]
    prefix = "https://approvals.example.test/notifications/link/"
    assert all(a["url"].startswith(prefix) for a in actions)
    client = session_client(reviewer)
    decline = actions[1]["url"].removeprefix("https://approvals.example.test")
    page = client.get(decline)  # the button opens the confirmation page: nothing decided
    assert page.status_code == 200 and b"Decline" in page.content
    row.refresh_from_db()
    assert row.state == "pending"
    assert client.post(decline, {"reason": "not today"}).status_code == 302
    row.refresh_from_db()
    assert (row.state, row.reason, row.decided_by) == ("declined", "not today", reviewer)
    again = client.post(decline, {"reason": "twice"})  # single use
    assert again.status_code == 410 and b"twice" not in again.content


def test_a_digest_push_and_a_watchers_push_have_no_buttons():
    from approvals.models import NotificationItem

    reviewer, watcher = make_user(), make_user(role="watcher")
    rows = [start_and_halt(user=make_user()).requests.get() for _ in range(2)]
    items = [NotificationItem(user=reviewer, request=r) for r in rows]
    *_, digest_actions = notifications.push_message(reviewer, items, digest=True)
    assert digest_actions == []
    *_, one_actions = notifications.push_message(reviewer, items[:1], digest=False)
    assert [a["action"] for a in one_actions] == ["approve", "decline"]
    watching = [NotificationItem(user=watcher, request=rows[0])]
    *_, watcher_actions = notifications.push_message(watcher, watching, digest=False)
    assert watcher_actions == []


def test_a_gone_subscription_is_removed_and_its_push_not_retried(service):
    pushed_reviewer(service, Browser())
    service.answers = [410]
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    delivery = NotificationDelivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("failed", 1)
    assert "410" in delivery.last_error and "subscription removed" in delivery.last_error
    assert not WebPushSubscription.objects.exists()
    assert not DBTaskResult.objects.filter(
        task_path__endswith="deliver_notification", status="READY"
    ).exists()


def test_a_failing_push_service_is_retried_with_backoff_and_logs_no_payload(service, caplog):
    browser = Browser()
    pushed_reviewer(service, browser)
    service.answers = [500]
    start_and_halt(user=make_user())
    with caplog.at_level(logging.DEBUG):
        testing.deliver_webhooks()
    delivery = NotificationDelivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("pending", 1)
    assert "answered 500" in delivery.last_error and delivery.next_attempt_at > timezone.now()
    assert "answered 500" in WebPushSubscription.objects.get().last_error
    retry = DBTaskResult.objects.get(
        task_path__endswith="deliver_notification", status="READY", run_after__isnull=False
    )
    assert retry.args_kwargs["args"] == [delivery.pk]
    assert notifications.attempt(delivery.pk) == "delivered"
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_error) == ("delivered", 2, "")
    assert len(service.received) == 2
    assert "A-1001" in browser.read(service.received[1]["body"])["body"]
    for secret in ("A-1001", KEYS.private_key, browser.p256dh, service.endpoint()):
        assert secret not in caplog.text


def test_a_test_push_goes_to_every_browser_of_the_person(service):
    first, second = Browser(), Browser()
    user = pushed_reviewer(service, first, "phone")
    subscribe(session_client(user), second.subscription(service.endpoint("laptop")))
    client = session_client(user)
    said = client.post("/notifications/test/push/", follow=True).content.decode()
    assert "Test queued (2 message(s))" in said
    testing.deliver_webhooks()
    paths = sorted(p["path"] for p in service.received)
    assert paths == ["/push/laptop", "/push/phone"]
    by_path = {p["path"]: p["body"] for p in service.received}
    payload = first.read(by_path["/push/phone"])
    assert payload["title"] == "toolnexus: a test notification"
    assert payload["url"] == "https://approvals.example.test/notifications/"
    assert second.read(by_path["/push/laptop"])["body"] == payload["body"]


def test_push_is_off_without_keys(settings, service):
    user = pushed_reviewer(service, Browser())
    settings.TOOLNEXUS_VAPID_PRIVATE_KEY = ""
    client = session_client(user)
    page = client.get("/notifications/").content.decode()
    assert "Turn on push" not in page and "push.js" not in page and "Send a test push" not in page
    assert 'name="push_enabled"' not in page
    refused = subscribe(client, Browser().subscription(service.endpoint("other")))
    assert refused.status_code == 403 and "push is off" in refused.json()["error"]
    said = client.post("/notifications/test/push/", follow=True).content.decode()
    assert "Push is off on this server" in said
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert not NotificationDelivery.objects.filter(channel="push").exists()
    assert service.received == []


def test_one_vapid_key_without_the_other_is_a_warning(settings):
    assert not [c for c in checks.run_all() if c.id == "approvals.W004"]
    settings.TOOLNEXUS_VAPID_PRIVATE_KEY = ""
    found = [c for c in checks.run_all() if c.id == "approvals.W004"]
    assert len(found) == 1 and "TOOLNEXUS_VAPID_PRIVATE_KEY is not set" in found[0].msg
    settings.TOOLNEXUS_VAPID_PUBLIC_KEY = ""
    assert not [c for c in checks.run_all() if c.id == "approvals.W004"]


# -- the service worker and the keys ------------------------------------------------------------


def test_the_service_worker_is_served_at_the_apps_root():
    answer = session_client().get("/sw.js")  # no sign-in: the browser fetches it by itself
    assert answer.status_code == 200
    assert answer["Content-Type"].startswith("application/javascript")
    assert answer["Service-Worker-Allowed"] == "/"
    script = answer.content.decode()
    assert 'addEventListener("push"' in script and 'addEventListener("notificationclick"' in script


def test_the_command_prints_a_working_key_pair():
    out = StringIO()
    call_command("vapid_keys", stdout=out)
    lines = dict(line.split("=", 1) for line in out.getvalue().split())
    public, private = lines["TOOLNEXUS_VAPID_PUBLIC_KEY"], lines["TOOLNEXUS_VAPID_PRIVATE_KEY"]
    number = int.from_bytes(unb64url(private), "big")
    derived = ec.derive_private_key(number, ec.SECP256R1()).public_key()
    point = derived.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    assert b64url(point) == public and len(unb64url(public)) == 65
    assert public != KEYS.public_key  # fresh each time
