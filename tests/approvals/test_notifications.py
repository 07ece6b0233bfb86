"""Reviewers' notifications: email (locmem backend) and chat (apprise against a loopback
stub), which requests reach whom, quiet hours and digests, retries on a failing channel,
and the signed Approve / Decline links of an email (every bad-link case)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import Group, Permission
from django.core import mail, signing
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals import testing
from approvals.execution import notifications
from approvals.models import (
    AgentAccess,
    AgentPolicy,
    ApprovalRequest,
    NotificationDelivery,
    NotificationItem,
    NotificationLinkUse,
    NotificationPreference,
)

from .factories import make_user, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def notifying(settings):
    settings.TOOLNEXUS_NOTIFICATIONS = True
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.TOOLNEXUS_PUBLIC_BASE_URL = "https://approvals.example.test"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    testing.deliver_webhooks()  # the cursor starts now: nothing before it is ever sent


class ChatStub:
    """A chat service on loopback that apprise's json:// posts to; fails when told to."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.fail_next = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    self.send_response(500)
                    self.end_headers()
                    self.wfile.write(b"chat is down")
                    return
                outer.received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def chat() -> Iterator[ChatStub]:
    stub = ChatStub()
    yield stub
    stub.close()


def reviewer_wanting(**fields):
    user = make_user()
    user.email = f"{user.username}@example.test"
    user.save()
    NotificationPreference.objects.create(user=user, **{"email_enabled": True, **fields})
    return user


def links_in(body: str) -> dict[str, str]:
    """{"approve": path, "decline": path} from an email's body (the path after the base URL)."""
    found = dict(
        re.findall(r"^(Approve|Decline): https://approvals\.example\.test(\S+)$", body, re.M)
    )
    return {k.lower(): v for k, v in found.items()}


# -- what reaches whom ----------------------------------------------------------------------------


def test_an_email_names_the_agent_tool_and_arguments_and_links_to_the_request():
    reviewer = reviewer_wanting()
    run = start_and_halt(user=reviewer)
    row = run.requests.get()
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == [reviewer.email]
    assert message.subject == "New request: demo wants refund"
    assert "demo: refund (" in message.body and "A-1001" in message.body
    assert f"https://approvals.example.test/requests/{row.request_id}/" in message.body
    assert set(links_in(message.body)) == {"approve", "decline"}
    delivery = NotificationDelivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.channel) == ("delivered", 1, "email")
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1  # a request reaches a person once


def test_chat_goes_through_apprise_to_the_url_and_carries_no_signed_links(chat):
    reviewer = reviewer_wanting(email_enabled=False, chat_enabled=True, chat_urls=chat.url)
    run = start_and_halt(user=reviewer)
    testing.deliver_webhooks()
    assert len(chat.received) == 1
    posted = chat.received[0]
    assert posted["title"] == "New request: demo wants refund"
    assert "A-1001" in posted["message"]
    assert f"/requests/{run.requests.get().request_id}/" in posted["message"]
    assert "Approve:" not in posted["message"]
    assert mail.outbox == []


def test_nothing_is_sent_while_notifications_are_off(settings, chat):
    settings.TOOLNEXUS_NOTIFICATIONS = False
    reviewer_wanting(chat_enabled=True, chat_urls=chat.url)
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert mail.outbox == [] and chat.received == []
    assert not NotificationItem.objects.exists()


def test_a_request_of_an_agent_hidden_from_a_person_never_reaches_them(second_demo_agent):
    insiders = Group.objects.create(name="demo2 team")
    policy = AgentPolicy.objects.create(agent="demo2")
    AgentAccess.objects.create(policy=policy, group=insiders, can_decide=True)
    insider = reviewer_wanting()
    insider.groups.add(insiders)
    outsider = reviewer_wanting()
    watcher_without_view = make_user(role="nobody")
    watcher_without_view.email = "nobody@example.test"
    watcher_without_view.save()
    NotificationPreference.objects.create(user=watcher_without_view, email_enabled=True)
    start_and_halt(agent="demo2", user=insider)
    testing.deliver_webhooks()
    assert [m.to for m in mail.outbox] == [[insider.email]]
    assert outsider.email not in str([m.to for m in mail.outbox])


def test_agents_kinds_and_routed_filters(second_demo_agent):
    team = Group.objects.create(name="demo2 deciders")
    policy = AgentPolicy.objects.create(agent="demo2")
    AgentAccess.objects.create(policy=policy, group=team, can_decide=True)
    demo_only = reviewer_wanting(agents="demo")
    questions_only = reviewer_wanting(kinds="question")
    routed = reviewer_wanting(only_routed=True)
    routed.groups.add(team)
    start_and_halt(agent="demo", user=make_user())
    start_and_halt(agent="demo2", user=routed)
    testing.deliver_webhooks()
    got = {m.to[0]: m.subject for m in mail.outbox}
    assert got == {
        demo_only.email: "New request: demo wants refund",
        routed.email: "New request: demo2 wants refund",
    }
    assert questions_only.email not in got
    start_and_halt(prompt="question", user=make_user())
    testing.deliver_webhooks()
    assert [m.subject for m in mail.outbox if m.to == [questions_only.email]] == [
        "New request: demo wants question"
    ]


