"""approvals.domain.records: the state machine's allowed transitions, and a new request's
expiry from TOOLNEXUS_REQUEST_TTL_SECONDS."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.domain import records
from approvals.domain.exceptions import InvalidTransition
from approvals.models import ApprovalRequest

from .factories import start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


def test_request_row_allows_only_terminal_transitions():
    assert records.ALLOWED_TRANSITIONS["request"]["declined"] == set()
    with pytest.raises(InvalidTransition):
        records.check_transition("request", "declined", "approved")
    with pytest.raises(InvalidTransition):
        records.check_transition("run", "done", "running")
    with pytest.raises(InvalidTransition):
        records.check_transition("run", "cancelled", "queued")
    records.check_transition("run", "done", "queued")  # a follow-up
    assert ApprovalRequest.State.PENDING in records.ALLOWED_TRANSITIONS["request"]


def test_request_ttl_setting_sets_an_expiry(settings):
    settings.TOOLNEXUS_REQUEST_TTL_SECONDS = 60
    run = start_and_halt()
    request = run.requests.get()
    assert request.expires_at is not None
    assert timezone.now() < request.expires_at <= timezone.now() + timedelta(seconds=61)
    assert request.wire["expiresAt"].endswith("Z")
