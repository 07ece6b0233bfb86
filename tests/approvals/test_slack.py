"""Slack: each new request posted to the team's channel with Approve / Decline buttons
(against a Slack Web API stub on loopback), the actions endpoint (Slack's signature, the
link between a Slack user and a person, the decision through the usual services), the
message updated with the outcome, and every refusal changing nothing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Permission
from django.core import signing
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from slack_sdk.signature import SignatureVerifier

from approvals import checks, testing
from approvals.execution import slack
from approvals.models import Rule, SlackLink, SlackMessage

from .factories import drain, fresh, make_user, session_client, start_and_halt, tool_output

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "slack-signing-secret-for-tests"
TEAM = "T0TEAM"
CHANNEL = "C0APPROVALS"


class SlackStub:
    """Slack's Web API on loopback: records each call (method, JSON body); fails when told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.fail_next = 0
        self.ts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                method = self.path.rsplit("/", 1)[-1]
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    self._answer({"ok": False, "error": "channel_not_found"})
                    return
                data = json.loads(body or b"{}")
                outer.calls.append((method, data))
                outer.ts += 1
                self._answer({"ok": True, "channel": data.get("channel"), "ts": f"17.{outer.ts}"})

            def _answer(self, data):
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, method: str) -> list[dict]:
        return [data for name, data in self.calls if name == method]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(settings) -> Iterator[SlackStub]:
    stub = SlackStub()
    settings.TOOLNEXUS_SLACK_BOT_TOKEN = "xoxb-test"
    settings.TOOLNEXUS_SLACK_SIGNING_SECRET = SECRET
    settings.TOOLNEXUS_SLACK_CHANNEL = CHANNEL
    settings.TOOLNEXUS_SLACK_API_URL = stub.url
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    settings.TOOLNEXUS_PUBLIC_BASE_URL = "https://approvals.example.test"
    testing.deliver_webhooks()  # the cursor starts now: nothing before it is ever posted
    yield stub
    stub.close()


def posted_request():
    """A request halted and posted to the channel: (run, request, its SlackMessage)."""
    run = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    row = run.requests.get()
    return run, row, SlackMessage.objects.get(request=row)


