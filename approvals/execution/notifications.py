"""Reviewers' notifications: new requests reach each person who asked for them, by email
(Django's mail backend), chat (apprise URLs) and Web Push (each browser where they turned
it on, pywebpush with the server's VAPID keys), through the delivery worker's queue.

- `dispatch` (the delivery worker, beside the webhooks' dispatch) reads the "request.created"
  host events after its cursor and makes a `NotificationItem` per person whose preference
  wants the request (and who may see it); requests overdue for "only overdue" people too.
- `flush` turns each person's unsent items into one message per channel, unless their quiet
  hours are on or their digest is not due: then the items wait and go out together later.
- `deliver_notification` (a task on the webhooks' queue, which the run worker never takes,
  so nothing here delays a decision or a resume) sends one message to one channel; a
  failure is recorded on its row and retried after a growing wait, never holding back
  another channel's message.

Everything here runs only when TOOLNEXUS_NOTIFICATIONS is on.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import apprise
import requests
from django.core import signing
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.templatetags.static import static
from django.urls import reverse
from django.utils import timezone
from django_tasks import task
from pywebpush import WebPushException, webpush

from .. import event_feed, metrics
from ..conf import WEBHOOK_QUEUE, app_settings
from ..domain import hostevents
from ..domain.push import push_available, vapid_subject
from ..domain.summaries import request_key_arguments, request_what
from ..models import (
    AgentAccess,
    ApprovalRequest,
    NotificationCursor,
    NotificationDelivery,
    NotificationItem,
    NotificationPreference,
    WebPushSubscription,
)
from ..permissions import VIEW_REQUESTS, agent_rights

log = logging.getLogger(__name__)

PENDING = NotificationDelivery.State.PENDING
DELIVERED = NotificationDelivery.State.DELIVERED
FAILED = NotificationDelivery.State.FAILED
EMAIL = NotificationDelivery.Channel.EMAIL
CHAT = NotificationDelivery.Channel.CHAT
PUSH = NotificationDelivery.Channel.PUSH
NEW = NotificationItem.Reason.NEW
OVERDUE = NotificationItem.Reason.OVERDUE

LINK_SALT = "approvals.notifications.link"
LINK_ACTIONS = ("approve", "decline")
# The kinds an email link may approve as shown (a question needs its typed answer).
LINK_KINDS = ("tool_call", "approval")
# A push's buttons (a decline's reason is asked on the confirmation page).
PUSH_ACTION_TITLES = {"approve": "Approve", "decline": "Decline…"}


def enabled() -> bool:
    return bool(app_settings.NOTIFICATIONS)


# -- who wants what ----------------------------------------------------------------------------


def _preferences() -> list[NotificationPreference]:
    return list(
        NotificationPreference.objects.filter(
            Q(email_enabled=True) | Q(chat_enabled=True) | Q(push_enabled=True),
            user__is_active=True,
        ).select_related("user")
    )


def _routed(user: Any, agent: str) -> bool:
    """A request is routed to a person when its agent's access lists a group of theirs with
    "can decide"."""
    return AgentAccess.objects.filter(
        policy__agent=agent, can_decide=True, group__in=user.groups.all()
    ).exists()


def wants(pref: NotificationPreference, row: ApprovalRequest, reason: str) -> bool:
    """Whether this request (for this reason) reaches this person."""
    user = pref.user
    if not user.has_perm(VIEW_REQUESTS) or not agent_rights(user).can_view(row.agent):
        return False  # never a word about a request they may not see
    if (reason == OVERDUE) != pref.only_overdue:
        return False
    if pref.agent_list() and row.agent not in pref.agent_list():
        return False
    if pref.kind_list() and row.kind not in pref.kind_list():
        return False
    return not pref.only_routed or _routed(user, row.agent)


def _items_for(
    rows: Iterable[ApprovalRequest],
    prefs: list[NotificationPreference],
    reason: str,
    *,
    made: frozenset[tuple[Any, Any]] = frozenset(),
) -> int:
    items = [
        NotificationItem(user_id=pref.user_id, request=row, reason=reason)
        for row in rows
        for pref in prefs
        if (pref.user_id, row.pk) not in made and wants(pref, row, reason)
    ]
    # A request reaches a person once per reason (the unique constraint keeps repeats out).
    NotificationItem.objects.bulk_create(items, ignore_conflicts=True)
    return len(items)


def dispatch(limit: int = 200) -> int:
    """Make the items of the requests created since the last call, and of the requests that
    became overdue; how many (repeats included)."""
    made = 0
    with transaction.atomic():
        cursor = NotificationCursor.objects.select_for_update().filter(pk=1).first()
        if cursor is None:  # the first run hears from now on, never the past
            NotificationCursor.objects.get_or_create(
                pk=1, defaults={"last_event_id": event_feed.latest_event_id()}
            )
            return 0
        events, after = event_feed.host_events_after(
            cursor.last_event_id, types=[hostevents.REQUEST_CREATED], limit=limit
        )
        if events:
            prefs = _preferences()
            if prefs:
                rows = ApprovalRequest.objects.filter(
                    pk__in=[e.request_id for e in events], state=ApprovalRequest.State.PENDING
                )
                made += _items_for(rows, prefs, NEW)
        if after != cursor.last_event_id:
            cursor.last_event_id = after
            cursor.save(update_fields=["last_event_id"])
    return made + _overdue()


def _overdue(now: datetime | None = None) -> int:
    prefs = [p for p in _preferences() if p.only_overdue]
    if not prefs:
        return 0
    now = now or timezone.now()
    waited = now - timedelta(minutes=app_settings.NOTIFICATION_OVERDUE_MINUTES)
    rows = ApprovalRequest.objects.filter(
        Q(created_at__lte=waited) | Q(expires_at__lte=now),
        state=ApprovalRequest.State.PENDING,
        created_at__gte=now - timedelta(days=7),  # an old backlog is the inbox's, not a message's
    )[:500]
    rows = list(rows)
    # Every pass sees the same overdue requests: those already told are not checked again.
    made = frozenset(
        NotificationItem.objects.filter(
            reason=OVERDUE, request__in=rows, user_id__in=[p.user_id for p in prefs]
        ).values_list("user_id", "request_id")
    )
    return _items_for(rows, prefs, OVERDUE, made=made)


# -- when: quiet hours and digests ---------------------------------------------------------------


def _zone(pref: NotificationPreference) -> ZoneInfo:
    try:
        return ZoneInfo(pref.time_zone or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def in_quiet_hours(pref: NotificationPreference, now: datetime) -> bool:
    start, end = pref.quiet_start, pref.quiet_end
    if start is None or end is None or start == end:
        return False
    local = now.astimezone(_zone(pref)).time()
    # 22:00-07:00 crosses midnight.
    return start <= local < end if start < end else (local >= start or local < end)


def _due(pref: NotificationPreference, now: datetime) -> bool:
    if in_quiet_hours(pref, now):
        return False
    if pref.digest_minutes and pref.last_sent_at:
        return now >= pref.last_sent_at + timedelta(minutes=pref.digest_minutes)
    return True


def flush(now: datetime | None = None) -> int:
    """Send each person's unsent items whose time has come; how many messages were made."""
    now = now or timezone.now()
    made = 0
    user_ids = set(
        NotificationItem.objects.filter(sent_at__isnull=True).values_list("user_id", flat=True)
    )
    for user_id in sorted(user_ids):
        with transaction.atomic():
            pref = (
                NotificationPreference.objects.select_for_update(skip_locked=True)
                .select_related("user")
                .filter(user_id=user_id)
                .first()
            )
            if pref is not None and not _due(pref, now):
                continue
            items = list(
                NotificationItem.objects.select_for_update()
                .filter(user_id=user_id, sent_at__isnull=True)
                .select_related("request")
            )
            NotificationItem.objects.filter(pk__in=[i.pk for i in items]).update(sent_at=now)
            # A request decided while it waited (quiet hours, digest) is left out.
            live = [i for i in items if i.request.state == ApprovalRequest.State.PENDING]
            if pref is None or not live:
                continue
            made += _send(pref, live, digest=bool(pref.digest_minutes) or len(live) > 1)
            pref.last_sent_at = now
            pref.save(update_fields=["last_sent_at"])
    return made