def test_only_overdue_waits_for_the_request_to_be_overdue(settings):
    settings.TOOLNEXUS_NOTIFICATION_OVERDUE_MINUTES = 60
    reviewer = reviewer_wanting(only_overdue=True)
    run = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert mail.outbox == []
    ApprovalRequest.objects.filter(run=run).update(
        created_at=timezone.now() - timedelta(minutes=61)
    )
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [reviewer.email]
    assert mail.outbox[0].subject == "Overdue: demo wants refund"
    assert "[overdue] demo: refund" in mail.outbox[0].body
    assert notifications.dispatch() == 0  # told once: the next passes make nothing
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1


# -- when: quiet hours and digests ----------------------------------------------------------------


def test_quiet_hours_hold_messages_until_they_end_and_drop_what_was_decided():
    now = timezone.now()
    reviewer = reviewer_wanting(
        quiet_start=(now - timedelta(hours=1)).time(), quiet_end=(now + timedelta(hours=1)).time()
    )
    kept = start_and_halt(user=make_user())
    decided = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert mail.outbox == []
    assert NotificationItem.objects.filter(user=reviewer, sent_at__isnull=True).count() == 2
    testing.services.request_decline(
        request_id=decided.requests.get().request_id, user=make_user(), reason="no"
    )
    NotificationPreference.objects.filter(user=reviewer).update(
        quiet_start=(now + timedelta(hours=1)).time(), quiet_end=(now + timedelta(hours=2)).time()
    )
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1
    body = mail.outbox[0].body
    assert f"/requests/{kept.requests.get().request_id}/" in body
    assert f"/requests/{decided.requests.get().request_id}/" not in body


def test_in_quiet_hours_across_midnight_in_the_persons_time_zone():
    pref = NotificationPreference(
        quiet_start=dtime(22, 0),
        quiet_end=dtime(7, 0),
        time_zone="Europe/Paris",
    )
    at = datetime(2026, 1, 10, 22, 30, tzinfo=UTC)
    assert notifications.in_quiet_hours(pref, at)  # 23:30 in Paris
    assert not notifications.in_quiet_hours(pref, at.replace(hour=6, minute=30))  # 07:30 there
    assert notifications.in_quiet_hours(pref, at.replace(hour=5, minute=30))  # 06:30 there


def test_a_digest_lists_what_arrived_in_one_message_every_n_minutes():
    reviewer = reviewer_wanting(digest_minutes=30)
    first = start_and_halt(user=make_user())
    second = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1
    digest = mail.outbox[0]
    assert digest.subject == "2 request(s) waiting for you"
    for run in (first, second):
        assert f"/requests/{run.requests.get().request_id}/" in digest.body
    third = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1  # within the 30 minutes: waits
    NotificationPreference.objects.filter(user=reviewer).update(
        last_sent_at=timezone.now() - timedelta(minutes=31)
    )
    testing.deliver_webhooks()
    assert len(mail.outbox) == 2
    assert mail.outbox[1].subject == "1 request(s) waiting for you"
    assert f"/requests/{third.requests.get().request_id}/" in mail.outbox[1].body


# -- a failing channel ----------------------------------------------------------------------------


def test_a_failing_chat_is_retried_with_backoff_and_never_holds_back_email(settings, chat):
    settings.TOOLNEXUS_NOTIFICATION_MAX_ATTEMPTS = 3
    chat.fail_next = 1
    reviewer_wanting(chat_enabled=True, chat_urls=chat.url)
    run = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert len(mail.outbox) == 1  # the email went, whatever the chat did
    failed = NotificationDelivery.objects.get(channel="chat")
    assert (failed.state, failed.attempts) == ("pending", 1)
    assert failed.last_error and failed.next_attempt_at > timezone.now()
    retry = DBTaskResult.objects.get(
        task_path__endswith="deliver_notification", status="READY", run_after__isnull=False
    )
    assert retry.args_kwargs["args"] == [failed.pk]
    # The run was not held: its request can be decided at once.
    testing.services.request_decline(
        request_id=run.requests.get().request_id, user=make_user(), reason="no"
    )
    assert notifications.attempt(failed.pk) == "delivered"
    failed.refresh_from_db()
    assert (failed.state, failed.attempts, failed.last_error) == ("delivered", 2, "")
    assert len(chat.received) == 1


