"""Reads: querysets shaped for each page and endpoint (constant query counts), and the
plain-dict views of rows the API returns.

Every read of runs and requests takes `hidden_agents`: the agents the viewer may not see,
from `permissions.hidden_agents(user)` (the caller asks; selectors do not know users). A row
of a hidden agent is left out of lists and counts, and does not exist for a get (404)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from .domain.arguments import diff
from .domain.exceptions import InvalidInput
from .models import ApiToken, ApprovalRequest, Event, RequestCall, Run

State = ApprovalRequest.State


def request_list(
    *,
    state: str | None = "pending",
    agent: str | None = None,
    kind: str | None = None,
    hidden_agents: Collection[str] = (),
) -> QuerySet[ApprovalRequest]:
    qs = ApprovalRequest.objects.select_related("run", "decided_by").prefetch_related(
        Prefetch("calls", queryset=RequestCall.objects.order_by("position"))
    )
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    if state:
        qs = qs.filter(state=state)
    if agent:
        qs = qs.filter(agent=agent)
    if kind:
        qs = qs.filter(kind=kind)
    return qs.order_by("-created_at", "-id")


def request_get(*, request_id: str, hidden_agents: Collection[str] = ()) -> ApprovalRequest:
    return request_list(state=None, hidden_agents=hidden_agents).get(request_id=request_id)


def _runs_with_open_request() -> QuerySet[Run]:
    open_requests = ApprovalRequest.objects.filter(state=State.PENDING).prefetch_related("calls")
    return Run.objects.select_related("started_by").prefetch_related(
        Prefetch("requests", queryset=open_requests, to_attr="open_requests")
    )


def run_get(*, run_id: int, hidden_agents: Collection[str] = ()) -> Run:
    qs = _runs_with_open_request()
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    return qs.get(pk=run_id)


def run_list(
    *, status: str | None = None, agent: str | None = None, hidden_agents: Collection[str] = ()
) -> QuerySet[Run]:
    qs = _runs_with_open_request()
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    if status:
        qs = qs.filter(status=status)
    if agent:
        qs = qs.filter(agent=agent)
    return qs.order_by("-created_at", "-id")


def request_history(*, row: ApprovalRequest) -> QuerySet[Event]:
    """The audit events of one request, and the run's events that name it (halt, resume)."""
    return (
        Event.objects.filter(run_id=row.run_id)
        .filter(Q(request_id=row.pk) | Q(detail__request_id=row.request_id))
        .select_related("actor")
        .order_by("created_at", "id")
    )


def run_messages(*, run_id: int, hidden_agents: Collection[str] = ()) -> list[Any]:
    """A run's transcript as stored (the API's /messages)."""
    qs = Run.objects.only("messages", "agent")
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    return qs.get(pk=run_id).messages


def run_page(*, run_id: int, hidden_agents: Collection[str] = ()) -> Run:
    """The run for its page (its starter joined)."""
    qs = Run.objects.select_related("started_by")
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    return qs.get(pk=run_id)


def run_page_list(*, hidden_agents: Collection[str] = ()) -> QuerySet[Run]:
    """The runs page: newest first, starters joined."""
    qs = Run.objects.select_related("started_by")
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    return qs.order_by("-created_at", "-id")


def run_events(*, run_id: int) -> QuerySet[Event]:
    return (
        Event.objects.filter(run_id=run_id)
        .select_related("actor", "request")
        .order_by("created_at", "id")
    )


TOKEN_STATES = ("active", "expired", "revoked")


def token_list(*, user: Any, state: str | None = None) -> QuerySet[ApiToken]:
    """The user's own tokens, newest first, optionally only "active", "expired" or
    "revoked" ones (the API never shows a secret: only hashes are stored)."""
    qs = ApiToken.objects.filter(user=user).order_by("-created_at", "-id")
    if not state:
        return qs
    if state not in TOKEN_STATES:
        raise InvalidInput(f"state: must be one of {', '.join(TOKEN_STATES)}")
    now = timezone.now()
    if state == "revoked":
        return qs.filter(revoked_at__isnull=False)
    qs = qs.filter(revoked_at__isnull=True)
    if state == "expired":
        return qs.filter(expires_at__lte=now)
    return qs.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))


# -- plain views for the API ---------------------------------------------------------------


def _username(user: Any) -> str | None:
    return user.get_username() if user is not None else None


def call_view(call: RequestCall) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "name": call.tool_name,
        "input": call.input,
        "arguments": call.arguments,
        "decision": call.decision or None,
        "edited_input": call.edited_input,
        "changes": diff(call.input or {}, call.edited_input)
        if call.edited_input is not None
        else [],
        "output": call.output,
        "is_error": call.is_error,
        "reason": call.reason or None,
    }


def token_view(row: ApiToken, *, now: Any, current_id: Any = None) -> dict[str, Any]:
    """An API token as its owner sees it: never the secret (only its hash is stored)."""
    return {
        "id": row.pk,
        "name": row.name,
        "prefix": row.prefix,
        "state": row.state_at(now),
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "last_used_at": row.last_used_at,
        "revoked_at": row.revoked_at,
        "revoked_reason": row.revoked_reason or None,
        "current": row.pk == current_id,
    }


def request_view(row: ApprovalRequest) -> dict[str, Any]:
    decided = row.state != State.PENDING
    return {
        "request": row.wire,
        "run": row.run_id,
        "agent": row.agent,
        "state": row.state,
        "created_at": row.created_at,
        "calls": [call_view(c) for c in row.calls.all()],
        "decision": {
            "state": row.state,
            "answer": row.answer,
            "reason": row.reason or None,
            "decided_by": _username(row.decided_by),
            "decided_at": row.decided_at,
        }
        if decided
        else None,
    }


def run_view(run: Run) -> dict[str, Any]:
    open_requests = getattr(run, "open_requests", None)
    if open_requests is None:
        open_requests = list(run.requests.filter(state=State.PENDING).prefetch_related("calls"))
    pending = open_requests[0] if open_requests else None
    return {
        "id": run.pk,
        "agent": run.agent,
        "prompt": run.prompt,
        "status": run.status,
        "text": run.text,
        "error": run.error,
        "usage": run.usage,
        "turns": run.turns,
        "attempts": run.attempts,
        "started_by": _username(run.started_by),
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "pending": request_view_light(pending) if pending is not None else None,
    }


def request_view_light(row: ApprovalRequest) -> dict[str, Any]:
    """A run's open request, without the run field repeated."""
    return {
        "request": row.wire,
        "state": row.state,
        "calls": [call_view(c) for c in row.calls.all()],
    }