# -- the message ---------------------------------------------------------------------------------


def public_url(path: str) -> str:
    return app_settings.PUBLIC_BASE_URL.rstrip("/") + path


def make_link_token(user_id: Any, request_id: str, action: str) -> str:
    """A signed Approve / Decline link's token: bound to the person and the request, with a
    nonce that the link's use records (single use); it expires (`read_link_token`)."""
    payload = {"u": user_id, "r": request_id, "a": action, "n": secrets.token_urlsafe(16)}
    return signing.dumps(payload, salt=LINK_SALT)


def read_link_token(token: str) -> dict[str, Any]:
    """The token's payload; signing.SignatureExpired or signing.BadSignature."""
    data = signing.loads(token, salt=LINK_SALT, max_age=app_settings.NOTIFICATION_LINK_HOURS * 3600)
    if not isinstance(data, dict) or data.get("a") not in LINK_ACTIONS or not data.get("n"):
        raise signing.BadSignature("not a link token")
    return data


def _entry(row: ApprovalRequest, reason: str, user: Any, *, links: bool) -> dict[str, Any]:
    entry = {
        "agent": row.agent,
        "what": request_what(row),
        "arguments": request_key_arguments(row),
        "overdue": reason == OVERDUE,
        "url": public_url(reverse("approvals:request-detail", args=[row.request_id])),
    }
    if links and row.kind in LINK_KINDS and agent_rights(user).can_decide(row.agent):
        for action in LINK_ACTIONS:
            token = make_link_token(user.pk, row.request_id, action)
            entry[f"{action}_url"] = public_url(reverse("approvals:notify-link", args=[token]))
    return entry