def test_a_chat_that_keeps_failing_is_given_up_and_shown_in_the_admin(settings, chat):
    settings.TOOLNEXUS_NOTIFICATION_MAX_ATTEMPTS = 2
    chat.fail_next = 5
    reviewer_wanting(email_enabled=False, chat_enabled=True, chat_urls=chat.url)
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    delivery = NotificationDelivery.objects.get()
    assert notifications.attempt(delivery.pk) == "gave up"
    delivery.refresh_from_db()
    assert delivery.state == "failed" and delivery.attempts == 2
    admin = session_client(make_user(role="superuser"))
    page = admin.get("/admin/approvals/notificationdelivery/").content.decode()
    assert "failed (gave up)" in page and delivery.last_error[:40] in page


# -- the settings page, the admin, and "send a test" ----------------------------------------------


def test_the_page_saves_settings_and_refuses_bad_chat_urls_at_the_field(chat):
    user = make_user()
    client = session_client(user)
    page = client.get("/notifications/")
    assert page.status_code == 200 and 'href="/notifications/"' in page.content.decode()
    form = {"chat_enabled": "on", "time_zone": "UTC", "digest_minutes": "0"}
    for urls, reason in [
        ("mailto://someone@example.test", "the scheme mailto:// is not allowed here"),
        ("nonsense", "is not a URL"),
        ("bogus://hook", "the scheme bogus:// is not allowed here"),
        ("json://", "apprise cannot use this json:// URL"),
    ]:
        refused = client.post("/notifications/", {**form, "chat_urls": urls})
        assert refused.status_code == 400
        assert reason in refused.content.decode()
        assert not NotificationPreference.objects.exists()
    bad_zone = client.post("/notifications/", {**form, "chat_urls": chat.url, "time_zone": "Mars"})
    assert bad_zone.status_code == 400 and "no time zone" in bad_zone.content.decode()
    saved = client.post("/notifications/", {**form, "chat_urls": chat.url})
    assert saved.status_code == 302
    assert NotificationPreference.objects.get(user=user).chat_url_list() == [chat.url]
    tested = client.post("/notifications/test/chat/", follow=True)
    assert "Test queued (1 message(s))" in tested.content.decode()
    testing.deliver_webhooks()
    assert chat.received[0]["title"] == "toolnexus: a test notification"
    assert "delivered" in client.get("/notifications/").content.decode()
    no_email = client.post("/notifications/test/email/", follow=True)
    assert "No test sent: no email address to send to" in no_email.content.decode()


def test_the_services_the_issue_names_are_accepted_by_default():
    from approvals.domain.notifications import chat_url_problems

    for url in [
        "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ/%23general",
        "discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js",
        "matrixs://user:pass@matrix.example.test/%23room",
        "tgram://123456789:abcdefg_hijklmnop/12315544/",
    ]:
        assert chat_url_problems(url) == [], url


def test_the_page_and_the_test_need_a_sign_in(settings):
    client = session_client()
    assert client.get("/notifications/").status_code == 302
    assert client.post("/notifications/test/email/").status_code == 302
    settings.TOOLNEXUS_NOTIFICATIONS = False
    user = reviewer_wanting()
    said = session_client(user).post("/notifications/test/email/", follow=True).content.decode()
    assert "Notifications are off on this server" in said
    assert not NotificationDelivery.objects.exists()


def test_the_admin_refuses_a_scheme_outside_the_allowlist(settings):
    settings.TOOLNEXUS_NOTIFICATION_CHAT_SCHEMES = ("json",)
    admin = session_client(make_user(role="superuser"))
    user = make_user()
    response = admin.post(
        "/admin/approvals/notificationpreference/add/",
        {
            "user": user.pk,
            "chat_enabled": "on",
            "chat_urls": "ntfy://topic",
            "time_zone": "UTC",
            "digest_minutes": "0",
        },
    )
    assert response.status_code == 200
    assert "the scheme ntfy:// is not allowed here (allowed: json)" in response.content.decode()
    assert not NotificationPreference.objects.exists()


# -- signed links ---------------------------------------------------------------------------------


def emailed_links(reviewer) -> tuple[ApprovalRequest, dict[str, str]]:
    run = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    message = next(m for m in mail.outbox if m.to == [reviewer.email])
    return run.requests.get(), links_in(message.body)


def test_an_approve_link_asks_to_confirm_then_approves_once():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    signed_out = session_client().get(links["approve"])
    assert signed_out.status_code == 302 and "next=" in signed_out["Location"]
    client = session_client(reviewer)
    page = client.get(links["approve"])
    assert page.status_code == 200 and "Yes, approve" in page.content.decode()
    row.refresh_from_db()
    assert row.state == "pending"  # a GET decides nothing
    done = client.post(links["approve"])
    assert done.status_code == 302 and done["Location"] == f"/requests/{row.request_id}/"
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("approved", reviewer)
    assert NotificationLinkUse.objects.filter(user=reviewer, action="approve").count() == 1
    for replay in (client.get(links["approve"]), client.post(links["approve"])):
        assert replay.status_code == 410
        assert "This link was already used" in replay.content.decode()


