"""Rules as people write them: create, edit (each edit a new version), switch, delete.

Each write checks the "manage rules" permission and validates every field first: a condition
that does not compile is refused with where it fails, and nothing is stored. An edit
changes what new halts meet; requests already decided keep the version they were decided by.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import F, Model
from django.utils import timezone

from ..domain.arguments import MAX_REASON_CHARS
from ..domain.conditions import (
    MAX_CONDITION_CHARS,
    ConditionFailed,
    ConditionInvalid,
    compile_condition,
    equals_condition,
    evaluate,
)
from ..domain.exceptions import InvalidInput
from ..models import ApprovalRequest, Event, RequestCall, Rule
from ..permissions import perm, require

MANAGE_RULES = perm("manage_rules")

# What a person sets on a rule (the rest is the rule's own bookkeeping).
EDITABLE = (
    "name",
    "position",
    "enabled",
    "agent",
    "tool",
    "kind",
    "condition",
    "effect",
    "reason",
    "expires_at",
    "approvals_needed",
    "approver_group",
    "starter_may_not_approve",
    "route_user",
    "route_group",
    "escalate_after_minutes",
    "escalate_action",
    "escalate_group",
    "escalate_user",
    "escalate_reason",
)
REQUIRING = (Rule.Effect.REQUIRE_APPROVERS, Rule.Effect.REQUIRE_GROUP)
# Effects whose request waits (and so may escalate): the require_* ones and route.
WAITING = (*REQUIRING, Rule.Effect.ROUTE)
MAX_APPROVERS = 20


# The audit trail's actions for rules (Event.action; Event.rule names the rule).
RULE_CREATED = "rule_created"
RULE_EDITED = "rule_edited"
RULE_SWITCHED_ON = "rule_switched_on"
RULE_SWITCHED_OFF = "rule_switched_off"
RULE_DELETED = "rule_deleted"


class RuleInvalid(InvalidInput):
    """A field of a rule cannot be used (400): `field` names it for a form."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def _text(fields: dict[str, Any], name: str, limit: int, *, required: bool = False) -> None:
    if name not in fields:
        return
    value = fields[name]
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise RuleInvalid(name, "must be text")
    value = value.strip() if name != "reason" else value
    if required and not value:
        raise RuleInvalid(name, "is required")
    if len(value) > limit:
        raise RuleInvalid(name, f"must be at most {limit} characters")
    fields[name] = value


def clean_rule_fields(fields: dict[str, Any], *, creating: bool) -> dict[str, Any]:
    """The fields, checked and normalised; RuleInvalid names the first that is not usable."""
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise RuleInvalid(sorted(unknown)[0], "is not a field of a rule")
    fields = dict(fields)
    if creating:
        for name in ("name", "effect"):
            if not fields.get(name):
                raise RuleInvalid(name, "is required")
    _text(fields, "name", 100, required=True)
    _text(fields, "agent", 100)
    _text(fields, "tool", 200)
    _text(fields, "condition", 2000)
    _text(fields, "reason", MAX_REASON_CHARS)
    if "effect" in fields and fields["effect"] not in Rule.Effect.values:
        raise RuleInvalid("effect", f"must be one of {', '.join(Rule.Effect.values)}")
    if "kind" in fields:
        fields["kind"] = fields["kind"] or ""
        if fields["kind"] not in Rule.Kind.values:
            allowed = ", ".join(v for v in Rule.Kind.values if v)
            raise RuleInvalid("kind", f"must be empty (any) or one of {allowed}")
    if "position" in fields:
        position = fields["position"]
        if isinstance(position, bool) or not isinstance(position, int) or not position >= 0:
            raise RuleInvalid("position", "must be a whole number, 0 or more")
        if position > 1_000_000:
            raise RuleInvalid("position", "must be at most 1000000")
    if "enabled" in fields and not isinstance(fields["enabled"], bool):
        raise RuleInvalid("enabled", "must be true or false")
    expires_at = fields.get("expires_at")
    if expires_at is not None and (not isinstance(expires_at, datetime) or not expires_at.tzinfo):
        raise RuleInvalid("expires_at", "must be a date and time with its time zone")
    _requirement_fields(fields)
    if fields.get("condition"):
        try:
            compile_condition(fields["condition"])
        except ConditionInvalid as exc:
            raise RuleInvalid("condition", str(exc)) from None
    return fields


