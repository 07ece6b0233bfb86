"""The JSON API for hosts (see the project's api.md). OpenAPI schema at /api/openapi.json.

Endpoints parse with pydantic schemas, call one selector or service, and return plain
dicts; domain exceptions become `{"detail": ...}` with the status the service chose.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth
from pydantic import ConfigDict, StrictBool, StrictStr

from . import selectors, services
from .domain.exceptions import ServiceError
from .domain.jsonvalues import strict_json_loads
from .models import ApprovalRequest, Run


class BearerToken(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        user = services.api_token_authenticate(token)
        if user is not None:
            request.user = user
        return user


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
    description="Start agent runs, and answer or decline the requests they halt on.",
    auth=[BearerToken(), BrowserSession()],
    urls_namespace="api",
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
        None, description="edited arguments (validated against the tool's schema)"
    )
    output: StrictStr | None = Field(
        None, description="the typed output, for a relay call without an executor or a question"
    )
    calls: dict[str, CallDecisionIn] | None = Field(
        None, description="per-call decisions for a request carrying several relay calls"
    )


class DeclineIn(Strict):
    reason: StrictStr | None = Field(
        None, max_length=services.MAX_REASON_CHARS, description='empty or absent means "declined"'
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


ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    413: ErrorOut,
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
    return api.create_response(request, {"detail": str(exc)}, status=exc.status)


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


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return api.create_response(
        request,
        {"detail": "authentication required: a session or an Authorization: Bearer token"},
        status=401,
    )


def _can_view(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise services.NotAllowed("you do not have permission to view this")


# -- runs ----------------------------------------------------------------------------------


@api.post("/runs", response={201: RunOut, **ERRORS}, tags=["runs"], summary="Start a run")
def start_run(request, payload: RunIn):
    run = services.run_start(agent=payload.agent, prompt=payload.prompt, started_by=request.user)
    return Status(201, selectors.run_view(selectors.run_get(run_id=run.pk)))


@api.get(
    "/runs", response={200: RunPage, **ERRORS}, tags=["runs"], summary="List runs, newest first"
)
def list_runs(request, filters: Query[RunListFilter]):
    _can_view(request, "approvals.view_run")
    qs = selectors.run_list(status=filters.status or None, agent=filters.agent or None)
    page = qs[filters.offset : filters.offset + filters.limit]
    return {"items": [selectors.run_view(r) for r in page], "count": qs.count()}


@api.get("/runs/{run_id}", response={200: RunOut, **ERRORS}, tags=["runs"], summary="Read a run")
def get_run(request, run_id: int):
    _can_view(request, "approvals.view_run")
    return selectors.run_view(selectors.run_get(run_id=run_id))


@api.get(
    "/runs/{run_id}/messages",
    response={200: list[dict[str, Any]], **ERRORS},
    tags=["runs"],
    summary="The run's transcript, as stored",
)
def get_run_messages(request, run_id: int):
    _can_view(request, "approvals.view_run")
    return Run.objects.only("messages").get(pk=run_id).messages


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
    _can_view(request, "approvals.view_approvalrequest")
    if filters.state and filters.state not in STATES:
        raise services.InvalidInput(f"state: must be one of {', '.join(sorted(STATES))}")
    qs = selectors.request_list(
        state=filters.state or None, agent=filters.agent or None, kind=filters.kind or None
    )
    page = qs[filters.offset : filters.offset + filters.limit]
    return {"items": [selectors.request_view(r) for r in page], "count": qs.count()}


@api.get(
    "/requests/{request_id}",
    response={200: RequestOut, **ERRORS},
    tags=["requests"],
    summary="Read a request",
)
def get_request(request, request_id: str):
    _can_view(request, "approvals.view_approvalrequest")
    return selectors.request_view(selectors.request_get(request_id=request_id))


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