def test_a_decline_link_takes_a_reason():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    client = session_client(reviewer)
    assert "Yes, decline" in client.get(links["decline"]).content.decode()
    client.post(links["decline"], {"reason": "not this month"})
    row.refresh_from_db()
    assert (row.state, row.reason) == ("declined", "not this month")


def test_a_forged_link_changes_nothing():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    client = session_client(reviewer)
    forged_token = signing.dumps(
        {"u": reviewer.pk, "r": row.request_id, "a": "approve", "n": "x"}, salt="another salt"
    )
    tampered = links["approve"].replace(":", ":A", 1)
    for path in (f"/notifications/link/{forged_token}/", tampered):
        for response in (client.get(path), client.post(path)):
            assert response.status_code == 400
            assert "This link is not valid" in response.content.decode()
    row.refresh_from_db()
    assert row.state == "pending" and not NotificationLinkUse.objects.exists()


def test_an_expired_link_changes_nothing(settings, monkeypatch):
    settings.TOOLNEXUS_NOTIFICATION_LINK_HOURS = 1
    reviewer = reviewer_wanting()
    row = start_and_halt(user=make_user()).requests.get()
    real = time.time
    monkeypatch.setattr(signing.time, "time", lambda: real() - 2 * 3600)
    token = notifications.make_link_token(reviewer.pk, row.request_id, "approve")
    monkeypatch.setattr(signing.time, "time", real)
    client = session_client(reviewer)
    for response in (
        client.get(f"/notifications/link/{token}/"),
        client.post(f"/notifications/link/{token}/"),
    ):
        assert response.status_code == 410
        assert "This link has expired" in response.content.decode()
    row.refresh_from_db()
    assert row.state == "pending"


def test_someone_elses_link_changes_nothing():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    other = session_client(make_user())
    for response in (other.get(links["approve"]), other.post(links["approve"])):
        assert response.status_code == 403
        assert "This link is someone else" in response.content.decode()
    row.refresh_from_db()
    assert row.state == "pending" and not NotificationLinkUse.objects.exists()


def test_a_link_to_a_request_decided_meanwhile_says_who_decided_and_stays_unused():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    client = session_client(reviewer)
    page = client.get(links["approve"])  # the confirmation page is open...
    assert page.status_code == 200
    first = make_user()
    testing.services.request_decline(request_id=row.request_id, user=first, reason="no")
    late = client.post(links["approve"])  # ... and someone else decided first
    assert late.status_code == 409
    assert f"Already declined by {first.username}" in late.content.decode()
    assert not NotificationLinkUse.objects.exists()  # its use rolled back with the decision
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("declined", first)


def test_a_link_never_lends_a_permission_its_person_lost():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    reviewer.groups.clear()
    # still sees requests, may no longer decide them
    reviewer.user_permissions.add(*Permission.objects.filter(codename="view_approvalrequest"))
    response = session_client(reviewer).post(links["approve"])
    assert response.status_code == 403
    row.refresh_from_db()
    assert row.state == "pending" and not NotificationLinkUse.objects.exists()


def test_a_link_to_a_request_someone_claimed_asks_to_take_the_claim_over():
    reviewer = reviewer_wanting()
    row, links = emailed_links(reviewer)
    holder = make_user()
    testing.services.request_claim(request_id=row.request_id, user=holder)
    client = session_client(reviewer)
    page = client.get(links["approve"]).content.decode()
    assert f"{holder.username} claimed this request" in page
    asked = client.post(links["approve"])  # a form without the takeover: asks again
    assert (
        asked.status_code == 409 and "confirming takes their claim over" in asked.content.decode()
    )
    row.refresh_from_db()
    assert row.state == "pending" and not NotificationLinkUse.objects.exists()
    assert client.post(links["approve"], {"takeover": "1"}).status_code == 302
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("approved", reviewer)


def test_a_person_sees_only_their_own_messages_and_staff_alone_the_admin_log():
    mine = reviewer_wanting()
    other = reviewer_wanting()
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert NotificationDelivery.objects.count() == 2
    NotificationDelivery.objects.filter(user=other).update(subject="for the other one")
    page = session_client(mine).get("/notifications/").content.decode()
    assert "New request: demo wants refund" in page and "for the other one" not in page
    assert session_client(mine).get("/admin/approvals/notificationdelivery/").status_code == 302
    staff = make_user(is_staff=True)
    assert session_client(staff).get("/admin/approvals/notificationdelivery/").status_code == 403
