"""Requests: list (the inbox's filters), read, answer, approve, decline; claims, snooze and
ignore; bulk decisions and the snapshot of "all matching"."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from ninja import Query, Status

from .. import permissions, selectors, services, snapshots
from ..models import ApprovalRequest
from .core import api, require_view
from .schemas import (
    ERRORS,
    AnswerIn,
    ApproveIn,
    BulkIn,
    BulkOut,
    ClaimIn,
    DeclineIn,
    HiddenOut,
    PartialApprovalOut,
    RequestFilter,
    RequestOut,
    RequestPage,
    SnapshotIn,
    SnapshotOut,
    SnoozeIn,
)

# -- requests ------------------------------------------------------------------------------

STATES = set(ApprovalRequest.State.values)


@api.get(
    "/requests",
    response={200: RequestPage, **ERRORS},
    tags=["requests"],
    summary="List requests, newest first",
)
def list_requests(request, filters: Query[RequestFilter]):
    hidden = require_view(request, permissions.VIEW_REQUESTS)
    query = _inbox_query(filters)
    page = selectors.inbox_page(
        query,
        user_id=request.user.pk,
        hidden_agents=hidden,
        start=filters.offset,
        stop=filters.offset + filters.limit,
    )
    count = selectors.inbox_matching_count(query, user_id=request.user.pk, hidden_agents=hidden)
    return {"items": [selectors.request_view(r) for r in page], "count": count}


def _inbox_query(filters: Any) -> selectors.InboxQuery:
    """The list's filters (`RequestFilter`, `SnapshotIn`) as the inbox's query; an unknown
    value is 400 naming it."""
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
    return selectors.InboxQuery(
        state=filters.state or "all",
        agent=filters.agent or "",
        kind=filters.kind or "",
        q=" ".join((filters.q or "").split()),
        claim=filters.claim or "",
        overdue=filters.overdue,
        hidden=filters.hidden or "",
        sort=filters.sort or "newest",
    )


@api.post(
    "/requests/snapshot",
    response={200: SnapshotOut, **ERRORS},
    tags=["requests"],
    summary="Take the ids a list's filters match now, for one bulk decision",
    description="The ids of every request these filters (as `GET /requests` reads them)"
    " match for you now, in the list's order (at most 500), and a signed `snapshot` token of"
    " them: `POST /requests/bulk` with `snapshot` instead of `ids` decides exactly those,"
    " never a request that matches later (a claim released, a request un-hidden, a new"
    " one). The token is yours alone and lasts a day; each request is still checked when"
    " it is decided.",
)
def snapshot_requests(request, payload: SnapshotIn):
    require_view(request, permissions.VIEW_REQUESTS)
    taken = snapshots.take(_inbox_query(payload), user=request.user)
    return {"snapshot": taken.token, "ids": taken.ids, "count": len(taken.ids)}


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
    " card); `partial` (an approval counted toward the distinct approvers a rule requires:"
    ' "1 of 2 approved: rita"); `forbidden`; `missing` (unknown, or not visible to you).',
)
def bulk_requests(request, payload: BulkIn):
    if (payload.ids is None) == (payload.snapshot is None):
        raise services.InvalidInput("ids: give ids or snapshot (one of them)")
    ids = payload.ids
    if payload.snapshot is not None:
        try:
            ids = snapshots.read(payload.snapshot, user=request.user)
        except snapshots.StaleSnapshot:
            raise services.InvalidInput(
                "snapshot: not a snapshot you took (POST /requests/snapshot) in the last day"
            ) from None
    results = services.requests_bulk(
        request_ids=ids,
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
    hidden = require_view(request, permissions.VIEW_REQUESTS)
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
    response={200: RequestOut, 202: PartialApprovalOut, **ERRORS},
    tags=["requests"],
    summary="Approve, optionally with edited input or a typed output",
    description="202 when a rule requires several distinct approvers and this approval is"
    ' not the last: "1 of 2 approved: rita"; the request stays pending.',
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
        always_allow=payload.always_allow,
    )
    partial = getattr(row, "partial_approval", None)
    if partial is not None:
        return Status(
            202,
            {
                "id": row.request_id,
                "state": row.state,
                "message": partial.message,
                "given": partial.given,
                "needed": partial.needed,
                "approvers": list(partial.approvers),
            },
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
