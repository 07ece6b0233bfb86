"""Reads of a reviewer's notification settings and of the messages sent to them."""

from __future__ import annotations

from typing import Any

from ..models import NotificationDelivery, NotificationPreference, SlackLink, WebPushSubscription


def notification_preference(user: Any) -> NotificationPreference:
    """The user's preference, or a new unsaved one (everything off)."""
    found = NotificationPreference.objects.filter(user=user).first()
    return found or NotificationPreference(user=user)


def notification_recent(user: Any, limit: int = 10) -> list[NotificationDelivery]:
    """The user's latest messages, newest first (their state and last error)."""
    return list(NotificationDelivery.objects.filter(user=user).order_by("-id")[:limit])


def push_subscriptions(user: Any) -> list[WebPushSubscription]:
    """The browsers where the user turned push on, newest first."""
    return list(WebPushSubscription.objects.filter(user=user).order_by("-id"))


def slack_links(user: Any) -> list[SlackLink]:
    """The Slack users linked to this person (whose clicks decide as them)."""
    return list(SlackLink.objects.filter(user=user).order_by("id"))