def _whole(fields: dict[str, Any], name: str, low: int, high: int, *, empty: bool) -> None:
    if name not in fields:
        return
    value = fields[name]
    if value is None and empty:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RuleInvalid(name, f"must be a whole number from {low} to {high}")


def _named(fields: dict[str, Any], name: str, model: Any, label: str) -> None:
    """A group or a user given by name (the API, the form) or as the object (the admin)."""
    value = fields.get(name)
    if name not in fields or value is None or value == "" or isinstance(value, model):
        if value == "":
            fields[name] = None
        return
    if not isinstance(value, str):
        raise RuleInvalid(name, f"must be the name of a {label}")
    key = "name" if model is Group else get_user_model().USERNAME_FIELD
    found = model._default_manager.filter(**{key: value.strip()}).first()
    if found is None:
        raise RuleInvalid(name, f"there is no {label} named {value.strip()!r}")
    fields[name] = found


def _requirement_fields(fields: dict[str, Any]) -> None:
    """The requirement and escalation fields, each on its own (`check_requirements` checks
    them together, once the rule's other values are known)."""
    _whole(fields, "approvals_needed", 1, MAX_APPROVERS, empty=False)
    _whole(fields, "escalate_after_minutes", 1, 525_600, empty=True)
    _named(fields, "approver_group", Group, "group")
    _named(fields, "escalate_group", Group, "group")
    _named(fields, "escalate_user", get_user_model(), "user")
    _named(fields, "route_user", get_user_model(), "user")
    _named(fields, "route_group", Group, "group")
    if "starter_may_not_approve" in fields and not isinstance(
        fields["starter_may_not_approve"], bool
    ):
        raise RuleInvalid("starter_may_not_approve", "must be true or false")
    if "escalate_action" in fields:
        fields["escalate_action"] = fields["escalate_action"] or ""
        if fields["escalate_action"] not in Rule.Escalation.values:
            allowed = ", ".join(v for v in Rule.Escalation.values if v)
            raise RuleInvalid("escalate_action", f"must be empty (none) or one of {allowed}")
    _text(fields, "escalate_reason", MAX_REASON_CHARS)


def check_requirements(rule: Rule) -> None:
    """A rule's fields together: what its effect needs, and an escalation that can act."""
    requiring = rule.effect in REQUIRING
    if rule.effect == Rule.Effect.REQUIRE_APPROVERS and rule.approvals_needed < 2:
        raise RuleInvalid("approvals_needed", "require_approvers needs 2 or more approvers")
    if rule.effect == Rule.Effect.REQUIRE_GROUP and rule.approver_group_id is None:
        raise RuleInvalid("approver_group", "require_group needs the group whose members decide")
    if not requiring and (
        rule.approvals_needed > 1 or rule.approver_group_id or rule.starter_may_not_approve
    ):
        raise RuleInvalid(
            "effect", "approvers, a group or the starter flag need a require_* effect"
        )
    _check_route(rule)
    action, after = rule.escalate_action, rule.escalate_after_minutes
    if (action or after) and rule.effect not in WAITING:
        raise RuleInvalid(
            "escalate_action", "only a request that waits (require_* or route) escalates"
        )
    if bool(action) != bool(after):
        raise RuleInvalid(
            "escalate_after_minutes" if action else "escalate_action",
            "an escalation needs both an action and its minutes",
        )
    if action == Rule.Escalation.NOTIFY and rule.escalate_group_id is None:
        raise RuleInvalid("escalate_group", "notify needs the group to notify")
    if action == Rule.Escalation.REASSIGN and (rule.escalate_group_id is None) == (
        rule.escalate_user_id is None
    ):
        raise RuleInvalid("escalate_user", "reassign routes to one person or one group")


def _check_route(rule: Rule) -> None:
    """A route rule routes to exactly one person or one group; no other rule routes."""
    user, group = rule.route_user_id is not None, rule.route_group_id is not None
    if rule.effect != Rule.Effect.ROUTE:
        if user or group:
            raise RuleInvalid(
                "route_user" if user else "route_group",
                "only a route rule routes to a person or a group",
            )
        return
    if not user and not group:
        raise RuleInvalid("route_user", "route needs the person or the group to route to")
    if user and group:
        raise RuleInvalid("route_group", "route to one person or one group, not both")


