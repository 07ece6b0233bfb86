"""Escalation of requests a rule left waiting (`RequestRequirement.escalate_at`), checked by
every worker's maintenance: a request still pending when its time comes is escalated once,
in one transaction with its row locked, by its rule's action:

- notify: an audit event naming the group and its members, and a live toast on their pages
  (the notification system proper is built elsewhere; it can read the event);
- reassign: the request is routed to a person or a group (the card says "routed to ...",
  the inbox's "routed to me" chip lists it for them), as a route rule routes it at the halt;
- decline: declined with the rule's reason, and its run resumes with that decline.

A request decided meanwhile is left alone; a second worker finds it escalated already.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from toolnexus.relay import answer_declined, decline_text

from .. import events
from ..domain import statements
from ..domain.exceptions import AlreadyDecided
from ..domain.records import append_event, lock_request, record_decision
from ..models import ApprovalRequest, Event, RequestCall, RequestRequirement, Run
from .runner import enqueue

State = ApprovalRequest.State
DEFAULT_REASON = "not decided in time"


def requests_escalate_due(*, now: datetime | None = None) -> int:
    """Escalate every pending request whose escalation is due; how many were."""
    now = now or timezone.now()
    due = RequestRequirement.objects.filter(
        escalated_at__isnull=True,
        escalate_at__isnull=False,
        escalate_at__lte=now,
        request__state=State.PENDING,
    ).values_list("request__request_id", flat=True)
    escalated = 0
    for request_id in list(due):
        try:
            escalated += request_escalate(request_id=request_id, now=now)
        except (AlreadyDecided, ApprovalRequest.DoesNotExist):
            continue  # decided (or gone) in the meantime
    return escalated


def request_escalate(*, request_id: str, now: datetime | None = None) -> bool:
    """Escalate one request if still due (False: decided, or escalated by another worker)."""
    now = now or timezone.now()
    with transaction.atomic():
        row = lock_request(request_id)
        found = statements.select(RequestRequirement, {"request_id": row.pk}, for_update=True)
        if not found:
            return False
        requirement = found[0]
        if (
            requirement.escalated_at is not None
            or requirement.escalate_at is None
            or requirement.escalate_at > now
        ):
            return False
        requirement.escalated_at = now
        action = requirement.escalate_action
        detail: dict[str, Any] = {"escalation": action}
        to_notify: list[int] = []
        if action == "notify":
            members = _members(requirement.escalate_group_id)
            to_notify = [pk for pk, _ in members]
            detail.update(group=_group_name(requirement), notified=[n for _, n in members])
        elif action == "reassign":
            requirement.routed_user_id = requirement.escalate_user_id
            requirement.routed_group_id = (
                requirement.escalate_group_id if requirement.escalate_user_id is None else None
            )
            detail.update(routed_to=_routed_name(requirement))
        statements.update(
            RequestRequirement,
            {"pk": requirement.pk},
            {
                "escalated_at": now,
                "routed_user_id": requirement.routed_user_id,
                "routed_group_id": requirement.routed_group_id,
            },
        )
        trail: list[Event] = []
        append_event(
            Run(pk=row.run_id),
            "request_escalated",
            request=row,
            from_state=row.state,
            to_state=row.state,
            into=trail,
            **detail,
        )
        statements.insert(trail)
        if action == "decline":
            _decline(row, requirement.escalate_reason or DEFAULT_REASON)
        else:
            events.announce(run_id=row.run_id, request_pk=row.pk)
        if to_notify:
            text = f"Escalated to {detail['group']}: {row.prompt or row.kind} is still waiting"
            events.notify(user_ids=to_notify, text=text, about=f"request-{row.pk}")
    return True


def _decline(row: ApprovalRequest, reason: str) -> None:
    calls = statements.select(RequestCall, {"request_id": row.pk}, order_by=("position",))
    for call in calls:
        statements.update(
            RequestCall,
            {"pk": call.pk},
            {
                "decision": RequestCall.Decision.DECLINE,
                "reason": reason,
                "output": decline_text(call.tool_name, reason),
                "is_error": True,
            },
        )
    if record_decision(row, None, State.DECLINED, answer_declined(row.request_id, reason), reason):
        enqueue(row.run_id)


def _members(group_id: Any) -> list[tuple[int, str]]:
    if group_id is None:
        return []
    User = get_user_model()
    return list(
        User._default_manager.filter(groups__pk=group_id, is_active=True)
        .order_by(User.USERNAME_FIELD)
        .values_list("pk", User.USERNAME_FIELD)
    )


def _group_name(requirement: RequestRequirement) -> str:
    group = requirement.escalate_group
    return group.name if group is not None else ""


def _routed_name(requirement: RequestRequirement) -> str:
    if requirement.routed_user_id is not None:
        return requirement.routed_user.get_username()
    group = requirement.routed_group
    return f"the group {group.name}" if group is not None else ""
