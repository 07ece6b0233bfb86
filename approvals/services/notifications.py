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
from ..execution import notifications
from ..models import ApprovalRequest, NotificationLinkUse, NotificationPreference
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
    if channel not in (notifications.EMAIL, notifications.CHAT):
        raise ServiceError(f"channel: no channel {channel!r}")
    if pref is None:
        raise ServiceError("save your settings first")
    sent = notifications.send_test(pref, channel)
    if not sent:
        raise ServiceError(
            "no email address to send to"
            if channel == notifications.EMAIL
            else "no chat URL to send to"
        )
    return sent


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
