"""Webhooks: host events (`domain.hostevents`) POSTed to each subscription, signed per the
Standard Webhooks specification (`standardwebhooks`), at least once.

- `dispatch` (the delivery worker, every TOOLNEXUS_WEBHOOK_DISPATCH_SECONDS) turns the audit
  rows after a subscription's cursor into delivery rows and queues one task each, moving the
  cursor in the same transaction: an event gets its delivery once, whatever crashes.
- `deliver_webhook` (a task on the "webhooks" queue, which the run worker never takes, so a
  slow endpoint never delays a resume) POSTs one delivery; a failure is recorded on the row
  and the task is queued again after a growing wait, until WEBHOOK_MAX_ATTEMPTS.

The webhook id (`evt_<audit row id>`) is the same on every attempt: hosts drop repeats by it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timedelta

import httpx
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from django_tasks import task
from standardwebhooks.webhooks import Webhook

from .. import event_feed, metrics
from ..conf import WEBHOOK_QUEUE, app_settings
from ..domain import hostevents
from ..models import WebhookDelivery, WebhookSubscription

log = logging.getLogger(__name__)

USER_AGENT = "toolnexus-web webhooks"
DELIVERED = WebhookDelivery.State.DELIVERED
FAILED = WebhookDelivery.State.FAILED
PENDING = WebhookDelivery.State.PENDING


# Routed to its queue when queued (`_queue`), not here: a backend that does not allow the
# queue would refuse the task at import, failing every process of a host project that has
# not set QUEUES; checks.W003 says it instead.
@task()
def deliver_webhook(delivery_id: int) -> str:
    """The task: one attempt at one delivery (its outcome is on the delivery row)."""
    return attempt(delivery_id)


def _queue(delivery_id: int, *, run_after: datetime | None = None) -> None:
    routed = deliver_webhook.using(queue_name=WEBHOOK_QUEUE, run_after=run_after)
    routed.enqueue(delivery_id)


def backoff(attempts: int) -> timedelta:
    """The wait after the `attempts`-th failure: 10 s, 30 s, 90 s, ... at most an hour."""
    return timedelta(seconds=min(3600, 10 * 3 ** max(0, attempts - 1)))


def dispatch(limit: int = 200) -> int:
    """Make the deliveries of every active subscription's new events; the number made."""
    made = 0
    for pk in WebhookSubscription.objects.filter(active=True).values_list("pk", flat=True):
        with transaction.atomic():
            # Another worker dispatching the same subscription skips it (PostgreSQL).
            subscription = (
                WebhookSubscription.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, active=True)
                .first()
            )
            if subscription is None:
                continue
            rows, cursor = event_feed.host_events_after(
                subscription.last_event_id, types=subscription.event_types or None, limit=limit
            )
            deliveries = WebhookDelivery.objects.bulk_create(
                [
                    WebhookDelivery(
                        subscription=subscription,
                        event=row,
                        event_type=hostevents.TYPE_OF_ACTION[row.action],
                        next_attempt_at=timezone.now(),
                    )
                    for row in rows
                ]
            )
            for delivery in deliveries:
                _queue(delivery.pk)
            if cursor != subscription.last_event_id:
                subscription.last_event_id = cursor
                subscription.save(update_fields=["last_event_id"])
            made += len(deliveries)
    return made


def redeliver(delivery_ids: list[int]) -> int:
    """Send these deliveries again from a first attempt (the admin's "redeliver")."""
    with transaction.atomic():
        rows = list(WebhookDelivery.objects.select_for_update().filter(pk__in=delivery_ids))
        for row in rows:
            row.state = PENDING
            row.attempts = 0
            row.next_attempt_at = timezone.now()
            row.save(update_fields=["state", "attempts", "next_attempt_at"])
            _queue(row.pk)
    return len(rows)


def signed_request(delivery: WebhookDelivery, *, now: datetime | None = None) -> tuple[bytes, dict]:
    """The body and headers of one attempt (webhook-id, -timestamp, -signature)."""
    event = delivery.event
    body = json.dumps(hostevents.payload(event), separators=(",", ":")).encode()
    msg_id = hostevents.event_id(event)
    at = now or timezone.now()
    signature = Webhook(delivery.subscription.secret).sign(msg_id=msg_id, timestamp=at, data=body)
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }
    return body, headers


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str]:
    """(HTTP status or None, what went wrong or "")."""
    return async_to_sync(_post_within)(url, body, headers, app_settings.WEBHOOK_TIMEOUT_SECONDS)


async def _post_within(
    url: str, body: bytes, headers: dict[str, str], seconds: float
) -> tuple[int | None, str]:
    # httpx's timeouts bound each connect, write and read, not the whole exchange: a
    # receiver sending its answer a byte at a time would hold the delivery worker as long as
    # it liked. The attempt as a whole gets `seconds` too.
    try:
        async with httpx.AsyncClient(timeout=seconds, follow_redirects=False) as client:
            async with asyncio.timeout(seconds):
                response = await client.post(url, content=body, headers=headers)
    except TimeoutError:
        return None, f"Timeout: no whole answer within {seconds:g} s"
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:1000]
    if 200 <= response.status_code < 300:
        return response.status_code, ""
    return response.status_code, f"HTTP {response.status_code}: {response.text[:500]}"


def attempt(delivery_id: int) -> str:
    delivery = (
        WebhookDelivery.objects.select_related(
            "subscription", "event__run", "event__request", "event__actor"
        )
        .filter(pk=delivery_id)
        .first()
    )
    if delivery is None or delivery.state != PENDING:
        return "nothing to send"
    if not delivery.subscription.active:
        return "subscription inactive"
    body, headers = signed_request(delivery)
    # No transaction is held over the POST: its outcome is written after it.
    status, error = _post(delivery.subscription.url, body, headers)
    return _record(delivery_id, status=status, error=error)


def _record(delivery_id: int, *, status: int | None, error: str) -> str:
    now = timezone.now()
    with transaction.atomic():
        row = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if row is None or row.state != PENDING:
            return "already settled"
        row.attempts += 1
        row.last_status = status
        row.last_attempt_at = now
        row.last_error = error
        if not error:
            row.state, row.delivered_at, row.next_attempt_at = DELIVERED, now, None
            outcome = "delivered"
        elif row.attempts >= app_settings.WEBHOOK_MAX_ATTEMPTS:
            row.state, row.next_attempt_at = FAILED, None
            outcome = "gave up"
            log.warning(
                "webhook delivery %s (%s) given up after %s attempts: %s",
                row.pk,
                row.event_type,
                row.attempts,
                error,
            )
        else:
            row.next_attempt_at = now + backoff(row.attempts)
            _queue(row.pk, run_after=row.next_attempt_at)
            outcome = "will retry"
            log.info("webhook delivery %s failed (attempt %s): %s", row.pk, row.attempts, error)
        row.save()
    metrics.webhook_attempted(outcome=outcome)
    return outcome


# A pending delivery whose next attempt is this far behind lost its task (the task failed
# outside `attempt`, or its row was removed): it is queued again.
STUCK_AFTER = timedelta(minutes=10)


def requeue_stuck() -> int:
    """Queue again the pending deliveries whose task never came; how many."""
    with transaction.atomic():
        rows = list(
            WebhookDelivery.objects.select_for_update(skip_locked=True).filter(
                state=PENDING, next_attempt_at__lt=timezone.now() - STUCK_AFTER
            )[:100]
        )
        for row in rows:
            row.next_attempt_at = timezone.now()
            row.save(update_fields=["next_attempt_at"])
            _queue(row.pk)
    return len(rows)
