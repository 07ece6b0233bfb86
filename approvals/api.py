"""The JSON API for hosts (see the project's api.md). Mounted by `approvals.urls` under
`api/` (the demo project: /api/), OpenAPI schema at `<mount>api/openapi.json`; its URL
namespace is `approvals:toolnexus_api`. Every answer is JSON, errors included (500s too
when DEBUG is off; unknown URLs under the mount are 404 JSON, see approvals/urls.py).

Endpoints parse with pydantic schemas, call one selector or service, and return plain
dicts; domain exceptions become `{"detail": ...}` with the status the service chose.

Throttles (django-ninja's, counted in the cache; docs/operations.md, "Security settings"):
requests per token and per user, and failed bearer authentications per client address,
each 429 with Retry-After once over its rate. Reads leave out runs and requests of agents
the caller may not see (`permissions.hidden_agents`).
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, Throttled, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth
from ninja.throttling import SimpleRateThrottle
from pydantic import ConfigDict, StrictBool, StrictStr

from . import permissions, selectors, services
from .conf import app_settings
from .domain.exceptions import ServiceError
from .domain.jsonvalues import strict_json_loads
from .models import ApprovalRequest

# -- throttles -----------------------------------------------------------------------------


class SettingRateThrottle(SimpleRateThrottle):
    """django-ninja's cache-backed throttle, its rate read from a setting on every request
    (so a deployment, or a test, changes it without re-creating the API); an empty rate
    turns it off. Client addresses come from `permissions.client_ip` (proxy-aware only for
    TOOLNEXUS_TRUSTED_PROXIES; a client cannot pick its own through X-Forwarded-For)."""

    setting = ""  # the name in approvals.conf (TOOLNEXUS_ + this in settings)

    def __init__(self) -> None:  # the rate is read per request, not once
        self.rate = None

    def _configure(self) -> bool:
        self.rate = (getattr(app_settings, self.setting) if self.setting else "") or None
        if self.rate is None:
            return False
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return True

    def allow_request(self, request: HttpRequest) -> bool:
        if not self._configure():
            return True
        return super().allow_request(request)

    def get_ident(self, request: HttpRequest) -> str:
        return permissions.client_ip(request) or "unknown"


class TokenRateThrottle(SettingRateThrottle):
    """Requests per bearer token (TOOLNEXUS_API_TOKEN_RATE); sessions are not counted here."""

    scope = "token"
    setting = "API_TOKEN_RATE"

    def get_cache_key(self, request: HttpRequest) -> str | None:
        token = getattr(request, "api_token", None)
        if token is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.key_hash[:32]}


class UserRateThrottle(SettingRateThrottle):
    """Requests per user, every token and the browser session together
    (TOOLNEXUS_API_USER_RATE)."""

    scope = "user"
    setting = "API_USER_RATE"

    def get_cache_key(self, request: HttpRequest) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": user.pk}


class AuthFailureThrottle(SettingRateThrottle):
    """Failed bearer authentications per client address (TOOLNEXUS_API_AUTH_FAILURE_RATE):
    only failures count; once over the rate every bearer attempt from that address is 429
    until the oldest failure ages out, a right token too (else the answer would tell a guess
    that hit)."""

    scope = "bearer_failure"
    setting = "API_AUTH_FAILURE_RATE"

    def get_cache_key(self, request: HttpRequest) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def blocked_for(self, request: HttpRequest) -> float | None:
        """Seconds until this address may try again, or None if it may now."""
        if not self._configure():
            return None
        history = self._history(request)
        if len(history) < self.num_requests:
            return None
        return max(0.0, self.duration - (self.timer() - history[-1]))

    def note_failure(self, request: HttpRequest) -> None:
        if not self._configure():
            return
        history = [self.timer(), *self._history(request)][: self.num_requests]
        self.cache.set(self.get_cache_key(request), history, self.duration)

    def _history(self, request: HttpRequest) -> list[float]:
        now = self.timer()
        return [
            t for t in self.cache.get(self.get_cache_key(request), []) if t > now - self.duration
        ]


class TooManyFailures(Throttled):
    detail = "too many failed authentications from your address"


AUTH_FAILURES = AuthFailureThrottle()


class BearerToken(HttpBearer):
    """`Authorization: Bearer <token>`. A token that does not authenticate is 401 saying
    why (unknown, expired, revoked, its account inactive), never a fall-back to the
    session; an address with too many such failures is 429 for a while."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        wait = AUTH_FAILURES.blocked_for(request)
        if wait is not None:
            raise TooManyFailures(wait=wait)
        try:
            row = services.api_token_verify(token)
        except services.TokenRejected:
            AUTH_FAILURES.note_failure(request)
            raise
        request.user = row.user
        request.api_token = row
        return row.user