def _json(value: Any) -> Any:
    """A field's value as the audit trail keeps it (a time as ISO text, a group or a person
    by name)."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value) if isinstance(value, Model) else value


def _audit(rule: Rule, user: Any, action: str, **detail: Any) -> None:
    """One entry of the rule's audit trail (an Event about no run): who, and what changed.
    The detail names the rule, so the entry still reads once the rule is deleted."""
    Event.objects.create(
        run=None,
        rule=rule,
        actor=user if getattr(user, "is_authenticated", False) else None,
        action=action,
        detail={"rule": {"id": rule.pk, "name": rule.name, "version": rule.version}, **detail},
    )


def rule_unsaved(**fields: Any) -> Rule:
    """A rule as typed, checked as a new one would be but not stored (for a dry run)."""
    return Rule(**clean_rule_fields(fields, creating=True))


def rule_create(*, user: Any, run: Any = None, source_request: Any = None, **fields: Any) -> Rule:
    require(user, MANAGE_RULES, "manage rules")
    fields = clean_rule_fields(fields, creating=True)
    check_requirements(Rule(**fields))
    with transaction.atomic():
        rule = Rule.objects.create(
            created_by=user, run=run, source_request=source_request, **fields
        )
        detail: dict[str, Any] = {"fields": {k: _json(v) for k, v in fields.items()}}
        if run is not None:
            detail["run_id"] = run.pk
        if source_request is not None:
            detail["source_request"] = source_request.request_id
        _audit(rule, user, RULE_CREATED, **detail)
        return rule


def rule_update(*, user: Any, rule_id: int, **fields: Any) -> Rule:
    """Change some of a rule's fields; any change is a new version (none: nothing written)."""
    require(user, MANAGE_RULES, "manage rules")
    fields = clean_rule_fields(fields, creating=False)
    with transaction.atomic():
        rule = Rule.objects.select_for_update().get(pk=rule_id)
        changed = {k: v for k, v in fields.items() if getattr(rule, k) != v}
        if not changed:
            return rule
        changes = {k: [_json(getattr(rule, k)), _json(v)] for k, v in changed.items()}
        for name, value in changed.items():
            setattr(rule, name, value)
        check_requirements(rule)
        rule.version = F("version") + 1
        rule.save(update_fields=[*changed, "version", "updated_at"])
        rule.refresh_from_db()
        if set(changed) == {"enabled"}:
            action = RULE_SWITCHED_ON if rule.enabled else RULE_SWITCHED_OFF
        else:
            action = RULE_EDITED
        _audit(rule, user, action, changes=changes)
        return rule


def rule_delete(*, user: Any, rule_id: int) -> None:
    """Delete a rule; the requests it decided keep its name in their audit trail."""
    require(user, MANAGE_RULES, "manage rules")
    with transaction.atomic():
        rule = Rule.objects.select_for_update().get(pk=rule_id)
        _audit(rule, user, RULE_DELETED)
        rule.delete()  # the entries keep its id and name; their link to it is cleared


def rules_delete(*, user: Any, rule_ids: list[int]) -> None:
    """Delete several rules, each as `rule_delete` does (its audit entry), all or none."""
    with transaction.atomic():
        for rule_id in rule_ids:
            rule_delete(user=user, rule_id=rule_id)


# -- the demo's example rules ------------------------------------------------------------

# Two rules for the demo agent, off: switched on from the Rules page, they decide its calls.
DEMO_RULES = (
    {
        "name": "small refunds (demo)",
        "agent": "demo",
        "tool": "refund",
        "effect": Rule.Effect.APPROVE,
        "condition": "args.amount <= 50",
        "enabled": False,
    },
    {
        "name": "never delete an admin account (demo)",
        "agent": "demo",
        "tool": "delete_account",
        "effect": Rule.Effect.DECLINE,
        "condition": 'args.account.startsWith("admin")',
        "reason": "an agent never deletes an admin account",
        "enabled": False,
    },
)


