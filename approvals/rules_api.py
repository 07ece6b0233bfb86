"""The JSON API's rules (`/api/rules`): list, create, read, edit, delete. Mounted on the
app's API by `approvals.api` (same authentication, throttles and error shapes); every
endpoint needs the "manage rules" permission (403 without it). A condition that does not
compile is 400 naming the field and where the expression fails; nothing is stored."""

from __future__ import annotations

from datetime import datetime

from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict, StrictBool, StrictInt, StrictStr, model_validator

from . import permissions, selectors
from .domain.exceptions import NotAllowed
from .models import Rule
from .services import rule_apply as rule_apply_services
from .services import rules as rule_services

router = Router(tags=["rules"])


class ErrorOut(Schema):
    detail: str


ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 429: ErrorOut}


EFFECTS = (
    '"approve", "decline", or (the request waits with requirements) "require_approvers" or'
    ' "require_group", or (it waits routed to a person or a group: `route_user` or'
    ' `route_group`) "route".'
)


class RulePatch(Schema):
    """The fields to change; those left out keep their value."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr | None = Field(None, description="What people call the rule.")
    position: StrictInt | None = Field(None, description="Lower positions are tried first.")
    enabled: StrictBool | None = None
    agent: StrictStr | None = Field(None, description="An agent's name; empty: any agent.")
    tool: StrictStr | None = Field(None, description="A tool name or a glob (refund_*).")
    kind: StrictStr | None = Field(None, description='"tool_call", "approval" or empty (any).')
    condition: StrictStr | None = Field(
        None, description="A CEL expression over `args` and `run`; empty: always."
    )
    effect: StrictStr | None = Field(None, description=EFFECTS)
    reason: StrictStr | None = Field(None, description='For a decline; empty: "declined".')
    expires_at: datetime | None = Field(None, description="The rule stops matching then.")
    approvals_needed: StrictInt | None = Field(
        None, description="Distinct approvers needed (require_approvers: 2 or more)."
    )
    approver_group: StrictStr | None = Field(
        None, description="A group's name: only its members decide (require_group)."
    )
    starter_may_not_approve: StrictBool | None = Field(
        None, description="Whoever started the run may not approve."
    )
    route_user: StrictStr | None = Field(
        None, description="A username: route the request to this person (route)."
    )
    route_group: StrictStr | None = Field(
        None, description="A group's name: route the request to its members (route)."
    )
    escalate_after_minutes: StrictInt | None = Field(
        None, description="Escalate a request still undecided after this many minutes."
    )
    escalate_action: StrictStr | None = Field(
        None, description='"notify", "reassign", "decline" or empty (none).'
    )
    escalate_group: StrictStr | None = Field(
        None, description="A group's name: notify it, or route the request to it."
    )
    escalate_user: StrictStr | None = Field(
        None, description="A username: route the request to this person."
    )
    escalate_reason: StrictStr | None = Field(None, description="The escalation's decline reason.")


class RuleIn(RulePatch):
    name: StrictStr
    effect: StrictStr = Field(description=EFFECTS)


class RuleMatchOut(Schema):
    request_id: str
    run_id: int
    state: str
    decided_at: datetime | None
    version: int | None = Field(description="The rule's version it was decided under.")


class RuleOut(Schema):
    id: int
    name: str
    position: int
    enabled: bool
    agent: str
    tool: str
    kind: str
    condition: str
    effect: str
    reason: str
    run_id: int | None
    expires_at: datetime | None
    approvals_needed: int
    approver_group: str | None
    starter_may_not_approve: bool
    route_user: str | None
    route_group: str | None
    escalate_after_minutes: int | None
    escalate_action: str
    escalate_group: str | None
    escalate_user: str | None
    escalate_reason: str
    version: int
    match_count: int
    last_matched_at: datetime | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    source_request: str | None = Field(
        None, description='The request whose "always allow" made the rule (its request id).'
    )
    last_matches: list[RuleMatchOut] = Field(
        [], description="The newest requests it decided (of agents you may see), newest first."
    )


def rule_out(rule: Rule, recent: list | None = None) -> dict:
    own = ("created_by", "source_request", "last_matches")
    groups = ("approver_group", "escalate_group", "route_group")
    users = ("escalate_user", "route_user")
    fields = {
        name: getattr(rule, name)
        for name in RuleOut.model_fields
        if name not in own + groups + users
    }
    fields["id"] = rule.pk
    fields["created_by"] = rule.created_by.get_username() if rule.created_by else None
    for name in groups:
        group = getattr(rule, name)
        fields[name] = group.name if group is not None else None
    for name in users:
        user = getattr(rule, name)
        fields[name] = user.get_username() if user is not None else None
    source = rule.source_request
    fields["source_request"] = source.request_id if source is not None else None
    fields["last_matches"] = [
        {
            "request_id": row.request_id,
            "run_id": row.run_id,
            "state": row.state,
            "decided_at": row.decided_at,
            "version": row.rule_version,
        }
        for row in recent or []
    ]
    return fields


def _require_manage(request) -> None:
    if not request.user.has_perm(rule_services.MANAGE_RULES):
        raise NotAllowed("you do not have permission to manage rules")


def _recent(request, rules: list) -> dict[int, list]:
    hidden = permissions.hidden_agents(request.user)
    return selectors.rule_recent_decisions([r.pk for r in rules], hidden_agents=hidden)


@router.get("", response={200: list[RuleOut], **ERRORS}, summary="List rules in their order")
def list_rules(request):
    _require_manage(request)
    rules = selectors.rule_list()
    recent = _recent(request, rules)
    return [rule_out(r, recent.get(r.pk)) for r in rules]


@router.post("", response={201: RuleOut, **ERRORS}, summary="Create a rule")
def create_rule(request, payload: RuleIn):
    fields = payload.model_dump(exclude_unset=True)
    rule = rule_services.rule_create(user=request.user, **fields)
    return Status(201, rule_out(selectors.rule_get(rule_id=rule.pk)))


class DryRunIn(Schema):
    """A saved rule (`rule_id`) or one as typed (`rule`, not stored), and how many of the
    newest decided requests to try it on."""

    model_config = ConfigDict(extra="forbid")

    rule_id: StrictInt | None = Field(None, description="A saved rule.")
    rule: RuleIn | None = Field(None, description="A rule as typed (nothing is stored).")
    limit: StrictInt = Field(
        selectors.DRY_RUN_DEFAULT,
        ge=1,
        le=selectors.DRY_RUN_MAX,
        description="How many of the newest requests people decided (at most 2000).",
    )

    @model_validator(mode="after")
    def _one_rule(self):
        if (self.rule_id is None) == (self.rule is None):
            raise ValueError("give rule_id (a saved rule) or rule (one as typed), not both")
        return self


class DryRunItemOut(Schema):
    request_id: str
    run_id: int
    agent: str
    tool: str
    kind: str
    state: str = Field(description="What people decided: approved, answered or declined.")
    decided_by: str | None
    decided_at: datetime | None
    would: str | None = Field(description="The rule's effect; null: it could not be evaluated.")
    differs: bool = Field(description="The rule would have decided otherwise than people did.")
    error: str = Field(description="Why the condition could not be evaluated for this call.")


class DryRunOut(Schema):
    considered: int = Field(description="Requests people decided, newest first, tried.")
    matched: int
    would_approve: int
    would_decline: int
    differs: int
    failed: int = Field(description="Requests the condition could not be evaluated for.")
    items: list[DryRunItemOut] = Field(description="The requests it matched or failed on.")


def dry_run_out(result) -> dict:
    items = [
        {
            "request_id": i.row.request_id,
            "run_id": i.row.run_id,
            "agent": i.row.agent,
            "tool": i.tool,
            "kind": i.row.kind,
            "state": i.row.state,
            "decided_by": i.row.decided_by.get_username() if i.row.decided_by else None,
            "decided_at": i.row.decided_at,
            "would": i.would,
            "differs": i.differs,
            "error": i.error,
        }
        for i in result.items
    ]
    counts = ("considered", "matched", "would_approve", "would_decline", "differs", "failed")
    return {**{k: getattr(result, k) for k in counts}, "items": items}


@router.post(
    "/dry-run",
    response={200: DryRunOut, **ERRORS},
    summary="What a rule would have decided over recent decisions",
    description="Tries a saved rule (`rule_id`) or one as typed (`rule`, not stored) on the"
    " newest `limit` requests people decided (default 200, at most 2000; a single gated call"
    " each), as if it were on and unexpired, and says where it differs from what people"
    " decided. Nothing is written.",
)
def dry_run(request, payload: DryRunIn):
    _require_manage(request)
    if payload.rule_id is not None:
        rule = selectors.rule_get(rule_id=payload.rule_id)
    else:
        rule = rule_services.rule_unsaved(**payload.rule.model_dump(exclude_unset=True))
    hidden = permissions.hidden_agents(request.user)
    result = selectors.rule_dry_run(rule, limit=payload.limit, hidden_agents=hidden)
    return dry_run_out(result)


class ApplyResultOut(Schema):
    id: str = Field(description="The request id.")
    status: str = Field(description="done, already, invalid, forbidden or missing")
    message: str = Field(description="done: the new state; otherwise why not.")


class ApplyOut(Schema):
    results: list[ApplyResultOut]


@router.post(
    "/{rule_id}/apply",
    response={200: ApplyOut, **ERRORS},
    summary="Apply a rule to the pending requests it matches",
    description="The rule (on and unexpired) decides each pending request it matches now (at"
    " most 500, oldest first, of agents you may see), each in its own transaction, recorded"
    " as its decision. Needs manage rules and the decide permission.",
)
def apply_rule(request, rule_id: int):
    _require_manage(request)
    outcomes = rule_apply_services.rule_apply_pending(user=request.user, rule_id=rule_id)
    return {"results": [o.as_dict() for o in outcomes]}


@router.get("/{rule_id}", response={200: RuleOut, **ERRORS}, summary="Read a rule")
def get_rule(request, rule_id: int):
    _require_manage(request)
    rule = selectors.rule_get(rule_id=rule_id)
    return rule_out(rule, _recent(request, [rule]).get(rule.pk))


@router.patch(
    "/{rule_id}",
    response={200: RuleOut, **ERRORS},
    summary="Change a rule (a new version; new halts only)",
)
def update_rule(request, rule_id: int, payload: RulePatch):
    fields = payload.model_dump(exclude_unset=True)
    rule_services.rule_update(user=request.user, rule_id=rule_id, **fields)
    return rule_out(selectors.rule_get(rule_id=rule_id))


@router.delete("/{rule_id}", response={204: None, **ERRORS}, summary="Delete a rule")
def delete_rule(request, rule_id: int):
    rule_services.rule_delete(user=request.user, rule_id=rule_id)
    return Status(204, None)