class BrowserSession(SessionAuth):
    """The browser's session; CSRF is checked only once we know who is asking, so an
    anonymous caller gets 401 (authenticate first), not a confusing CSRF 403."""

    def _get_key(self, request: HttpRequest) -> str | None:
        if not request.user.is_authenticated:
            return None
        return super()._get_key(request)


class StrictJSONParser(Parser):
    def parse_body(self, request: HttpRequest):
        return strict_json_loads(request.body)


log = logging.getLogger(__name__)

api = NinjaAPI(
    title="toolnexus-web API",
    parser=StrictJSONParser(),
    version="1",
    description=(
        "Start agent runs, and answer or decline the requests they halt on.\n\n"
        "Authenticate with the browser session (CSRF-protected) or `Authorization: Bearer"
        " <token>` (`manage.py api_token <username>`; tokens expire, see `expires_at`, and"
        " can be listed and revoked under `/api/tokens`). A token that does not authenticate"
        " is 401 with a `detail` saying why (not valid, expired, revoked). Requests are"
        " throttled per token, per user and, for failed bearer authentication, per client"
        " address, and starting runs per user per minute: over a limit the answer is 429"
        " with a `Retry-After` header (seconds). Runs and requests of agents your groups may"
        " not see are left out of lists and are 404."
    ),
    auth=[BearerToken(), BrowserSession()],
    throttle=[TokenRateThrottle(), UserRateThrottle()],
    # Nested in the app's namespace: never "api", which a host project may use itself.
    urls_namespace="approvals:toolnexus_api",
)


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
        None, description="mine or unclaimed (active claims only); empty for any"
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


class RequestOut(Schema):
    request: dict[str, Any] = Field(..., description="the engine Request, in wire shape")
    run: int
    agent: str
    state: str
    created_at: datetime
    calls: list[CallOut]
    claim: ClaimOut | None = Field(
        None, description="who is working on it (an active claim of a pending request), or null"
    )
    decision: DecisionOut | None


class OpenRequestOut(Schema):
    request: dict[str, Any]
    state: str
    calls: list[CallOut]


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
    ids: list[StrictStr] = Field(..., min_length=1, max_length=services.MAX_BULK_IDS)
    action: StrictStr = Field(..., description="approve or decline")
    reason: StrictStr | None = Field(
        None, max_length=services.MAX_REASON_CHARS, description="for decline: one reason for all"
    )


class BulkResultOut(Schema):
    id: str
    status: str = Field(..., description="done, already, invalid, forbidden or missing")
    message: str


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


# -- error mapping -------------------------------------------------------------------------