def ensure_demo_rules() -> list[Rule]:
    """Make the demo's example rules, off, each once: a rule made before (its audit entry
    says so, and outlives a delete) is not made again, nor changed. Returns those made now.
    The entries name no person (`serve` made them) and carry `"demo": true`."""
    made = []
    with transaction.atomic():
        for fields in DEMO_RULES:
            before = Event.objects.filter(
                action=RULE_CREATED, run=None, detail__demo=True, detail__rule__name=fields["name"]
            )
            if before.exists():
                continue
            fields = clean_rule_fields(dict(fields), creating=True)
            rule = Rule.objects.create(**fields)
            detail = {"fields": {k: _json(v) for k, v in fields.items()}, "demo": True}
            _audit(rule, None, RULE_CREATED, **detail)
            made.append(rule)
    return made


# -- "always allow" from a request's card --------------------------------------------------

# The scopes a reviewer picks when ticking "always allow this tool for this agent".
ALWAYS_ALLOW_SCOPES = {
    "args": "with these exact arguments",
    "run": "for this run only",
    "day": "for 24 hours",
    "always": "always",
}
ALWAYS_ALLOW_FIELD = "always_allow"


def require_always_allow(user: Any, scope: Any) -> None:
    """Before the decision: the permission (NotAllowed, a 403) and a known scope (400)."""
    require(user, MANAGE_RULES, "manage rules, which always allow needs (it makes a rule)")
    if scope not in ALWAYS_ALLOW_SCOPES:
        raise InvalidInput(f"{ALWAYS_ALLOW_FIELD}: must be one of {', '.join(ALWAYS_ALLOW_SCOPES)}")


def _glob_literal(name: str) -> str:
    """A tool name as a glob that matches that name only (`*`, `?`, `[` bracketed)."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def rule_always_allow(*, user: Any, row: ApprovalRequest, scope: str) -> Rule:
    """The approve rule an "always allow" makes, in the caller's transaction (the decision's:
    both commit or neither). Only a single gated call approved as the model asked it (no
    edit, no typed result) is allowed from then on; anything else is InvalidInput."""
    require_always_allow(user, scope)
    calls = list(RequestCall.objects.filter(request_id=row.pk).order_by("position"))
    if row.kind not in ("tool_call", "approval") or len(calls) != 1:
        raise InvalidInput(
            f"{ALWAYS_ALLOW_FIELD}: only a request for one tool call (a relay call or an"
            " approval) can be always allowed"
        )
    call = calls[0]
    if call.decision != RequestCall.Decision.APPROVE:
        raise InvalidInput(
            f"{ALWAYS_ALLOW_FIELD}: approve the call as the model asked it (no edited"
            " arguments, no typed result) to always allow it"
        )
    tool = call.tool_name or str((row.data or {}).get("tool") or "")
    fields: dict[str, Any] = {
        "name": f"Always allow {tool} {ALWAYS_ALLOW_SCOPES[scope]}"[:100],
        "effect": Rule.Effect.APPROVE,
        "agent": row.agent,
        "tool": _glob_literal(tool),
        "kind": row.kind,
    }
    if scope == "args":
        fields["condition"] = _exact_arguments(call.input)
    elif scope == "day":
        fields["expires_at"] = timezone.now() + timedelta(hours=24)
    run = row.run if scope == "run" else None
    return rule_create(user=user, run=run, source_request=row, **fields)


def _exact_arguments(args: Any) -> str:
    """The CEL condition for exactly these arguments, checked to hold for them."""
    refused = (
        f"{ALWAYS_ALLOW_FIELD}: these arguments cannot be matched exactly by a rule"
        " ({why}); choose another scope"
    )
    try:
        condition = equals_condition(args)
    except ValueError as exc:
        raise InvalidInput(refused.format(why=str(exc))) from None
    if len(condition) > MAX_CONDITION_CHARS:
        raise InvalidInput(refused.format(why="they are too long"))
    try:
        holds = evaluate(condition, args=args if args is not None else {}, run={})
    except ConditionFailed as exc:
        raise InvalidInput(refused.format(why=str(exc))) from None
    if not holds:
        raise InvalidInput(refused.format(why="CEL does not read them back as they are"))
    return condition
