"""Rules that decide for the team, and what a rule requires of a request's deciders (several
approvers, a group, escalation) with the approvals counted so far."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from .runs import ApprovalRequest, Run


class Rule(models.Model):
    """A standing decision for the team: calls in its scope whose condition holds are approved
    or declined by the worker where the run would halt, with no request left waiting; or
    they wait, with the rule's requirements (require_*) or routed to a person or a group
    (route).

    Rules are tried by `position`, then declines before approves, then age; the first
    enabled, unexpired match decides (`domain.rules.first_match`). `version` goes up with
    every edit, and each decision records the version it was made under."""

    class Effect(models.TextChoices):
        APPROVE = "approve"
        DECLINE = "decline"
        # These decide nothing: the request waits with the rule's requirements on it, or
        # routed from the start to the rule's person or group (as a reassign escalation
        # routes it).
        REQUIRE_APPROVERS = "require_approvers", "require N distinct approvers"
        REQUIRE_GROUP = "require_group", "require a group"
        ROUTE = "route", "route to a person or group"

    class Escalation(models.TextChoices):
        NONE = "", "none"
        NOTIFY = "notify", "notify a group"
        REASSIGN = "reassign", "route to a person or group"
        DECLINE = "decline", "decline with a reason"

    class Kind(models.TextChoices):
        ANY = "", "any gated call"
        TOOL_CALL = "tool_call", "relay call"
        APPROVAL = "approval", "approval"

    name = models.CharField(max_length=100)
    position = models.PositiveIntegerField(
        default=100, help_text="Lower positions are tried first."
    )
    enabled = models.BooleanField(default=True)
    agent = models.CharField(max_length=100, blank=True, default="", help_text="Empty: any agent.")
    tool = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="A tool name or a glob such as refund_* (empty: any tool).",
    )
    kind = models.CharField(max_length=20, choices=Kind.choices, blank=True, default="")
    condition = models.TextField(
        blank=True,
        default="",
        help_text='A CEL expression over args and run, e.g. args.amount <= 50 && args.currency == "USD".',
    )
    effect = models.CharField(max_length=20, choices=Effect.choices)
    reason = models.TextField(
        blank=True, default="", help_text='What the model reads for a decline (empty: "declined").'
    )
    # An "always allow ... for this run only" rule: only this run's calls match.
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.CASCADE, related_name="rules"
    )
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never.")
    # Requirements (effects require_approvers / require_group), copied onto each request.
    approvals_needed = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct people who must approve (require_approvers: 2 or more)."
    )
    approver_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Only its members may decide (require_group; optional otherwise).",
    )
    starter_may_not_approve = models.BooleanField(
        default=False, help_text="Whoever started the run may not approve its call."
    )
    # Where a route rule routes the request (exactly one of them; effect route only).
    route_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Route the request to this person (route; or a group below).",
    )
    route_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Route the request to this group's members (route; or a person above).",
    )
    escalate_after_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Escalate a request still undecided after this long."
    )
    escalate_action = models.CharField(
        max_length=10, choices=Escalation.choices, blank=True, default=""
    )
    escalate_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_reason = models.TextField(blank=True, default="")
    version = models.PositiveIntegerField(default=1)
    match_count = models.PositiveIntegerField(default=0)
    last_matched_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # An "always allow" ticked when approving this request made the rule.
    source_request = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["position", "id"]
        permissions = [("manage_rules", "Can create, edit and delete rules")]

    def __str__(self) -> str:
        return f"rule {self.pk}, {self.name}, version {self.version}"


class RequestRequirement(models.Model):
    """What a pending request needs before it is decided, copied from the rule that required
    it when the run halted (later edits of the rule change new halts only), and its
    escalation: when it is due, what it does, and once done, when it did; and to whom it is
    routed (by a route rule from the start, or by a reassign escalation)."""

    request = models.OneToOneField(
        ApprovalRequest, on_delete=models.CASCADE, related_name="requirement"
    )
    rule = models.ForeignKey(
        Rule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rule_version = models.PositiveIntegerField(null=True, blank=True)
    approvals_needed = models.PositiveSmallIntegerField(default=1)
    approver_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    starter_may_not_approve = models.BooleanField(default=False)
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalate_action = models.CharField(max_length=10, blank=True, default="")
    escalate_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    escalate_reason = models.TextField(blank=True, default="")
    escalated_at = models.DateTimeField(null=True, blank=True)
    # Set at the halt by a route rule, or later by a "reassign" escalation: the inbox's
    # "routed to me" chip.
    routed_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    routed_group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        indexes = [
            # The worker's escalation sweep: due and not yet escalated.
            models.Index(
                fields=["escalate_at"],
                condition=Q(escalated_at__isnull=True, escalate_at__isnull=False),
                name="req_escalation_due",
            )
        ]

    def __str__(self) -> str:
        return f"requirement of request {self.request_id}"


class ApprovalGiven(models.Model):
    """One person's approval of a request that needs several: the Nth distinct one decides it."""

    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="approvals_given"
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name = "approval given"
        verbose_name_plural = "approvals given"
        constraints = [
            models.UniqueConstraint(fields=["request", "user"], name="approval_given_once_per_user")
        ]

    def __str__(self) -> str:
        return f"approval of request {self.request_id} by user {self.user_id}"