def _field_path(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body", "payload", "query", "filters")]
    return ".".join(parts) or "body"


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    first = exc.errors[0] if exc.errors else {}
    where = _field_path(first.get("loc", ()))
    message = first.get("msg", "invalid input")
    if first.get("type") == "extra_forbidden":
        message = "is not an accepted field"
    more = f" (and {len(exc.errors) - 1} more problem(s))" if len(exc.errors) > 1 else ""
    return api.create_response(request, {"detail": f"{where}: {message}{more}"}, status=400)


@api.exception_handler(ServiceError)
def _service_error(request, exc: ServiceError):
    response = api.create_response(request, {"detail": str(exc)}, status=exc.status)
    if getattr(exc, "retry_after", None):
        response["Retry-After"] = str(exc.retry_after)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return response


@api.exception_handler(Throttled)
def _throttled(request, exc: Throttled):
    wait = max(1, math.ceil(exc.wait)) if exc.wait is not None else 60
    what = getattr(exc, "detail", "too many requests")
    response = api.create_response(
        request, {"detail": f"{what}: try again in {wait} s"}, status=429
    )
    response["Retry-After"] = str(wait)
    return response


@api.exception_handler(ObjectDoesNotExist)
def _not_found(request, exc):
    return api.create_response(request, {"detail": "not found"}, status=404)


@api.exception_handler(DatabaseError)
def _database_unavailable(request, exc):
    # Nothing was half-written: the transaction rolled back, so the caller may retry.
    log.exception("database error on %s", request.path)
    detail = "the database is unavailable right now; nothing was changed, try again"
    return api.create_response(request, {"detail": detail}, status=503)


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return api.create_response(request, {"detail": "request body too large"}, status=413)


@api.exception_handler(Exception)
def _server_error(request, exc: Exception):
    # With DEBUG on, Django's debug page shows the traceback; otherwise clients get JSON
    # (whatever the host project's handler500 renders) and the log gets the traceback.
    if settings.DEBUG:
        raise exc
    log.error("server error on %s", request.path, exc_info=exc)
    return api.create_response(request, {"detail": "Internal server error"}, status=500)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return api.create_response(
        request,
        {"detail": "authentication required: a session or an Authorization: Bearer token"},
        status=401,
    )


def _can_view(request: HttpRequest, permission: str) -> frozenset[str]:
    """The global view permission, then the agents this caller may not see."""
    if not request.user.has_perm(permission):
        raise services.NotAllowed("you do not have permission to view this")
    return permissions.hidden_agents(request.user)


# -- runs ----------------------------------------------------------------------------------


@api.post("/runs", response={201: RunOut, **ERRORS}, tags=["runs"], summary="Start a run")
def start_run(request, payload: RunIn):
    run = services.run_start(
        agent=payload.agent, prompt=payload.prompt, started_by=request.user, rate_limited=True
    )
    return Status(201, selectors.run_view(selectors.run_get(run_id=run.pk)))


@api.get(
    "/runs", response={200: RunPage, **ERRORS}, tags=["runs"], summary="List runs, newest first"
)
def list_runs(request, filters: Query[RunListFilter]):
    hidden = _can_view(request, permissions.VIEW_RUNS)
    qs = selectors.run_list(
        status=filters.status or None, agent=filters.agent or None, hidden_agents=hidden
    )
    page = qs[filters.offset : filters.offset + filters.limit]
    return {"items": [selectors.run_view(r) for r in page], "count": qs.count()}


@api.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, tags=["runs"], summary="Read a run")
def get_run(request, run_id: int):
    hidden = _can_view(request, permissions.VIEW_RUNS)
    return selectors.run_view(selectors.run_get(run_id=run_id, hidden_agents=hidden))


@api.get(
    "/runs/{run_id}/messages",
    response={200: list[dict[str, Any]], **ERRORS},
    tags=["runs"],
    summary="The run's transcript, as stored",
)
def get_run_messages(request, run_id: int):
    hidden = _can_view(request, permissions.VIEW_RUNS)
    return selectors.run_messages(run_id=run_id, hidden_agents=hidden)


@api.post(
    "/runs/{run_id}/retry",
    response={200: RunOut, **ERRORS},
    tags=["runs"],
    summary="Queue a failed run again",
)
def retry_run(request, run_id: int):
    services.run_retry(run_id=run_id, user=request.user)
    return selectors.run_view(selectors.run_get(run_id=run_id))


@api.post(
    "/runs/{run_id}/cancel",
    response={200: RunOut, **ERRORS},
    tags=["runs"],
    summary="Stop a run and cancel its open request",
)
def cancel_run(request, run_id: int, payload: DeclineIn | None = None):
    services.run_cancel(
        run_id=run_id, user=request.user, reason=(payload.reason if payload else "") or ""
    )
    return selectors.run_view(selectors.run_get(run_id=run_id))


# -- requests ------------------------------------------------------------------------------

STATES = set(ApprovalRequest.State.values)