def compose(
    user: Any, items: list[NotificationItem], *, digest: bool, links: bool
) -> tuple[str, str]:
    """(subject, plain-text body) of one message: every request named by its agent, tool and
    key arguments, with its page's link (and, in an email, signed Approve / Decline links)."""
    entries = [_entry(i.request, i.reason, user, links=links) for i in items]
    if digest:
        subject = f"{len(entries)} request(s) waiting for you"
    else:
        first = entries[0]
        label = "Overdue" if first["overdue"] else "New request"
        subject = f"{label}: {first['agent']} wants {first['what']}"
    context = {
        "entries": entries,
        "digest": digest,
        "links": links,
        "settings_url": public_url(reverse("approvals:notifications")),
    }
    body = render_to_string("approvals/notifications/message.txt", context)
    return subject[:300], body


def push_message(
    user: Any, items: list[NotificationItem], *, digest: bool
) -> tuple[str, str, str, list[dict[str, str]]]:
    """(title, body, url, actions) of one push: what the email says of each request (agent,
    tool, key arguments), in the few lines a notification shows; its click opens the
    request's page, or the inbox for a digest. A push about one request its person may
    decide has Approve / Decline buttons: the email's signed links, each opening the
    confirmation page (nothing is decided by the click itself)."""
    single = len(items) == 1
    entries = [_entry(i.request, i.reason, user, links=single) for i in items]
    subject, _ = compose(user, items, digest=digest, links=False)
    lines = [
        ("[overdue] " if e["overdue"] else "")
        + f"{e['agent']}: {e['what']}"
        + (f" ({e['arguments']})" if e["arguments"] else "")
        for e in entries
    ]
    shown = 3
    if len(lines) > shown:
        lines = [*lines[:shown], f"and {len(lines) - shown} more"]
    url = entries[0]["url"] if single else public_url(reverse("approvals:inbox"))
    actions = [
        {"action": action, "title": PUSH_ACTION_TITLES[action], "url": entries[0][f"{action}_url"]}
        for action in LINK_ACTIONS
        if single and entries[0].get(f"{action}_url")
    ]
    return subject, "\n".join(lines), url, actions


def _push_targets(user: Any) -> list[str]:
    if not push_available():
        return []
    return list(
        WebPushSubscription.objects.filter(user=user)
        .order_by("id")
        .values_list("endpoint", flat=True)
    )


def _send(pref: NotificationPreference, items: list[NotificationItem], *, digest: bool) -> int:
    made = 0
    user = pref.user
    address = pref.email or user.email
    if pref.email_enabled and address:
        subject, body = compose(user, items, digest=digest, links=True)
        made += _deliver(user, EMAIL, address, subject, body)
    if pref.chat_enabled:
        subject, body = compose(user, items, digest=digest, links=False)
        # One delivery per URL: a failing chat never delays another.
        for url in pref.chat_url_list():
            made += _deliver(user, CHAT, url, subject, body)
    if pref.push_enabled:
        endpoints = _push_targets(user)
        if endpoints:
            title, text, url, actions = push_message(user, items, digest=digest)
            # One delivery per browser: a phone that is gone never delays the laptop. Its
            # buttons' links are the same (single use: one decision, from any of them).
            for endpoint in endpoints:
                made += _deliver(user, PUSH, endpoint, title, text, url=url, actions=actions)
    return made


