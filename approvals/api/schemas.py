"""The API's request and response schemas (pydantic, through django-ninja)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema
from pydantic import ConfigDict, StrictBool, StrictStr

from .. import selectors, services

# -- schemas -------------------------------------------------------------------------------


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class RunIn(Strict):
    agent: StrictStr = Field(..., max_length=100, examples=["demo"])
    prompt: StrictStr = Field(
        ..., max_length=services.MAX_PROMPT_CHARS, examples=["Refund order A-1001, $250"]
    )


class CallDecisionIn(Strict):
    decision: StrictStr | None = Field(None, description="approve, output or decline")
    input: dict[str, Any] | None = None
    output: StrictStr | None = None
    is_error: StrictBool = False
    reason: StrictStr | None = None


class ApproveIn(Strict):
    input: dict[str, Any] | None = Field(
        None,
        description="edited arguments (validated against the tool's schema); for an input"
        " request or an MCP server's question (kind elicitation), the form's content"
        " (validated against its data.schema)",
    )
    output: StrictStr | None = Field(
        None, description="the typed output, for a relay call without an executor or a question"
    )
    calls: dict[str, CallDecisionIn] | None = Field(
        None, description="per-call decisions for a request carrying several relay calls"
    )
    always_allow: Literal["args", "run", "day", "always"] | None = Field(
        None,
        description='also make an approve rule for this tool and agent (the "manage rules"'
        " permission, else 403): with these exact arguments (args), for this run only (run),"
        " for 24 hours (day) or always; only a single call approved as asked",
    )


class DeclineIn(Strict):
    reason: StrictStr | None = Field(
        None,
        max_length=services.MAX_REASON_CHARS,
        description='empty or absent means "declined"; an MCP server\'s question is declined'
        " as such (the server hears decline) and the reason is kept in the record",
    )


class AnswerIn(Strict):
    id: StrictStr
    ok: StrictBool
    data: dict[str, Any] | None = None
    reason: StrictStr | None = None


class RequestFilter(Schema):
    state: str | None = Field(
        "pending",
        description="pending, approved, answered, declined, expired, cancelled; empty for all",
    )
    agent: str | None = None
    kind: str | None = None
    q: str | None = Field(
        None,
        max_length=selectors.MAX_SEARCH_CHARS,
        description="search: a case-insensitive substring of the prompt, the agent, the tool"
        " names or the arguments",
    )
    sort: str | None = Field(
        None,
        description="newest (default), oldest, or deadline (soonest expiry first, none last)",
    )
    claim: str | None = Field(
        None,
        description="mine or unclaimed (active claims only), routed (by a route rule or an"
        " escalation, to you or a group of yours); empty for any",
    )
    overdue: bool = Field(False, description="only pending requests past their expiry")
    hidden: str | None = Field(
        None,
        description="empty: leave out what you snoozed or ignored; only: just those",
    )
    limit: int = Field(50, ge=1, le=200)
    offset: int = Field(0, ge=0, le=1_000_000_000)


class RunListFilter(Schema):
    status: str | None = None
    agent: str | None = None
    limit: int = Field(50, ge=1, le=200)
    offset: int = Field(0, ge=0, le=1_000_000_000)


class ArgumentChange(Schema):
    key: str
    before: Any = None
    after: Any = None
    change: str = Field(..., description="changed, added or removed")


class CallOut(Schema):
    id: str
    name: str
    input: dict[str, Any]
    arguments: str
    decision: str | None
    edited_input: dict[str, Any] | None
    changes: list[ArgumentChange] = Field(
        default_factory=list, description="the reviewer's edits: each argument, before and after"
    )
    output: str | None
    is_error: bool
    reason: str | None


class ClaimOut(Schema):
    by: str | None = Field(..., description="the reviewer holding the claim")
    at: datetime = Field(..., description="when they claimed it (it lapses after the claim time)")


class DecisionOut(Schema):
    state: str
    answer: dict[str, Any] | None
    reason: str | None
    decided_by: str | None
    decided_at: datetime | None
    decided_by_rule: dict[str, Any] | None = Field(
        None, description="the rule that decided it ({id, name, version}), or null for a person"
    )


# A request's place in a team run's tree (RequestOut, OpenRequestOut).
_CHAIN = Field(
    default_factory=list,
    description="for a team run: the agents the request climbed through, top first"
    ' (["coordinator", "refunds", "refund"], from data.path); [] for a single agent',
)
_HANDLE = Field(
    None,
    description="for a team run: the asking agent's handle id (\"root/coordinator.1/"
    'refunds.1/refund.1"); null for a single agent',
)


class RequirementOut(Schema):
    """What a rule requires before the request is decided (two-person approval, a group)."""

    approvals_needed: int = Field(..., description="distinct approvals needed (1: one person)")
    approved_by: list[str] = Field(
        ..., description="who approved so far, in order (counted toward approvals_needed)"
    )
    group: str | None = Field(None, description="only members of this group decide")
    starter_may_not_approve: bool = Field(
        False, description="whoever started the run may not approve it"
    )
    routed_to: str | None = Field(
        None, description="where a route rule or a reassign escalation routed it"
    )
    escalated: bool = False


class RequestOut(Schema):
    request: dict[str, Any] = Field(..., description="the engine Request, in wire shape")
    run: int
    agent: str
    state: str
    created_at: datetime
    calls: list[CallOut]
    chain: list[str] = _CHAIN
    handle: str | None = _HANDLE
    claim: ClaimOut | None = Field(
        None, description="who is working on it (an active claim of a pending request), or null"
    )
    requirement: RequirementOut | None = Field(
        None, description="what a rule requires of its deciders, or null for one reviewer"
    )
    decision: DecisionOut | None


class OpenRequestOut(Schema):
    request: dict[str, Any]
    state: str
    calls: list[CallOut]
    chain: list[str] = _CHAIN
    handle: str | None = _HANDLE


class AgentOut(Schema):
    """One agent a team run started (a handle of the engine's runtime) and those it started."""

    handle: str = Field(..., description='the handle id, e.g. "root/coordinator.1/refunds.1"')
    agent: str
    status: str = Field(
        ...,
        description="waiting (on its own request or a sub-agent's), running, idle, or how it"
        " ended: done, incomplete, interrupted, closed, timeout, error",
    )
    turns: int = Field(..., description="its own model turns")
    tokens: int = Field(..., description="its own total tokens")
    children: list[AgentOut] = Field(default_factory=list)


class RunOut(Schema):
    id: int
    agent: str
    prompt: str
    status: str
    text: str
    error: str
    usage: dict[str, Any]
    turns: int
    attempts: int
    started_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    pending: OpenRequestOut | None
    agents: list[AgentOut] = Field(
        default_factory=list,
        description="for a team run: its tree of agents, top-level first; [] for a single agent",
    )


class RequestPage(Schema):
    items: list[RequestOut]
    count: int


class RunPage(Schema):
    items: list[RunOut]
    count: int


class ErrorOut(Schema):
    detail: str


class TokenOut(Schema):
    id: int
    name: str
    prefix: str = Field(..., description="the token's first characters (never the secret)")
    state: str = Field(..., description="active, expired or revoked")
    created_at: datetime
    expires_at: datetime | None = Field(..., description="null: never expires")
    last_used_at: datetime | None = Field(..., description="updated at most once a minute")
    revoked_at: datetime | None
    revoked_reason: str | None
    current: bool = Field(..., description="the token this request authenticated with")


class TokenPage(Schema):
    items: list[TokenOut]
    count: int


class ClaimIn(Strict):
    takeover: StrictBool = Field(
        False, description="take over another reviewer's active claim (else 409 naming them)"
    )


class SnoozeIn(Strict):
    until: datetime | None = Field(None, description="hide it from you until then (ISO 8601)")
    minutes: int | None = Field(
        None, ge=1, le=60 * 24 * 365, description="or: hide it from you for this many minutes"
    )


class HiddenOut(Schema):
    id: str = Field(..., description="the request id")
    hidden: bool
    until: datetime | None = Field(..., description="null: ignored until you un-hide it")


class BulkIn(Strict):
    ids: list[StrictStr] | None = Field(
        None, min_length=1, max_length=services.MAX_BULK_IDS, description="or: snapshot"
    )
    snapshot: StrictStr | None = Field(
        None,
        max_length=100_000,
        description="instead of ids: a token from POST /requests/snapshot (exactly its ids)",
    )
    action: StrictStr = Field(..., description="approve or decline")
    reason: StrictStr | None = Field(
        None, max_length=services.MAX_REASON_CHARS, description="for decline: one reason for all"
    )


class SnapshotIn(Strict):
    """The list's filters, as `GET /requests` takes them."""

    state: StrictStr | None = Field(
        "pending",
        description="pending, approved, answered, declined, expired, cancelled; empty for all",
    )
    agent: StrictStr | None = None
    kind: StrictStr | None = None
    q: StrictStr | None = Field(None, max_length=selectors.MAX_SEARCH_CHARS)
    sort: StrictStr | None = None
    claim: StrictStr | None = None
    overdue: bool = False
    hidden: StrictStr | None = None


class SnapshotOut(Schema):
    snapshot: str = Field(..., description="for POST /requests/bulk: exactly these ids")
    ids: list[str]
    count: int


class BulkResultOut(Schema):
    id: str
    status: str = Field(..., description="done, partial, already, invalid, forbidden or missing")
    message: str


class PartialApprovalOut(Schema):
    """An approval counted toward the distinct approvers a rule requires (202)."""

    id: str
    state: str = Field(..., description="pending: it waits for more approvers")
    message: str = Field(..., description='"1 of 2 approved: rita"')
    given: int
    needed: int
    approvers: list[str]


class BulkOut(Schema):
    results: list[BulkResultOut]


class TokenListFilter(Schema):
    state: str | None = Field(None, description="active, expired or revoked; empty for all")
    limit: int = Field(50, ge=1, le=200)
    offset: int = Field(0, ge=0, le=1_000_000_000)


ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    413: ErrorOut,
    429: ErrorOut,
    503: ErrorOut,
}