@api.get(
    "/requests",
    response={200: RequestPage, **ERRORS},
    tags=["requests"],
    summary="List requests, newest first",
)
def list_requests(request, filters: Query[RequestFilter]):
    hidden = _can_view(request, permissions.VIEW_REQUESTS)
    if filters.state and filters.state not in STATES:
        raise services.InvalidInput(f"state: must be one of {', '.join(sorted(STATES))}")
    for name, accepted in (
        ("sort", selectors.INBOX_SORTS),
        ("claim", selectors.INBOX_CLAIMS),
        ("hidden", selectors.INBOX_HIDDEN),
    ):
        value = getattr(filters, name) or ""
        if value and value not in accepted:
            shown = ", ".join(a for a in accepted if a)
            raise services.InvalidInput(f"{name}: must be one of {shown}")
    for name in ("agent", "kind", "q"):
        if "\x00" in (getattr(filters, name) or ""):
            raise services.InvalidInput(f"{name}: must not contain NUL")
    query = selectors.InboxQuery(
        state=filters.state or "all",
        agent=filters.agent or "",
        kind=filters.kind or "",
        q=" ".join((filters.q or "").split()),
        claim=filters.claim or "",
        overdue=filters.overdue,
        hidden=filters.hidden or "",
        sort=filters.sort or "newest",
    )
    page = selectors.inbox_page(
        query,
        user_id=request.user.pk,
        hidden_agents=hidden,
        start=filters.offset,
        stop=filters.offset + filters.limit,
    )
    count = selectors.inbox_matching_count(query, user_id=request.user.pk, hidden_agents=hidden)
    return {"items": [selectors.request_view(r) for r in page], "count": count}


# Before /requests/{request_id}: Django resolves paths in order, and "bulk" is no id.
@api.post(
    "/requests/bulk",
    response={200: BulkOut, **ERRORS},
    tags=["requests"],
    summary="Approve or decline many requests (at most 500), each on its own",
    description="Each request is decided by itself, exactly as its own approve or decline"
    " would: one that cannot be decided does not stop the others. Each result's `status`:"
    " `done`; `already` (decided first by someone else: the message says who and when);"
    " `invalid` (bulk approve takes only approval-gated calls and relay turns whose every"
    " call runs on the host; questions, inputs, MCP questions, calls needing a typed"
    " result and approvals whose prompt says they cannot be undone are decided on their"
    " card); `forbidden`; `missing` (unknown, or not visible to you).",
)
def bulk_requests(request, payload: BulkIn):
    results = services.requests_bulk(
        request_ids=payload.ids,
        user=request.user,
        action=payload.action,
        reason=payload.reason or "",
    )
    return {"results": [r.as_dict() for r in results]}


@api.get(
    "/requests/{request_id}",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary="Read a request",
)
def get_request(request, request_id: str):
    hidden = _can_view(request, permissions.VIEW_REQUESTS)
    return selectors.request_view(
        selectors.request_get(request_id=request_id, hidden_agents=hidden)
    )


def _decided(row) -> dict[str, Any]:
    """The decided request as the service left it (its fields are current; only its calls
    are read again)."""
    return selectors.request_view(row)


@api.post(
    "/requests/{request_id}/answer",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary="Answer with an Answer in wire shape",
)
def answer_request(request, request_id: str, payload: AnswerIn):
    wire = {"id": payload.id, "ok": payload.ok, "data": payload.data, "reason": payload.reason}
    return _decided(services.request_answer(request_id=request_id, user=request.user, answer=wire))


@api.post(
    "/requests/{request_id}/approve",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary="Approve, optionally with edited input or a typed output",
)
def approve_request(request, request_id: str, payload: ApproveIn):
    calls = (
        {cid: c.model_dump() for cid, c in payload.calls.items()}
        if payload.calls is not None
        else None
    )
    row = services.request_approve(
        request_id=request_id,
        user=request.user,
        input=payload.input,
        output=payload.output,
        calls=calls,
    )
    return _decided(row)


@api.post(
    "/requests/{request_id}/decline",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary='Decline with a reason (default "declined")',
)
def decline_request(request, request_id: str, payload: DeclineIn):
    row = services.request_decline(request_id=request_id, user=request.user, reason=payload.reason)
    return _decided(row)


# -- triage: claims, snooze / ignore, bulk decisions ---------------------------------------