def _deliver(user: Any, channel: str, target: str, subject: str, body: str, **extra: Any) -> int:
    delivery = NotificationDelivery.objects.create(
        user=user,
        channel=channel,
        target=target,
        subject=subject,
        body=body,
        next_attempt_at=timezone.now(),
        **extra,
    )
    _queue(delivery.pk)
    return 1


def send_test(pref: NotificationPreference, channel: str) -> int:
    """Queue a test message to every target of this channel; how many."""
    user = pref.user
    subject = "toolnexus: a test notification"
    page = public_url(reverse("approvals:notifications"))
    body = render_to_string(
        "approvals/notifications/test.txt",
        {"user": user, "url": page},
    )
    extra: dict[str, Any] = {}
    if channel == EMAIL:
        targets = [pref.email or user.email] if pref.email or user.email else []
    elif channel == PUSH:
        targets = _push_targets(user)
        body = "Your notifications reach this browser."
        extra["url"] = page
    else:
        targets = pref.chat_url_list()
    with transaction.atomic():
        return sum(
            _deliver(user, channel, t, subject, body, is_test=True, **extra) for t in targets
        )


# -- the sending ---------------------------------------------------------------------------------


# Routed to its queue when queued, as `deliver_webhook` is (see execution.webhooks).
@task()
def deliver_notification(delivery_id: int) -> str:
    """The task: one attempt at one message (its outcome is on the delivery row)."""
    return attempt(delivery_id)


def _queue(delivery_id: int, *, run_after: datetime | None = None) -> None:
    routed = deliver_notification.using(queue_name=WEBHOOK_QUEUE, run_after=run_after)
    routed.enqueue(delivery_id)


