"""Who may decide a request a rule put requirements on, and approvals that count toward N.

A require_* rule leaves its requirements on the request (`RequestRequirement`): only members
of a group decide it, whoever started the run may not approve it, N distinct people must
approve it. The decision services call `check_requirement` with the request row locked, so
two approvers racing are counted one after the other: each approval short of N is recorded
(`ApprovalGiven`, once per person), audited and announced, and leaves the request pending;
the Nth goes on to decide it as any approval does, and resumes the run once. A decline by
anyone allowed ends it at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import events
from ..domain import statements
from ..domain.exceptions import InvalidInput, InvalidTransition, NotAllowed
from ..domain.records import append_event
from ..models import ApprovalGiven, ApprovalRequest, RequestRequirement, Run


@dataclass(frozen=True)
class PartialApproval:
    """An approval recorded toward N: the request stays pending."""

    given: int
    needed: int
    approvers: tuple[str, ...]

    @property
    def message(self) -> str:
        """ "1 of 2 approved: reviewer" """
        return f"{self.given} of {self.needed} approved: {', '.join(self.approvers)}"


def requirement_of(row: ApprovalRequest) -> RequestRequirement | None:
    if not row.has_requirement:
        return None  # no rule set one: nothing to read
    found = statements.select(RequestRequirement, {"request_id": row.pk})
    return found[0] if found else None


def _in_group(user: Any, group_id: int) -> bool:
    return user.groups.filter(pk=group_id).exists()


def require_allowed(row: ApprovalRequest, user: Any, requirement: Any, *, approving: bool) -> None:
    """403 with why, for a person the request's requirements leave out."""
    if requirement.approver_group_id is not None and not _in_group(
        user, requirement.approver_group_id
    ):
        group = requirement.approver_group.name
        raise NotAllowed(f"only members of the group {group!r} may decide this request")
    if approving and requirement.starter_may_not_approve:
        starter = Run.objects.filter(pk=row.run_id).values_list("started_by_id", flat=True).first()
        if starter is not None and starter == user.pk:
            raise NotAllowed(
                "You need another reviewer: whoever started this run may not approve this"
                " request (a rule says so); declining it remains possible"
            )


def check_requirement(
    row: ApprovalRequest, user: Any, *, approving: bool, as_shown: bool = True
) -> PartialApproval | None:
    """With the request row locked: refuse a person the requirements leave out; for an
    approval of a request that needs several, record it and return the count while it is
    short of N (None: go on and decide). `as_shown`: the approval changes nothing (edits,
    typed results, per-call decisions are for requests one person decides)."""
    requirement = requirement_of(row)
    if requirement is None:
        return None
    require_allowed(row, user, requirement, approving=approving)
    if not approving or requirement.approvals_needed < 2:
        return None
    if not as_shown:
        raise InvalidInput(
            f"this request needs {requirement.approvals_needed} approvers: approve it as"
            " shown (edits and typed results are not taken), or decline it"
        )
    if ApprovalGiven.objects.filter(request_id=row.pk, user_id=user.pk).exists():
        raise InvalidTransition(
            "you already approved this request: it needs another reviewer's approval"
        )
    ApprovalGiven.objects.create(request_id=row.pk, user=user)
    approvers = tuple(
        ApprovalGiven.objects.filter(request_id=row.pk)
        .order_by("created_at", "id")
        .values_list("user__username", flat=True)
    )
    if len(approvers) >= requirement.approvals_needed:
        return None  # the Nth: the caller decides the request
    partial = PartialApproval(len(approvers), requirement.approvals_needed, approvers)
    trail: list[Any] = []
    append_event(
        Run(pk=row.run_id),
        "approval_given",
        request=row,
        actor=user,
        from_state=row.state,
        to_state=row.state,
        into=trail,
        given=partial.given,
        needed=partial.needed,
        approvers=list(approvers),
    )
    statements.insert(trail)
    events.announce(run_id=row.run_id, request_pk=row.pk)
    return partial
