"""Reads: querysets shaped for each page and endpoint (constant query counts), and the
plain-dict views of rows the API returns."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, Q, QuerySet

from .domain.arguments import diff
from .models import ApprovalRequest, Event, RequestCall, Run

State = ApprovalRequest.State


def request_list(
    *, state: str | None = "pending", agent: str | None = None, kind: str | None = None
) -> QuerySet[ApprovalRequest]:
    qs = ApprovalRequest.objects.select_related("run", "decided_by").prefetch_related(
        Prefetch("calls", queryset=RequestCall.objects.order_by("position"))
    )
    if state:
        qs = qs.filter(state=state)
    if agent:
        qs = qs.filter(agent=agent)
    if kind:
        qs = qs.filter(kind=kind)
    return qs.order_by("-created_at", "-id")


def request_get(*, request_id: str) -> ApprovalRequest:
    return request_list(state=None).get(request_id=request_id)


def _runs_with_open_request() -> QuerySet[Run]:
    open_requests = ApprovalRequest.objects.filter(state=State.PENDING).prefetch_related("calls")
    return Run.objects.select_related("started_by").prefetch_related(
        Prefetch("requests", queryset=open_requests, to_attr="open_requests")
    )


def run_get(*, run_id: int) -> Run:
    return _runs_with_open_request().get(pk=run_id)


def run_list(*, status: str | None = None, agent: str | None = None) -> QuerySet[Run]:
    qs = _runs_with_open_request()
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


def run_events(*, run_id: int) -> QuerySet[Event]:
    return (
        Event.objects.filter(run_id=run_id)
        .select_related("actor", "request")
        .order_by("created_at", "id")
    )


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