def click_body(msg: SlackMessage, action: str, *, user="U0ANN", reason=None, team=TEAM) -> bytes:
    payload = {
        "type": "block_actions",
        "team": {"id": team, "domain": "acme"},
        "user": {"id": user, "username": "ann.slack", "team_id": team},
        "container": {"type": "message", "channel_id": msg.channel, "message_ts": msg.ts},
        "channel": {"id": msg.channel},
        "actions": [{"action_id": action, "block_id": "decide", "value": msg.request.request_id}],
        "state": {"values": {"reason": {"reason": {"type": "plain_text_input", "value": reason}}}},
        "response_url": "https://hooks.slack.invalid/never-used",
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed(body: bytes, *, at: float | None = None, secret: str = SECRET) -> dict[str, str]:
    stamp = str(int(at if at is not None else time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature}


def post_click(body: bytes, headers: dict[str, str] | None = None):
    return session_client().post(
        "/slack/actions/",
        data=body,
        content_type="application/x-www-form-urlencoded",
        headers=signed(body) if headers is None else headers,
    )


def answers(api: SlackStub) -> list[dict]:
    testing.deliver_webhooks()
    return api.of("chat.postEphemeral")


def link(user, slack_user="U0ANN") -> SlackLink:
    return SlackLink.objects.create(
        user=user, team_id=TEAM, slack_user_id=slack_user, slack_name="ann.slack"
    )


# -- posting -------------------------------------------------------------------------------------


def test_a_new_request_is_posted_with_its_agent_tool_arguments_link_and_buttons(api):
    run, row, msg = posted_request()
    [sent] = api.of("chat.postMessage")
    assert sent["channel"] == CHANNEL and "demo wants refund" in sent["text"]
    text = json.dumps(sent["blocks"])
    assert "A-1001" in text and "*Tool:* refund" in text
    assert f"https://approvals.example.test/requests/{row.request_id}/" in text
    [actions] = [b for b in sent["blocks"] if b["type"] == "actions"]
    buttons = {e["action_id"]: e for e in actions["elements"]}
    assert buttons["approve"]["style"] == "primary" and buttons["decline"]["style"] == "danger"
    assert {b["value"] for b in buttons.values()} == {row.request_id}
    assert any(b["type"] == "input" and b["block_id"] == "reason" for b in sent["blocks"])
    assert (msg.state, msg.channel, msg.ts, msg.attempts) == ("posted", CHANNEL, "17.1", 1)
    testing.deliver_webhooks()
    assert len(api.of("chat.postMessage")) == 1  # a request is posted once
    assert fresh(run).status == "pending"


def test_nothing_is_posted_unless_slack_is_set_up(api, settings):
    settings.TOOLNEXUS_SLACK_CHANNEL = ""
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    assert api.calls == [] and not SlackMessage.objects.exists()


def test_a_failing_slack_is_retried_with_backoff_recorded_and_never_holds_a_decision(api, settings):
    settings.TOOLNEXUS_NOTIFICATION_MAX_ATTEMPTS = 2
    api.fail_next = 1
    run = start_and_halt(user=make_user())
    testing.deliver_webhooks()
    msg = SlackMessage.objects.get()
    assert (msg.state, msg.attempts) == ("pending", 1)
    assert msg.last_error == "Slack said channel_not_found"
    assert msg.next_attempt_at > timezone.now()
    retry = DBTaskResult.objects.get(
        task_path__endswith="post_slack_message", status="READY", run_after__isnull=False
    )
    assert retry.args_kwargs["args"] == [msg.pk]
    assert slack.attempt_post(msg.pk) == "posted"
    msg.refresh_from_db()
    assert (msg.state, msg.attempts, msg.last_error) == ("posted", 2, "")
    # A second request whose posts keep failing is given up, and the admin shows it.
    api.fail_next = 5
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    failing = SlackMessage.objects.exclude(pk=msg.pk).get()
    assert slack.attempt_post(failing.pk) == "gave up"
    failing.refresh_from_db()
    assert failing.state == "failed" and failing.attempts == 2
    admin = session_client(make_user(role="superuser"))
    page = admin.get("/admin/approvals/slackmessage/").content.decode()
    assert "failed (gave up)" in page and "channel_not_found" in page
    testing.services.request_decline(
        request_id=run.requests.get().request_id, user=make_user(), reason="no"
    )


def test_a_check_warns_when_slack_is_set_up_by_half(settings):
    settings.TOOLNEXUS_SLACK_BOT_TOKEN = "xoxb-test"
    warnings = [m for m in checks.run_all() if m.id == "approvals.W010"]
    assert len(warnings) == 1
    assert "TOOLNEXUS_SLACK_SIGNING_SECRET, TOOLNEXUS_SLACK_CHANNEL" in warnings[0].msg
    settings.TOOLNEXUS_SLACK_BOT_TOKEN = ""
    assert not [m for m in checks.run_all() if m.id == "approvals.W010"]


# -- refused actions -----------------------------------------------------------------------------


def test_forged_stale_or_unsigned_actions_are_refused_and_change_nothing(api):
    _, row, msg = posted_request()
    reviewer = make_user()
    link(reviewer)
    body = click_body(msg, "approve")
    cases = {
        "wrong secret": signed(body, secret="another secret"),
        "stale (a replay)": signed(body, at=time.time() - 6 * 60),
        "no headers": {},
        "not a number": {"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": "v0=00"},
        "another body": signed(click_body(msg, "decline")),
    }
    for case, headers in cases.items():
        response = post_click(body, headers)
        assert response.status_code == 401, case
        assert "signature is missing, wrong or too old" in response.content.decode()
    row.refresh_from_db()
    assert row.state == "pending"
    assert answers(api) == [] and api.of("chat.update") == []


def test_an_action_on_a_message_this_app_did_not_post_or_from_another_workspace_is_refused(
    api, settings
):
    _, row, msg = posted_request()
    link(make_user())
    msg.ts = "99.9"  # a message of someone else's
    response = post_click(click_body(msg, "approve"))
    assert response.status_code == 403
    assert "not on a message this app posted" in response.content.decode()
    msg.refresh_from_db()
    settings.TOOLNEXUS_SLACK_TEAM_ID = TEAM
    response = post_click(click_body(msg, "approve", team="T0OTHER"))
    assert response.status_code == 403 and "own Slack workspace" in response.content.decode()
    for body in (b"payload=not-json", b"nothing"):
        assert post_click(body).status_code == 400
    row.refresh_from_db()
    assert row.state == "pending" and answers(api) == []


def test_the_endpoint_decides_nothing_by_get_and_is_off_unless_set_up(api, settings):
    assert session_client().get("/slack/actions/").status_code == 405
    settings.TOOLNEXUS_SLACK_SIGNING_SECRET = ""
    body = b"payload={}"
    assert post_click(body, signed(body)).status_code == 404


# -- linking a Slack user ------------------------------------------------------------------------


def invitation(api: SlackStub) -> str:
    """The link path in the last ephemeral answer."""
    text = answers(api)[-1]["text"]
    url = text.split("<", 1)[1].split("|", 1)[0]
    assert url.startswith("https://approvals.example.test/slack/link/")
    return url.removeprefix("https://approvals.example.test")


def test_an_unlinked_slack_user_gets_a_link_of_their_own_and_nothing_is_decided(api):
    _, row, msg = posted_request()
    response = post_click(click_body(msg, "approve", user="U0NEW"))
    assert response.status_code == 200 and response.content == b""
    [told] = answers(api)
    assert told["channel"] == CHANNEL and told["user"] == "U0NEW"
    assert "Nothing was decided" in told["text"] and "/slack/link/" in told["text"]
    row.refresh_from_db()
    assert row.state == "pending"


def test_the_link_page_needs_a_sign_in_links_on_post_only_and_then_the_click_decides(api):
    run, row, msg = posted_request()
    post_click(click_body(msg, "approve"))
    path = invitation(api)
    signed_out = session_client().get(path)
    assert signed_out.status_code == 302 and "next=" in signed_out["Location"]
    reviewer = make_user()
    client = session_client(reviewer)
    page = client.get(path)
    assert page.status_code == 200
    assert "Link Slack user ann.slack to your account" in page.content.decode()
    assert not SlackLink.objects.exists()  # a GET links nothing
    done = client.post(path)
    assert done.status_code == 302 and done["Location"] == "/notifications/"
    assert SlackLink.objects.get().user == reviewer
    settings_page = client.get("/notifications/").content.decode()
    assert "Linked to Slack user <strong>ann.slack</strong>" in settings_page
    # Now the same click decides, as the reviewer.
    assert post_click(click_body(msg, "approve")).status_code == 200
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("approved", reviewer)
    drain()
    assert fresh(run).status == "done"


def test_a_forged_expired_or_taken_link_links_nothing(api, monkeypatch):
    reviewer = make_user()
    client = session_client(reviewer)
    forged = signing.dumps({"t": TEAM, "s": "U0X", "n": "x"}, salt="another salt")
    for response in (
        client.get(f"/slack/link/{forged}/"),
        client.post(f"/slack/link/{forged}/"),
    ):
        assert response.status_code == 400 and "This link is not valid" in response.content.decode()
    real = time.time
    monkeypatch.setattr(signing.time, "time", lambda: real() - 16 * 60)
    old = slack.make_link_token(TEAM, "U0X", "x")
    monkeypatch.setattr(signing.time, "time", real)
    response = client.post(f"/slack/link/{old}/")
    assert response.status_code == 410 and "This link has expired" in response.content.decode()
    assert not SlackLink.objects.exists()
    owner = make_user()
    link(owner, slack_user="U0X")
    token = slack.make_link_token(TEAM, "U0X", "x")
    assert "linked to another account" in client.get(f"/slack/link/{token}/").content.decode()
    response = client.post(f"/slack/link/{token}/")
    assert response.status_code == 409
    assert SlackLink.objects.get().user == owner


def test_unlink_is_a_post_of_the_persons_own_link(api):
    reviewer = make_user()
    mine = link(reviewer)
    client = session_client(reviewer)
    assert client.get(f"/slack/unlink/{mine.pk}/").status_code == 405
    other = session_client(make_user())
    other.post(f"/slack/unlink/{mine.pk}/")
    assert SlackLink.objects.filter(pk=mine.pk).exists()  # not theirs
    assert client.post(f"/slack/unlink/{mine.pk}/").status_code == 302
    assert not SlackLink.objects.exists()
    assert "Your Slack user is not linked" in client.get("/notifications/").content.decode()


# -- decisions -----------------------------------------------------------------------------------


def test_a_linked_approve_decides_resumes_the_run_and_updates_the_message(api):
    run, row, msg = posted_request()
    reviewer = make_user()
    link(reviewer)
    response = post_click(click_body(msg, "approve"))
    assert response.status_code == 200 and response.content == b""
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("approved", reviewer)
    drain()
    assert fresh(run).status == "done"
    testing.deliver_webhooks()
    updates = api.of("chat.update")
    assert updates and updates[-1]["ts"] == msg.ts and updates[-1]["channel"] == CHANNEL
    shown = json.dumps(updates[-1]["blocks"])
    assert f"Approved by {reviewer.username}" in shown
    assert '"actions"' not in shown  # the buttons are gone
    assert len(updates) == 1  # the decision's own event finds it up to date


def test_a_decline_takes_the_reason_from_the_message_to_the_run(api):
    run, row, msg = posted_request()
    reviewer = make_user()
    link(reviewer)
    post_click(click_body(msg, "decline", reason="not this month"))
    row.refresh_from_db()
    assert (row.state, row.reason, row.decided_by) == ("declined", "not this month", reviewer)
    drain()
    assert tool_output(fresh(run), "call_refund") == "relay declined for refund: not this month"
    testing.deliver_webhooks()
    shown = json.dumps(api.of("chat.update")[-1]["blocks"])
    assert f"Declined by {reviewer.username}: not this month" in shown


def test_a_click_after_the_decision_says_who_decided_and_changes_nothing(api):
    _, row, msg = posted_request()
    first = make_user()
    testing.services.request_decline(request_id=row.request_id, user=first, reason="no")
    late = make_user()
    link(late)
    assert post_click(click_body(msg, "approve")).status_code == 200
    [told] = answers(api)
    assert told["text"] == f"Already declined by {first.username}: nothing was changed."
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("declined", first)
    shown = json.dumps(api.of("chat.update")[-1]["blocks"])
    assert f"Declined by {first.username}: no" in shown


def test_a_person_without_the_right_to_decide_is_told_why_and_nothing_changes(api):
    _, row, msg = posted_request()
    watcher = make_user(role="watcher")
    link(watcher)
    post_click(click_body(msg, "approve"))
    [told] = answers(api)
    assert told["text"].startswith("Nothing was decided: ")
    assert "permission" in told["text"]
    row.refresh_from_db()
    assert row.state == "pending"
    lost = make_user()
    link(lost, slack_user="U0LOST")
    lost.groups.clear()
    lost.user_permissions.add(*Permission.objects.filter(codename="view_approvalrequest"))
    post_click(click_body(msg, "decline", user="U0LOST"))
    assert answers(api)[-1]["text"].startswith("Nothing was decided: ")
    row.refresh_from_db()
    assert row.state == "pending" and api.of("chat.update") == []


def test_two_person_rules_apply_to_slack_clicks_as_to_the_inbox(api):
    Rule.objects.create(
        name="big refunds",
        effect=Rule.Effect.REQUIRE_APPROVERS,
        approvals_needed=2,
        tool="refund",
        starter_may_not_approve=True,
    )
    starter = make_user()
    run = start_and_halt(user=starter)
    testing.deliver_webhooks()
    msg = SlackMessage.objects.get()
    link(starter, slack_user="U0STARTER")
    post_click(click_body(msg, "approve", user="U0STARTER"))
    assert "whoever started this run may not approve" in answers(api)[-1]["text"]
    ann, bob = make_user(username="ann"), make_user(username="bob")
    link(ann)
    link(bob, slack_user="U0BOB")
    post_click(click_body(msg, "approve"))
    assert answers(api)[-1]["text"] == (
        "Your approval is recorded (1 of 2 approved: ann); it needs more."
    )
    row = run.requests.get()
    assert row.state == "pending"
    shown = json.dumps(api.of("chat.update")[-1]["blocks"])
    assert "Approved by ann" in shown and '"actions"' in shown  # the buttons stay
    post_click(click_body(msg, "approve", user="U0ANN"))
    assert "you already approved" in answers(api)[-1]["text"]
    post_click(click_body(msg, "approve", user="U0BOB"))
    row.refresh_from_db()
    assert (row.state, row.decided_by) == ("approved", bob)
    drain()
    assert fresh(run).status == "done"


def test_a_request_claimed_by_someone_else_is_left_to_them(api):
    _, row, msg = posted_request()
    holder = make_user()
    testing.services.request_claim(request_id=row.request_id, user=holder)
    link(make_user())
    post_click(click_body(msg, "approve"))
    assert f"{holder.username} claimed this request" in answers(api)[-1]["text"]
    row.refresh_from_db()
    assert row.state == "pending"


def test_a_decision_made_in_the_inbox_updates_the_message_too(api):
    _, row, _ = posted_request()
    reviewer = make_user()
    testing.services.request_approve(request_id=row.request_id, user=reviewer)
    testing.deliver_webhooks()
    [update] = api.of("chat.update")
    assert f"Approved by {reviewer.username}" in json.dumps(update["blocks"])


def test_the_admin_lists_the_links(api):
    link(make_user())
    admin = session_client(make_user(role="superuser"))
    page = admin.get("/admin/approvals/slacklink/").content.decode()
    assert "ann.slack" in page and "U0ANN" in page


def test_a_replayed_click_within_five_minutes_changes_nothing(api):
    _, row, msg = posted_request()
    reviewer = make_user()
    link(reviewer)
    body = click_body(msg, "decline")
    headers = signed(body)
    assert post_click(body, headers).status_code == 200
    row.refresh_from_db()
    assert (row.state, row.reason, row.decided_by) == ("declined", "declined", reviewer)
    decided_at = row.decided_at
    # The same signed request again (its signature still fresh): the decision stands.
    assert post_click(body, headers).status_code == 200
    assert (
        answers(api)[-1]["text"] == f"Already declined by {reviewer.username}: nothing was changed."
    )
    row.refresh_from_db()
    assert (row.state, row.decided_at) == ("declined", decided_at)
    # A decline without a reason reads as it is, without repeating the state.
    shown = json.dumps(api.of("chat.update")[-1]["blocks"])
    assert f"*Declined by {reviewer.username}*" in shown
