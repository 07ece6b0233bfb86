"""A reviewer's notification settings (saved from the Notifications page or the admin), the
"send a test" button, and the decisions made from an email's signed links.

A signed link decides nothing by itself: its GET shows a confirmation page (after sign-in),
whose POST decides through the normal decision services and permissions. The link is bound
to its person and its request, expires (TOOLNEXUS_NOTIFICATION_LINK_HOURS) and works once:
its nonce is recorded in the decision's own transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core import signing
from django.db import IntegrityError, transaction

from ..domain.exceptions import NotAllowed, ServiceError
from ..domain.push import parse_subscription, push_available
from ..execution import notifications
from ..models import (
    ApprovalRequest,
    NotificationLinkUse,
    NotificationPreference,
    WebPushSubscription,
)
from ..permissions import hidden_agents
from .requests import request_approve, request_decline


class BadLink(ServiceError):
    """A signed link that cannot be used: forged, expired, someone else's, used, or for a
    request that is gone or decided. `title` heads the page that says so."""

    status = 400

    def __init__(self, title: str, message: str, *, status: int = 400):
        super().__init__(message)
        self.title = title
        self.status = status


def notification_save(pref: NotificationPreference) -> NotificationPreference:
    """Save a preference (its form checked the fields)."""
    with transaction.atomic():
        pref.save()
    return pref


def notification_test(*, user: Any, channel: str) -> int:
    """Queue a test message on one channel of the user's saved settings; how many."""
    if not notifications.enabled():
        raise NotAllowed("notifications are off on this server (TOOLNEXUS_NOTIFICATIONS)")
    pref = NotificationPreference.objects.filter(user=user).select_related("user").first()
    if channel not in (notifications.EMAIL, notifications.CHAT, notifications.PUSH):
        raise ServiceError(f"channel: no channel {channel!r}")
    if channel == notifications.PUSH and not push_available():
        raise NotAllowed("push is off on this server (no VAPID keys)")
    if pref is None:
        raise ServiceError("save your settings first")
    sent = notifications.send_test(pref, channel)
    if not sent:
        raise ServiceError(
            {
                notifications.EMAIL: "no email address to send to",
                notifications.CHAT: "no chat URL to send to",
                notifications.PUSH: "no browser with push turned on",
            }[channel]
        )
    return sent


def push_subscribe(*, user: Any, data: Any, user_agent: str = "") -> WebPushSubscription:
    """Store a browser's push subscription for this person (InvalidInput says what is wrong
    with it). An endpoint is one browser's: subscribing again, or from another account in
    the same browser, updates that row, so a browser is never told twice nor told another
    person's requests."""
    if not push_available():
        raise NotAllowed("push is off on this server (no VAPID keys)")
    sub = parse_subscription(data)
    with transaction.atomic():
        row, _ = WebPushSubscription.objects.update_or_create(
            endpoint=sub.endpoint,
            defaults={
                "user": user,
                "p256dh": sub.p256dh,
                "auth": sub.auth,
                "user_agent": (user_agent or "")[:300],
                "last_error": "",
            },
        )
        # Turning push on in a browser is asking for push: the preference follows.
        pref, _ = NotificationPreference.objects.get_or_create(user=user)
        if not pref.push_enabled:
            pref.push_enabled = True
            pref.save(update_fields=["push_enabled", "updated_at"])
    return row


def push_unsubscribe(*, user: Any, subscription_id: int) -> None:
    """Remove one of this person's browsers; anyone else's is DoesNotExist, as one that does
    not exist is."""
    with transaction.atomic():
        deleted, _ = WebPushSubscription.objects.filter(pk=subscription_id, user=user).delete()
    if not deleted:
        raise WebPushSubscription.DoesNotExist("no such browser of yours")


@dataclass(frozen=True)
class SignedLink:
    action: str  # "approve" or "decline"
    request: ApprovalRequest
    nonce: str


def link_check(token: str, user: Any) -> SignedLink:
    """The link's action and request for this signed-in user, or BadLink saying why not."""
    try:
        data = notifications.read_link_token(token)
    except signing.SignatureExpired:
        raise BadLink(
            "This link has expired",
            "Approve and Decline links work for a limited time. Open the request instead.",
            status=410,
        ) from None
    except signing.BadSignature:
        raise BadLink(
            "This link is not valid",
            "It was not made by this server, or it was changed on the way. Nothing was done.",
        ) from None
    if data.get("u") != user.pk:
        raise BadLink(
            "This link is someone else's",
            "It was sent to another person: it cannot decide for you. Nothing was done.",
            status=403,
        )
    if NotificationLinkUse.objects.filter(nonce=data["n"]).exists():
        raise BadLink(
            "This link was already used",
            "Each Approve or Decline link works once. Open the request to see where it stands.",
            status=410,
        )
    row = (
        ApprovalRequest.objects.exclude(agent__in=hidden_agents(user))
        .select_related("run", "decided_by")
        .filter(request_id=data.get("r"))
        .first()
    )
    if row is None:
        raise BadLink("No such request", "The request is gone, or you may not see it.", status=404)
    return SignedLink(action=data["a"], request=row, nonce=data["n"])


def link_decide(*, token: str, user: Any, reason: str = "") -> ApprovalRequest:
    """Decide from a signed link's confirmation page, once. The decision services check the
    permissions and the state (AlreadyDecided, NotAllowed) as for any decision; the link's
    use commits with the decision, or not at all."""
    link = link_check(token, user)
    request_id = link.request.request_id
    try:
        with transaction.atomic():
            NotificationLinkUse.objects.create(
                nonce=link.nonce, user=user, request=link.request, action=link.action
            )
            if link.action == "approve":
                return request_approve(request_id=request_id, user=user)
            return request_decline(request_id=request_id, user=user, reason=reason)
    except IntegrityError:  # used by a concurrent POST of the same link
        raise BadLink(
            "This link was already used",
            "Each Approve or Decline link works once. Open the request to see where it stands.",
            status=410,
        ) from None