def backoff(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failure: 10 s, 30 s, 90 s, ... at most an hour."""
    return timedelta(seconds=min(3600, 10 * 3 ** max(0, attempts - 1)))


def _send_email(delivery: NotificationDelivery) -> str:
    try:
        EmailMessage(delivery.subject, delivery.body, to=[delivery.target]).send()
    except Exception as exc:  # any backend's failure is this channel's, recorded
        return f"{type(exc).__name__}: {exc}"[:1000]
    return ""


def _send_chat(delivery: NotificationDelivery) -> str:
    plugin = apprise.Apprise.instantiate(delivery.target)
    if plugin is None:
        return "not an apprise URL apprise can use"
    timeout = app_settings.NOTIFICATION_TIMEOUT_SECONDS
    # apprise's HTTP services read these (its cto / rto URL options).
    plugin.socket_connect_timeout = plugin.socket_read_timeout = timeout
    sender = apprise.Apprise()
    sender.add(plugin)
    with apprise.LogCapture(level=logging.WARNING) as logs:
        try:
            sent = sender.notify(title=delivery.subject, body=delivery.body)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:1000]
        said = logs.getvalue().strip()
    if sent:
        return ""
    return (said or "apprise could not send the message")[:1000]


def _icon_url() -> str:
    path = static("approvals/icon.svg")
    return path if "://" in path else public_url(path)


def _push_failure(exc: WebPushException) -> tuple[int | None, str]:
    """The push service's status and a short reason, without the payload, the keys or the
    endpoint (a capability URL): what the delivery row and the log may show."""
    response = exc.response
    status = getattr(response, "status_code", None)
    if status is None:
        return None, "WebPushException: no answer from the push service"
    said = " ".join(str(getattr(response, "text", "") or "").split())[:200]
    reason = getattr(response, "reason", "") or ""
    return status, f"the push service answered {status} {reason}".strip() + (
        f": {said}" if said else ""
    )


def _send_push(delivery: NotificationDelivery) -> tuple[str, bool]:
    """(error, final): final means no retry can help (the subscription is gone)."""
    sub = WebPushSubscription.objects.filter(
        endpoint=delivery.target, user_id=delivery.user_id
    ).first()
    if sub is None:  # removed by its person, expired, or taken over by another account
        return "this browser's subscription is gone", True
    if not push_available():
        return "push is off on this server (TOOLNEXUS_VAPID_*_KEY unset)", True
    payload = {
        "title": delivery.subject,
        "body": delivery.body,
        "url": delivery.url or public_url(reverse("approvals:inbox")),
        "icon": _icon_url(),
        "tag": f"toolnexus-{delivery.pk}",
    }
    if delivery.actions:
        payload["actions"] = delivery.actions
    try:
        webpush(
            subscription_info={
                "endpoint": sub.endpoint,
                "keys": {"p256dh": sub.p256dh, "auth": sub.auth},
            },
            data=json.dumps(payload),
            vapid_private_key=app_settings.VAPID_PRIVATE_KEY,
            # A new dict each time: webpush fills in its audience and expiry.
            vapid_claims={"sub": vapid_subject()},
            ttl=int(app_settings.PUSH_TTL_SECONDS),
            timeout=app_settings.NOTIFICATION_TIMEOUT_SECONDS,
        )
    except WebPushException as exc:
        status, error = _push_failure(exc)
        if status in (404, 410):
            # The browser unsubscribed or the subscription expired: it never comes back.
            sub.delete()
            return f"{error} (subscription removed)"[:1000], True
        WebPushSubscription.objects.filter(pk=sub.pk).update(last_error=error[:1000])
        return error[:1000], False
    except requests.RequestException as exc:
        # Its text names the endpoint: the kind of failure is enough.
        error = f"{type(exc).__name__}: the push service could not be reached"
        WebPushSubscription.objects.filter(pk=sub.pk).update(last_error=error)
        return error, False
    except Exception as exc:  # e.g. an unreadable VAPID key; its text may quote the key
        error = f"{type(exc).__name__} while sending the push"
        WebPushSubscription.objects.filter(pk=sub.pk).update(last_error=error)
        return error, False
    WebPushSubscription.objects.filter(pk=sub.pk).update(
        last_error="", last_success_at=timezone.now()
    )
    return "", False


def attempt(delivery_id: int) -> str:
    delivery = NotificationDelivery.objects.filter(pk=delivery_id).first()
    if delivery is None or delivery.state != PENDING:
        return "nothing to send"
    # No transaction is held over the sending: its outcome is written after it.
    final = False
    if delivery.channel == EMAIL:
        error = _send_email(delivery)
    elif delivery.channel == PUSH:
        error, final = _send_push(delivery)
    else:
        error = _send_chat(delivery)
    return _record(delivery_id, error=error, final=final)


def _record(delivery_id: int, *, error: str, final: bool = False) -> str:
    now = timezone.now()
    with transaction.atomic():
        row = NotificationDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if row is None or row.state != PENDING:
            return "already settled"
        row.attempts += 1
        row.last_attempt_at = now
        row.last_error = error
        if not error:
            row.state, row.delivered_at, row.next_attempt_at = DELIVERED, now, None
            outcome = "delivered"
        elif final or row.attempts >= app_settings.NOTIFICATION_MAX_ATTEMPTS:
            row.state, row.next_attempt_at = FAILED, None
            outcome = "gave up"
            log.warning(
                "notification %s (%s to %s) given up after %s attempts: %s",
                row.pk,
                row.channel,
                row.user_id,
                row.attempts,
                error,
            )
        else:
            row.next_attempt_at = now + backoff(row.attempts)
            _queue(row.pk, run_after=row.next_attempt_at)
            outcome = "will retry"
            log.info("notification %s failed (attempt %s): %s", row.pk, row.attempts, error)
        row.save()
    metrics.notification_attempted(channel=row.channel, outcome=outcome)
    return outcome


STUCK_AFTER = timedelta(minutes=10)


def requeue_stuck() -> int:
    """Queue again the pending messages whose task never came; how many."""
    with transaction.atomic():
        rows = list(
            NotificationDelivery.objects.select_for_update(skip_locked=True).filter(
                state=PENDING, next_attempt_at__lt=timezone.now() - STUCK_AFTER
            )[:100]
        )
        for row in rows:
            row.next_attempt_at = timezone.now()
            row.save(update_fields=["next_attempt_at"])
            _queue(row.pk)
    return len(rows)


def maintain() -> tuple[int, int, int]:
    """The delivery worker's turn: (items made, messages made, messages re-queued)."""
    if not enabled():
        return 0, 0, 0
    return dispatch(), flush(), requeue_stuck()
