"""Maintenance every worker runs now and then: runs whose worker died go back to the queue,
overdue requests are declined with reason "expired" (their runs resume)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from toolnexus.relay import answer_declined

from .. import events
from ..domain.exceptions import AlreadyDecided
from ..domain.records import lock_request, record_decision, set_run_status
from ..models import ApprovalRequest, RequestCall, Run
from .runner import enqueue

RunStatus = Run.Status
State = ApprovalRequest.State
Decision = RequestCall.Decision


def runs_recover_stale(*, now: datetime | None = None) -> int:
    """Queue again every running run whose worker stopped renewing its lease."""
    now = now or timezone.now()
    recovered = 0
    for run_id in Run.objects.filter(
        status=RunStatus.RUNNING, lease_expires_at__lt=now
    ).values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if (
                run.status != RunStatus.RUNNING
                or run.lease_expires_at is None
                or run.lease_expires_at >= now
            ):
                continue
            set_run_status(run, RunStatus.QUEUED, action="run_recovered", worker=run.worker_id)
            run.worker_id = ""
            run.lease_expires_at = None
            run.save()
            enqueue(run.pk)
            events.announce(run_id=run.pk, status_only=True)
            recovered += 1
    return recovered


def request_expire(*, request_id: str, user: Any = None) -> ApprovalRequest:
    """Decline an overdue request with reason "expired"; its run resumes. `user`: who
    expired it by hand (permission checked by the caller), or None for the system."""
    with transaction.atomic():
        row = lock_request(request_id)
        RequestCall.objects.filter(request=row).update(
            decision=Decision.DECLINE, reason="expired", is_error=True
        )
        answer = answer_declined(row.request_id, "expired")
        if record_decision(row, user, State.EXPIRED, answer, "expired"):
            enqueue(row.run_id)
    return row


def requests_expire_overdue(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    expired = 0
    for request_id in ApprovalRequest.objects.filter(
        state=State.PENDING, expires_at__lte=now
    ).values_list("request_id", flat=True):
        try:
            request_expire(request_id=request_id)
            expired += 1
        except (AlreadyDecided, ApprovalRequest.DoesNotExist):
            continue  # decided by someone else in the meantime
    return expired
