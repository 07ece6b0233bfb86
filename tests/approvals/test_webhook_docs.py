"""The API docs tell a host how to verify a webhook: the recipe they give, followed by hand
(HMAC-SHA256 over `<id>.<timestamp>.<body>` with the secret after `whsec_`), matches the
signature a real delivery carries, and the docs show the library call."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from django.test import Client

from approvals import services, testing
from approvals.execution.webhooks import signed_request
from approvals.models import WebhookDelivery, WebhookSubscription

from .factories import make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_documented_recipe_verifies_a_real_delivery(settings):
    settings.TOOLNEXUS_EVENTS_SETTLE_SECONDS = 0
    subscription = WebhookSubscription(url="http://127.0.0.1:9/hook")  # nothing listens
    services.webhook_subscribe(subscription)
    start_and_halt(user=make_user())
    testing.deliver_webhooks()
    delivery = WebhookDelivery.objects.select_related("event", "subscription").first()
    assert delivery is not None
    body, headers = signed_request(delivery)
    key = base64.b64decode(subscription.secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"].split() == [f"v1,{expected}"]

    description = Client().get("/api/openapi.json").json()["info"]["description"]
    for said in ("webhook-id", "webhook-timestamp", "webhook-signature", "whsec_"):
        assert said in description
    assert "Webhook(SECRET).verify(raw_body, headers)" in description
