"""approvals.execution.recovery: an overdue request expires with reason "expired" (once,
and never one already decided), and its run resumes reading it; an expired approval runs
nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import services
from approvals.execution import recovery
from approvals.models import ApprovalRequest, Event, ToolExecution

from .factories import drain, fresh, make_user, start_and_halt, tool_output
from .factories import make_overdue as _overdue

pytestmark = pytest.mark.django_db(transaction=True)


def test_overdue_request_is_expired_by_the_service_and_the_run_reads_it():
    run = start_and_halt()
    request = _overdue(run)
    not_due = start_and_halt(prompt="refund A-9 $9")
    ApprovalRequest.objects.filter(run=not_due).update(
        expires_at=timezone.now() + timedelta(hours=1)
    )
    assert recovery.requests_expire_overdue() == 1
    request.refresh_from_db()
    assert request.state == "expired"
    assert request.reason == "expired"
    assert request.decided_by is None and request.decided_at is not None
    assert request.answer == {"id": request.request_id, "ok": False, "reason": "expired"}
    assert fresh(run).status == "queued"
    assert not_due.requests.get().state == "pending"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: expired"
    assert "expired" in run.text
    assert recovery.requests_expire_overdue() == 0  # nothing twice
    assert Event.objects.filter(run=run, action="request_expired").count() == 1


def test_expired_approval_request_reaches_the_model_and_nothing_runs():
    run = start_and_halt(prompt="delete the account")
    _overdue(run)
    recovery.requests_expire_overdue()
    drain()
    run = fresh(run)
    output = tool_output(run, "call_delete")
    assert "expired" in output and "scheduled" not in output
    assert not ToolExecution.objects.filter(run=run).exists()


def test_decided_request_is_not_expired_later():
    user = make_user()
    run = start_and_halt(user=user)
    request = _overdue(run)
    services.request_decline(request_id=request.request_id, user=user, reason="no")
    assert recovery.requests_expire_overdue() == 0
    request.refresh_from_db()
    assert request.state == "declined" and request.reason == "no"
