"""Webhook subscriptions and their deliveries: what the admin changes (the sending itself is
the delivery worker's, `execution.webhooks`)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .. import event_feed
from ..execution import webhooks
from ..models import WebhookSubscription


def webhook_secret() -> str:
    """A new signing secret in the Standard Webhooks form (whsec_ and base64)."""
    return WebhookSubscription.generate_secret()


def webhook_subscribe(subscription: WebhookSubscription, *, created_by: Any = None) -> None:
    """Save a new subscription: it hears the events from now on, never the past."""
    with transaction.atomic():
        subscription.secret = subscription.secret or webhook_secret()
        subscription.last_event_id = event_feed.latest_event_id()
        if getattr(created_by, "is_authenticated", False):
            subscription.created_by = created_by
        subscription.save()


def webhook_redeliver(delivery_ids: list[int]) -> int:
    """Queue these deliveries again from a first attempt; how many."""
    return webhooks.redeliver(delivery_ids)
