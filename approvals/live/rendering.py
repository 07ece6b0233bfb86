"""The HTML of live pages, from the same template partials the views render.

A change is rendered when a page that shows it receives its message, at most once per change
and variant in a process (`_once`): a burst of changes nobody watches costs no rendering at
all, and a hundred open inboxes cost one rendering of a new card, not a hundred.

Fragments are rendered without a request, so they carry no CSRF token: every form in them
posts through htmx (hx-post, or hx-boost for plain forms), which sends the token the page
holds in `<body hx-headers>`. Nothing is ever substituted into rendered HTML.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.core.cache import cache
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from .. import selectors
from ..models import ApprovalRequest, Run
from ..presenters.cards import request_card
from ..presenters.pages import inbox_context, run_context_for

# The CSRF tag renders nothing for this value (and warns about nothing): see the docstring.
NO_REQUEST = {"csrf_token": "NOTPROVIDED"}
CACHE_SECONDS = 60  # a change's fragments are wanted within moments of it, or never
# One rendering at a time per process: the second page asking for the same fragment finds
# it in the cache instead of rendering it again (rendering holds the GIL anyway).
_rendering = threading.Lock()


def _once(key: str, render: Callable[[], str]) -> str:
    with _rendering:
        html = cache.get(key)
        if html is None:
            html = str(render())
            cache.set(key, html, CACHE_SECONDS)
    return mark_safe(html)  # our own templates, autoescaped


def _request_row(request_pk: int) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.filter(pk=request_pk)
        .select_related("run", "decided_by")
        .prefetch_related("calls")
        .first()
    )


def card_html(row: ApprovalRequest, *, can_decide: bool, oob: bool = False) -> str:
    return render_to_string(
        "approvals/inbox.html#request-card",
        {
            "card": request_card(row, can_decide=can_decide),
            "card_oob": oob,
            "next_url": "/",
            **NO_REQUEST,
        },
    )


def changed_card(request_pk: int, *, change: str, can_decide: bool, oob: bool) -> str:
    """A changed request's card as of `change` ("" when the request is gone). A decided card
    has no decision forms: one rendering serves deciders and watchers alike."""

    def render() -> str:
        row = _request_row(request_pk)
        if row is None:
            return ""
        decide = can_decide and row.state == ApprovalRequest.State.PENDING
        return card_html(row, can_decide=decide, oob=oob)

    return _once(f"toolnexus:live:card:{request_pk}:{change}:{can_decide:d}{oob:d}", render)


def pending_count(*, change: str, hidden: frozenset[str] = frozenset()) -> int:
    """Pending requests as of `change`, of the agents a viewer sees (`hidden`: the others)."""

    def count() -> str:
        return str(selectors.request_list(state="pending", hidden_agents=hidden).count())

    scope = ",".join(sorted(hidden))
    return int(_once(f"toolnexus:live:pending:{change}:{scope}", count))


def run_body(
    run_id: int, *, can_decide: bool, open_can_decide: bool | None = None, change: str | None = None
) -> str:
    """The run page's live region, out of band (`can_decide`: the run's own actions;
    `open_can_decide`: its open request's card, when that differs; `change`: cache it for that
    change, None for a page's own snapshot)."""
    open_decide = can_decide if open_can_decide is None else open_can_decide

    def render() -> str:
        run = Run.objects.filter(pk=run_id).select_related("started_by").first()
        if run is None:
            return render_to_string("approvals/_live.html#run-gone")
        return render_to_string(
            "approvals/run_detail.html#run-body",
            {
                **run_context_for(run, can_decide=can_decide, open_can_decide=open_decide),
                "body_oob": True,
                **NO_REQUEST,
            },
        )

    if change is None:
        return mark_safe(render())
    return _once(f"toolnexus:live:run:{run_id}:{change}:{can_decide:d}{open_decide:d}", render)


def request_list(user, filters: dict[str, str], page: int | str | None) -> str:
    """The inbox's list for one viewer, out of band (a page's snapshot on (re)connect)."""
    return render_to_string(
        "approvals/inbox.html#request-list",
        {**inbox_context(user, filters, page), "list_oob": True, **NO_REQUEST},
    )


def inbox_update(**context) -> str:
    return render_to_string("approvals/_live.html#inbox-update", context)


def pending_count_html(count: int) -> str:
    return render_to_string(
        "approvals/inbox.html#request-count",
        {"count": count, "filters": {"state": "pending"}, "count_oob": True},
    )
