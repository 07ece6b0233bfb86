"""What each page shows, from the rows: the inbox (filters, one page of cards) and a run's
body. Views, live pushes and websocket snapshots render the same contexts."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.context_processors import PermWrapper
from django.core.paginator import Paginator
from django.urls import reverse

from .. import agents, selectors
from ..models import ApprovalRequest, Run
from ..permissions import agents_visible_to, can_decide_request, hidden_agents
from .cards import KIND_LABELS, mcp_call_servers, request_card
from .timeline import timeline

PAGE_SIZE = 20
KINDS = list(KIND_LABELS.items())


def inbox_filters(params) -> dict[str, str]:
    state = params.get("state") or "pending"
    if state != "all" and state not in ApprovalRequest.State.values:
        state = "pending"
    # NUL never names an agent or kind, and PostgreSQL refuses it in a query.
    return {
        "agent": params.get("agent", "").replace("\x00", "")[:100],
        "kind": params.get("kind", "").replace("\x00", "")[:50],
        "state": state,
    }


def inbox_context(user, filters: dict[str, str], page_number) -> dict:
    qs = selectors.request_list(
        state=None if filters["state"] == "all" else filters["state"],
        agent=filters["agent"] or None,
        kind=filters["kind"] or None,
        hidden_agents=hidden_agents(user),  # per-agent access: not listed, not counted
    )
    page = Paginator(qs, PAGE_SIZE).get_page(page_number)
    filter_query = urlencode({k: v for k, v in filters.items() if v})
    return {
        "nav": "inbox",
        "filters": filters,
        "page": page,
        "count": page.paginator.count,
        "cards": [request_card(row, can_decide=can_decide_request(user, row)) for row in page],
        "agent_names": agents_visible_to(user, [a.name for a in agents.all()]),
        "kinds": KINDS,
        "states": ApprovalRequest.State.choices,
        "filter_query": filter_query,
        "live_query": urlencode({**{k: v for k, v in filters.items() if v}, "page": page.number}),
        "next_url": f"{reverse('approvals:inbox')}?{filter_query}",
        "perms": PermWrapper(user),
    }


def run_context_for(
    run: Run, *, can_decide: bool, viewer=None, open_can_decide: bool | None = None
) -> dict:
    """`can_decide`: the run's reviewer actions (cancel, retry). The open request's card may
    differ (the starter rule): `open_can_decide` says so, or `viewer` has it asked of
    `can_decide_request`; with neither it follows `can_decide`."""
    decide = can_decide
    requests = list(
        run.requests.select_related("decided_by")
        .prefetch_related("calls")
        .order_by("created_at", "id")
    )
    # MCP tools are journaled under "<server> · <tool>": which server each call went to.
    journaled = list(
        run.executions.filter(tool_name__contains=agents.MCP_LABEL_SEPARATOR).values_list(
            "call_id", "tool_name"
        )
    )
    open_row = next((r for r in requests if r.state == ApprovalRequest.State.PENDING), None)
    if open_can_decide is None:
        open_can_decide = (
            can_decide_request(viewer, open_row) if viewer is not None and open_row else decide
        )
    return {
        "nav": "runs",
        "run": run,
        "can_decide": decide,
        "entries": timeline(run.messages, requests, mcp_call_servers(requests, journaled)),
        "open_card": request_card(open_row, can_decide=open_can_decide) if open_row else None,
        "next_url": reverse("approvals:run-detail", args=[run.pk]),
    }
