"""Reads of runs, requests, their history and tokens, and the plain-dict views the API returns."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.db.models import (
    Prefetch,
    Q,
    QuerySet,
)
from django.utils import timezone

from ..domain import statements
from ..domain.arguments import diff
from ..domain.exceptions import InvalidInput
from ..domain.records import MCP_SERVER_TOLD
from ..domain.teams import agent_tree, chain_of, handle_of
from ..models import ApiToken, ApprovalRequest, Event, RequestCall, Run
from .approvers import requirement_view
from .inbox_query import _claim_cutoff
from .rules import rule_decision_view

State = ApprovalRequest.State


def _calls_in_order() -> QuerySet[RequestCall]:
    return RequestCall.objects.order_by("position")


def request_list(
    *,
    state: str | None = "pending",
    agent: str | None = None,
    kind: str | None = None,
    hidden_agents: Collection[str] = (),
) -> QuerySet[ApprovalRequest]:
    qs = ApprovalRequest.objects.select_related("run", "decided_by", "claimed_by").prefetch_related(
        Prefetch("calls", queryset=_calls_in_order())
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


def mcp_servers_told(run: Run) -> dict[int, dict[str, Any]]:
    """What each MCP server was told of its question when the run would not resume, by the
    request's pk: the `mcp_server_told` events' detail (server, told, output, is_error)."""
    found = Event.objects.filter(run_id=run.pk, action=MCP_SERVER_TOLD, request_id__isnull=False)
    return {
        pk: dict(detail or {})
        for pk, detail in found.order_by("id").values_list("request_id", "detail")
    }


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


# A live run page is rendered again at each change of its run (a decision, a claim, the
# outcome), so its reads are the statements module's, built once per shape: compiling the
# ORM's versions took longer than the database took to run them (bench/decision_latency.py
# --profile: a fifth of a server's CPU went to live run pages, most of it to compiling).


def run_row(run_id: int) -> Run | None:
    """A run as stored, or None (its starter is read with its requests: `run_requests`)."""
    found = statements.select(Run, {"pk": run_id})
    return found[0] if found else None


def run_requests(run: Run) -> list[ApprovalRequest]:
    """The run's requests, oldest first, each with its calls by position (`call_list()`), its
    decider and the run itself; the run's starter is read with the deciders, unless the run
    came with it."""
    requests = statements.select(ApprovalRequest, {"run_id": run.pk}, order_by=("created_at", "id"))
    by_pk = {r.pk: r for r in requests}
    calls: dict[int, list[RequestCall]] = {pk: [] for pk in by_pk}
    listed = statements.select(
        RequestCall, {"request_id__in": list(by_pk)}, order_by=("request_id", "position")
    )
    for call in listed:
        call.request = by_pk[call.request_id]
        calls[call.request_id].append(call)
    starter = [] if Run.started_by.is_cached(run) else [run.started_by_id]
    users = _users_by_id({*starter, *(r.decided_by_id for r in requests)})
    if starter:
        run.started_by = users.get(run.started_by_id)
    for row in requests:
        row.run = run
        row.decided_by = users.get(row.decided_by_id)
        row.listed_calls = calls[row.pk]
    return requests


def _users_by_id(ids: Collection[Any]) -> dict[Any, Any]:
    from django.contrib.auth import get_user_model

    User = get_user_model()
    wanted = sorted(i for i in ids if i is not None)
    if User._meta.parents:  # a user model inheriting another's table: the ORM joins them
        return User._base_manager.in_bulk(wanted) if wanted else {}
    return {u.pk: u for u in statements.select(User, {"pk__in": wanted})}


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


def requirement_out(row: ApprovalRequest) -> dict[str, Any] | None:
    """What a rule requires of the request's deciders, and the approvals counted so far
    (None: no rule set any; no query then)."""
    view = requirement_view(row)
    if view is None:
        return None
    return {
        "approvals_needed": view.needed,
        "approved_by": list(view.approvers),
        "group": view.group,
        "starter_may_not_approve": view.starter_may_not_approve,
        "routed_to": view.routed_to,
        "escalated": view.escalated,
    }


def request_view(row: ApprovalRequest) -> dict[str, Any]:
    decided = row.state != State.PENDING
    return {
        "request": row.wire,
        "run": row.run_id,
        "agent": row.agent,
        "state": row.state,
        "created_at": row.created_at,
        "calls": [call_view(c) for c in row.call_list()],
        **chain_view(row),
        "claim": claim_view(row),
        "requirement": requirement_out(row),
        "decision": {
            "state": row.state,
            "answer": row.answer,
            "reason": row.reason or None,
            "decided_by": _username(row.decided_by),
            "decided_at": row.decided_at,
            "decided_by_rule": rule_decision_view(row),
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
        "agents": agent_tree(run.team_state),
    }


def request_view_light(row: ApprovalRequest) -> dict[str, Any]:
    """A run's open request, without the run field repeated."""
    return {
        "request": row.wire,
        "state": row.state,
        "calls": [call_view(c) for c in row.calls.all()],
        **chain_view(row),
    }


def chain_view(row: ApprovalRequest) -> dict[str, Any]:
    """Where a team run's request came from: the agents it climbed through, top first
    (["coordinator", "refunds", "refund"]), and the asking handle; [] and None for a single
    agent's request."""
    return {"chain": chain_of(row.data), "handle": handle_of(row.data) or None}


def active_claim(row: ApprovalRequest, *, now: Any = None) -> Any:
    """Who holds an active claim on this request (a user), or None: decided requests and
    lapsed claims have none. No query when `claimed_by` was joined (inbox_requests)."""
    if row.state != State.PENDING or row.claimed_by_id is None or row.claimed_at is None:
        return None
    cutoff = _claim_cutoff(now or timezone.now())
    if cutoff is not None and row.claimed_at <= cutoff:
        return None
    return row.claimed_by


def claim_view(row: ApprovalRequest, *, now: Any = None) -> dict[str, Any] | None:
    """The API's `claim`: the active claim's holder and when it was taken, or None."""
    holder = active_claim(row, now=now)
    if holder is None:
        return None
    return {"by": _username(holder), "at": row.claimed_at}
