"""The triage inbox's rows and pages, claims and lapses, and the ids a bulk decision takes."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.db.models import (
    Exists,
    Prefetch,
    QuerySet,
    Subquery,
)
from django.utils import timezone

from ..conf import app_settings
from ..models import ApprovalRequest, RequestHide
from .approvers import with_approval_progress
from .inbox_query import (
    INBOX_ROW_DEFERRED,
    MAX_BULK_IDS,
    InboxQuery,
    _active_claim_q,
    _all_of,
    _chip_conditions,
    _claim_cutoff,
    _inbox_base,
    _inbox_order,
    _query_conditions,
    _viewer_hides,
    _viewer_hides_q,
)
from .records import _calls_in_order

State = ApprovalRequest.State


def inbox_requests(
    query: InboxQuery,
    *,
    user_id: Any,
    hidden_agents: Collection[str] = (),
    now: Any = None,
) -> QuerySet[ApprovalRequest]:
    """The inbox's rows for one viewer: the query's filters, search and sort; the run, the
    decider and the claim holder joined, calls prefetched by position (a page is 2 queries,
    whatever the row count). Rows carry `viewer_hidden` (bool) and `hidden_until` (the
    viewer's snooze end; None when not hidden or ignored without an end)."""
    now = now or timezone.now()
    hides = _viewer_hides(user_id, now)
    qs = (
        inbox_matching(query, user_id=user_id, hidden_agents=hidden_agents, now=now)
        .annotate(hidden_until=Subquery(hides.values("until")[:1]))
        .select_related("run", "decided_by", "claimed_by")
        .prefetch_related(Prefetch("calls", queryset=_calls_in_order()))
    )
    # A row shows the run's prompt only: its transcript and the like stay unread.
    return qs.defer(*INBOX_ROW_DEFERRED).order_by(*_inbox_order(query.sort))


def inbox_matching(
    query: InboxQuery, *, user_id: Any, hidden_agents: Collection[str] = (), now: Any = None
) -> QuerySet[ApprovalRequest]:
    """The rows the query lists, from the request table alone (no joins, no order): its
    filters, search, claim and overdue filters and the viewer's snoozed / ignored ones."""
    now = now or timezone.now()
    own = _query_conditions(query, _chip_conditions(query, user_id=user_id, now=now))
    return (
        _inbox_base(query, hidden_agents=hidden_agents)
        .annotate(viewer_hidden=Exists(_viewer_hides(user_id, now)))
        .filter(_all_of(own.values()))
    )


def inbox_page(
    query: InboxQuery,
    *,
    user_id: Any,
    start: int,
    stop: int,
    hidden_agents: Collection[str] = (),
    now: Any = None,
) -> list[ApprovalRequest]:
    """Rows `start` to `stop` of what `inbox_requests` lists, in two steps of one statement:
    the page's keys are chosen from the request table alone (filters and sort), then only
    those rows are joined to their run, decider and claim holder, calls prefetched (2
    queries). In one step PostgreSQL joins every row a search finds before sorting them
    (bench/inbox_scale.py at 100k: a search with the deadline sort joined 1000 rows' runs
    for 21). The rows carry no `viewer_hidden` / `hidden_until`: the list does not show them.
    """
    order = _inbox_order(query.sort)
    matching = inbox_matching(query, user_id=user_id, hidden_agents=hidden_agents, now=now)
    keys = matching.order_by(*order).values("pk")[start:stop]
    rows = (
        with_approval_progress(ApprovalRequest.objects.filter(pk__in=keys))
        .select_related("run", "decided_by", "claimed_by")
        # A list, not a queryset per row (Django builds one per row otherwise): call_list().
        .prefetch_related(Prefetch("calls", queryset=_calls_in_order(), to_attr="listed_calls"))
        .defer(*INBOX_ROW_DEFERRED)
    )
    return list(rows.order_by(*order))


def has_hides(*, user_id: Any, now: Any = None) -> bool:
    """Whether the viewer snoozed (until later than `now`) or ignored any request (one
    query)."""
    return _viewer_hides_q(user_id, now or timezone.now()).exists()


def claim_lapses_at(row: ApprovalRequest) -> Any:
    """When the request's active claim lapses (None: no active claim, or claims never
    lapse). No query."""
    minutes = int(app_settings.CLAIM_MINUTES or 0)
    if minutes <= 0 or row.state != State.PENDING or not row.claimed_by_id or not row.claimed_at:
        return None
    return row.claimed_at + timedelta(minutes=minutes)


def next_lapse(
    *, user_id: Any, now: Any, claims: bool = False, hidden_agents: Collection[str] = ()
) -> Any:
    """The earliest moment after `now` at which a list of this viewer changes by itself
    (None: none known): one of their snoozes ends (one query over their own hides); with
    `claims` (a list that leaves claimed requests out: "unclaimed"), an active claim lapses
    too (one more). The inbox redraws its list then (the page schedules it: app.js)."""
    ends = [
        RequestHide.objects.filter(user_id=user_id, until__gt=now)
        .order_by("until")
        .values_list("until", flat=True)
        .first()
    ]
    cutoff = _claim_cutoff(now)
    if claims and cutoff is not None:
        taken = (
            ApprovalRequest.objects.filter(_active_claim_q(now))
            .exclude(agent__in=sorted(hidden_agents))
            .order_by("claimed_at")
            .values_list("claimed_at", flat=True)
            .first()
        )
        if taken is not None:
            ends.append(taken + (now - cutoff))
    found = [end for end in ends if end is not None]
    return min(found) if found else None


def request_ids_matching(
    query: InboxQuery,
    *,
    user_id: Any,
    hidden_agents: Collection[str] = (),
    limit: int = MAX_BULK_IDS,
    now: Any = None,
    upto: int | None = None,
) -> list[str]:
    """The request ids of every row the query matches ("select all matching"), in the
    query's order, at most `limit` (one query). With `upto` (the newest request pk the list
    matched when it was drawn: `inbox_counts`' "newest"), none newer: a request that
    arrived after the reviewer chose "all matching" is not theirs to decide unseen."""
    qs = inbox_matching(query, user_id=user_id, hidden_agents=hidden_agents, now=now)
    if upto is not None:
        qs = qs.filter(pk__lte=upto)
    qs = qs.order_by(*_inbox_order(query.sort))
    return list(qs.values_list("request_id", flat=True)[: max(0, int(limit))])


def count_matching_after(
    query: InboxQuery,
    *,
    user_id: Any,
    after: int,
    hidden_agents: Collection[str] = (),
    now: Any = None,
    cap: int = MAX_BULK_IDS,
) -> int:
    """How many rows the query matches that are newer than request pk `after` (those
    "all matching" left out), up to `cap` + 1 (one query)."""
    qs = inbox_matching(query, user_id=user_id, hidden_agents=hidden_agents, now=now)
    return qs.filter(pk__gt=after).order_by().values("pk")[: cap + 1].count()
