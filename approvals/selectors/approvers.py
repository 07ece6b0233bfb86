"""What a request a rule put requirements on still needs: who approved it so far, who may
decide it, where a route rule or an escalation routed it (the card, the request page, the
API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from ..models import ApprovalGiven, RequestRequirement


@dataclass(frozen=True)
class RequirementView:
    needed: int
    approvers: tuple[str, ...]  # who approved so far, in order
    group: str | None  # only its members decide
    starter_may_not_approve: bool
    routed_to: str | None  # "rita" or "the group Finance": a route rule or reassignment
    escalated: bool

    @property
    def progress(self) -> str:
        """ "1 of 2 approved: rita" (or "0 of 2 approved")"""
        text = f"{len(self.approvers)} of {self.needed} approved"
        return f"{text}: {', '.join(self.approvers)}" if self.approvers else text


def requirement_view(row: Any) -> RequirementView | None:
    """The request's requirements and progress (None: no rule set any). One query, two when
    several approvers are needed, none for a request without requirements."""
    if "has_requirement" not in row.get_deferred_fields() and not row.has_requirement:
        return None
    request_pk = row.pk
    requirement = (
        RequestRequirement.objects.filter(request_id=request_pk)
        .select_related("approver_group", "routed_user", "routed_group")
        .first()
    )
    if requirement is None:
        return None
    approvers: tuple[str, ...] = ()
    if requirement.approvals_needed > 1:
        approvers = tuple(
            ApprovalGiven.objects.filter(request_id=request_pk)
            .order_by("created_at", "id")
            .values_list("user__username", flat=True)
        )
    routed = None
    if requirement.routed_user is not None:
        routed = requirement.routed_user.get_username()
    elif requirement.routed_group is not None:
        routed = f"the group {requirement.routed_group.name}"
    group = requirement.approver_group
    return RequirementView(
        needed=requirement.approvals_needed,
        approvers=approvers,
        group=group.name if group is not None else None,
        starter_may_not_approve=requirement.starter_may_not_approve,
        routed_to=routed,
        escalated=requirement.escalated_at is not None,
    )


def with_approval_progress(rows: QuerySet) -> QuerySet:
    """Rows annotated with `approvers_needed` (1 without a requirement) and `approvers_so_far`:
    the inbox rows' "1 of 2 approved", in the rows' own statement (no query per row)."""
    needed = RequestRequirement.objects.filter(request_id=OuterRef("pk")).values(
        "approvals_needed"
    )[:1]
    given = (
        ApprovalGiven.objects.filter(request_id=OuterRef("pk"))
        .order_by()
        .values("request_id")
        .annotate(n=Count("id"))
        .values("n")[:1]
    )
    return rows.annotate(
        approvers_needed=Coalesce(Subquery(needed), Value(1), output_field=IntegerField()),
        approvers_so_far=Coalesce(Subquery(given), Value(0), output_field=IntegerField()),
    )