def _claimed(request_id: str, hidden: frozenset[str]) -> dict[str, Any]:
    return selectors.request_view(
        selectors.request_get(request_id=request_id, hidden_agents=hidden)
    )


@api.post(
    "/requests/{request_id}/claim",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary="Claim a pending request: tell other reviewers you are on it",
    description="The claim lapses after TOOLNEXUS_CLAIM_MINUTES (30 by default; claiming"
    " again restarts it). Another reviewer's active claim is 409 naming them, unless"
    ' `{"takeover": true}`. Claims do not stop anyone from deciding.',
)
def claim_request(request, request_id: str, payload: ClaimIn):
    services.request_claim(request_id=request_id, user=request.user, takeover=payload.takeover)
    return _claimed(request_id, permissions.hidden_agents(request.user))


@api.post(
    "/requests/{request_id}/release",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary="Release your claim",
    description="Only your own claim (another reviewer's is 409); nothing claimed: no change.",
)
def release_request(request, request_id: str):
    services.request_release(request_id=request_id, user=request.user)
    return _claimed(request_id, permissions.hidden_agents(request.user))


def _hidden_out(request_id: str, hide: Any) -> dict[str, Any]:
    if hide is None:
        return {"id": request_id, "hidden": False, "until": None}
    return {"id": request_id, "hidden": True, "until": hide.until}


@api.post(
    "/requests/{request_id}/snooze",
    response={200: HiddenOut, **ERRORS},
    tags=["requests"],
    summary="Hide a request from your inbox until a time",
    description='`{"until": "<ISO 8601 with a time zone>"}` or `{"minutes": n}`. Only your'
    " own inbox changes; list it with `hidden=only`.",
)
def snooze_request(request, request_id: str, payload: SnoozeIn):
    if (payload.until is None) == (payload.minutes is None):
        raise services.InvalidInput("until: give until or minutes (one of them)")
    until = payload.until
    if payload.minutes is not None:
        until = timezone.now() + timedelta(minutes=payload.minutes)
    hide = services.request_hide(request_id=request_id, user=request.user, until=until)
    return _hidden_out(request_id, hide)


@api.post(
    "/requests/{request_id}/ignore",
    response={200: HiddenOut, **ERRORS},
    tags=["requests"],
    summary="Hide a request from your inbox until you un-hide it",
)
def ignore_request(request, request_id: str):
    hide = services.request_hide(request_id=request_id, user=request.user, until=None)
    return _hidden_out(request_id, hide)


@api.post(
    "/requests/{request_id}/unhide",
    response={200: HiddenOut, **ERRORS},
    tags=["requests"],
    summary="Show a snoozed or ignored request in your inbox again",
)
def unhide_request(request, request_id: str):
    services.request_unhide(request_id=request_id, user=request.user)
    return _hidden_out(request_id, None)


# -- API tokens: one's own -----------------------------------------------------------------


@api.get(
    "/tokens",
    response={200: TokenPage, **ERRORS},
    tags=["tokens"],
    summary="List your own API tokens, newest first",
    description="Never shows a token's secret (only a hash is stored): tell tokens apart by"
    " `prefix` and `name`. `current` marks the token this request authenticated with.",
)
def list_tokens(request, filters: Query[TokenListFilter]):
    qs = selectors.token_list(user=request.user, state=filters.state or None)
    now = timezone.now()
    current = getattr(getattr(request, "api_token", None), "pk", None)
    page = qs[filters.offset : filters.offset + filters.limit]
    return {
        "items": [selectors.token_view(r, now=now, current_id=current) for r in page],
        "count": qs.count(),
    }


@api.post(
    "/tokens/{token_id}/revoke",
    response={200: TokenOut, **ERRORS},
    tags=["tokens"],
    summary="Revoke one of your own API tokens",
    description="The token stops working at once (401 'revoked'). Revoking a revoked token"
    " changes nothing; another user's token is 404. Revoking the token this request used is"
    " allowed: the answer is the last one it gets.",
)
def revoke_token(request, token_id: int):
    row = services.api_token_revoke(token_id=token_id, user=request.user)
    current = getattr(getattr(request, "api_token", None), "pk", None)
    return selectors.token_view(row, now=timezone.now(), current_id=current)
