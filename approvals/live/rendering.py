"""The HTML of live pages, from the same template partials the views render.

A change is rendered when a page that shows it receives its message, at most once per change
and variant in a process (`FRAGMENTS`): the first page to ask renders it in a thread, every
other page of the process awaits that same result on the event loop, with no thread hop and
no query. A burst of changes nobody watches costs no rendering at all, and a hundred open
inboxes cost one rendering of a new card and one count, not a hundred.

Fragments are rendered without a request, so they carry no CSRF token: every form in them
posts through htmx (hx-post, or hx-boost for plain forms), which sends the token the page
holds in `<body hx-headers>`. Nothing is ever substituted into rendered HTML.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from .. import selectors
from ..models import ApprovalRequest, Run
from ..presenters.cards import request_card, request_row
from ..presenters.pages import bulk_all_label, list_context, page_counts, run_context_for

# The CSRF tag renders nothing for this value (and warns about nothing): see the docstring.
NO_REQUEST = {"csrf_token": "NOTPROVIDED"}


class FragmentCache:
    """What recent changes rendered, per event loop: one computation per key, shared by
    every page that asks while it runs or after. Keys name a change (each change has its
    own), so an entry never goes stale; only the latest `size` keys are kept."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._by_loop: weakref.WeakKeyDictionary[Any, OrderedDict[str, asyncio.Future]] = (
            weakref.WeakKeyDictionary()
        )

    async def get(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute` (sync: it reads the database) runs once per key, in a thread."""
        loop = asyncio.get_running_loop()
        entries = self._by_loop.setdefault(loop, OrderedDict())
        future = entries.get(key)
        if future is not None:
            return await asyncio.shield(future)
        future = loop.create_future()
        entries[key] = future
        while len(entries) > self.size:
            entries.popitem(last=False)
        try:
            # Not in the one thread-sensitive thread every consumer of the process shares: a
            # rendering there would hold up the others. Any pool thread will do (its own
            # connection, closed when stale).
            result = await database_sync_to_async(compute, thread_sensitive=False)()
            future.set_result(result)
        except BaseException as exc:
            entries.pop(key, None)  # the next page asks again
            future.set_exception(exc)
            future.exception()  # retrieved: the pages waiting on it re-raise it themselves
            raise
        return future.result()


# The process's fragments (a registry of renderings, keyed by change).
FRAGMENTS = FragmentCache()


def _request_row(request_pk: int) -> ApprovalRequest | None:
    return (
        selectors.with_approval_progress(ApprovalRequest.objects.filter(pk=request_pk))
        .select_related("run", "decided_by", "claimed_by")
        .prefetch_related("calls")
        .first()
    )


def visible_row(request_id: str, rights) -> ApprovalRequest | None:
    """A request by its id, if the viewer (`rights`) may see its agent."""
    row = (
        ApprovalRequest.objects.filter(request_id=request_id)
        .select_related("run", "decided_by", "claimed_by")
        .prefetch_related("calls")
        .first()
    )
    return row if row is not None and rights.can_view(row.agent) else None


def card_html(
    row: ApprovalRequest, *, can_decide: bool, oob: bool = False, can_allow_always: bool = False
) -> str:
    return render_to_string(
        "approvals/inbox.html#request-card",
        {
            "card": request_card(row, can_decide=can_decide, can_allow_always=can_allow_always),
            "card_oob": oob,
            "next_url": "/",
            **NO_REQUEST,
        },
    )


def changed_card(
    request_pk: int, *, can_decide: bool, oob: bool, can_allow_always: bool = False
) -> str:
    """A changed request's card as it is now ("" when the request is gone). A decided card
    has no decision forms: deciders and watchers get the same one."""
    row = _request_row(request_pk)
    if row is None:
        return ""
    decide = can_decide and row.state == ApprovalRequest.State.PENDING
    return card_html(row, can_decide=decide, oob=oob, can_allow_always=can_allow_always)


async def card_for_change(
    request_pk: int, *, change: str, can_decide: bool, oob: bool, can_allow_always: bool = False
) -> str:
    allow = can_decide and can_allow_always
    key = f"card:{request_pk}:{change}:{can_decide:d}{oob:d}{allow:d}"
    return await FRAGMENTS.get(
        key,
        lambda: changed_card(request_pk, can_decide=can_decide, oob=oob, can_allow_always=allow),
    )


def run_gone() -> str:
    """The run page's live region for a run that does not exist (any more)."""
    return render_to_string("approvals/_live.html#run-gone")


def run_body(run_id: int, *, can_decide: bool, open_can_decide: bool | None = None) -> str:
    """The run page's live region, out of band (`can_decide`: the run's own actions;
    `open_can_decide`: its open request's card, when that differs)."""
    open_decide = can_decide if open_can_decide is None else open_can_decide
    run = selectors.run_row(run_id)  # its starter is read with its requests
    if run is None:
        return run_gone()
    return render_to_string(
        "approvals/run_detail.html#run-body",
        {
            **run_context_for(run, can_decide=can_decide, open_can_decide=open_decide),
            "body_oob": True,
            **NO_REQUEST,
        },
    )


async def run_body_for_change(
    run_id: int, *, change: str, can_decide: bool, open_can_decide: bool
) -> str:
    key = f"run:{run_id}:{change}:{can_decide:d}{open_can_decide:d}"
    return await FRAGMENTS.get(
        key, lambda: run_body(run_id, can_decide=can_decide, open_can_decide=open_can_decide)
    )


def run_head(run_id: int, *, can_decide: bool) -> str:
    """The run page's status line alone, out of band: for a change of the run's status that
    touched neither its transcript nor its requests (`status_only`), a fraction of
    `run_body`'s cost (one query, the transcript not read)."""
    run = (
        Run.objects.filter(pk=run_id)
        .select_related("started_by")
        .defer("messages", "prompt", "system_prompt", "text")
        .first()
    )
    if run is None:
        return run_gone()
    return render_to_string(
        "approvals/run_detail.html#run-head",
        {"run": run, "can_decide": can_decide, "head_oob": True, **NO_REQUEST},
    )


async def run_head_for_change(run_id: int, *, change: str, can_decide: bool) -> str:
    key = f"run-head:{run_id}:{change}:{can_decide:d}"
    return await FRAGMENTS.get(key, lambda: run_head(run_id, can_decide=can_decide))


def live_reply(text: str, *, done: bool, agent: str = "") -> str:
    """The run page's entry of the model's reply as it is generated (no query); in a team
    run, named by the agent replying."""
    return render_to_string(
        "approvals/run_detail.html#live-reply", {"text": text, "done": done, "agent": agent}
    )


def request_list(user, params: dict[str, str], page: int | str | None) -> str:
    """The inbox's list for one viewer, out of band (a page's snapshot on (re)connect), with
    its chips (their counts) and the selected request's card when `params` names one."""
    context = list_context(user, params, page)
    return render_to_string(
        "approvals/inbox.html#list-update",
        {**context, "user": user, "list_oob": True, **NO_REQUEST},
    )


def viewer_hides(user_id) -> bool:
    """Whether the viewer snoozed (until later than now) or ignored any request."""
    return selectors.has_hides(user_id=user_id)


def pending_count(hidden: frozenset[str] = frozenset()) -> int:
    """Pending requests of the agents a viewer sees (`hidden`: the others), up to the cap."""
    return selectors.pending_count(hidden_agents=hidden)


async def count_for_change(*, change: str, hidden: frozenset[str] = frozenset()) -> int:
    key = f"pending:{change}:{','.join(sorted(hidden))}"
    return await FRAGMENTS.get(key, lambda: pending_count(hidden))


def list_counts(user, params: dict[str, str]) -> dict:
    """A viewer's counts now (two queries, capped; `pages.page_counts` without the next
    lapse): the list's (`count`) with "all N matching", the title's (`pending`), the chips'
    (`chips`, their counts labelled) and the menus' (`menus`)."""
    return page_counts(user, params, lapse=False)


def pending_count_html(count: int, pending: int | None = None, state: str = "pending") -> str:
    return _pending_count_html(count, pending, state, selectors.count_cap())


# The frames below depend on their arguments alone (no query, nothing per viewer beyond
# them; a count's label on the cap too): a change reaching a hundred open inboxes of a
# process renders each variant once.
@functools.lru_cache(maxsize=64)
def _pending_count_html(count: int, pending: int | None, state: str, cap: int) -> str:
    return render_to_string(
        "approvals/inbox.html#request-count",
        {
            "count": count,
            "pending": count if pending is None else pending,
            "filters": {"state": state},
            "count_oob": True,
            "bulk_all_label": bulk_all_label(count),
        },
    )


def chip_counts_html(chips: list[dict], menus: dict | None = None) -> str:
    """The chips' counts, out of band: only the counts, the chips' links stay (and keep the
    keyboard's focus); with `menus`, the filter menus' counts too (each option's text)."""
    html = render_to_string("approvals/inbox.html#chip-counts", {"chips": chips})
    if menus:
        html += render_to_string("approvals/inbox.html#menu-counts", {"menus": menus})
    return html


def counts_html(counts: dict) -> str:
    """A filtered list's counts in one frame (`list_counts`): every count its page shows
    (`counts-update`: the list's with "all N matching", the title's, the chips', the
    menus')."""
    return render_to_string("approvals/inbox.html#counts-update", counts)


def row_html(request_pk: int, *, filter_query: str, oob: bool) -> str:
    """A request's row in the inbox list ("" when the request is gone). The same for every
    viewer of a list with these filters (the page marks its selected row itself)."""
    row = _request_row(request_pk)
    if row is None:
        return ""
    return render_to_string(
        "approvals/inbox.html#request-row",
        {"item": request_row(row), "row_oob": oob, "filter_query": filter_query, "selected_id": ""},
    )


async def row_for_change(request_pk: int, *, change: str, filter_query: str, oob: bool) -> str:
    key = f"row:{request_pk}:{change}:{oob:d}:{filter_query}"
    return await FRAGMENTS.get(
        key, lambda: row_html(request_pk, filter_query=filter_query, oob=oob)
    )


def matches_query(request_pk: int, user_id, params: dict[str, str], hidden) -> bool:
    """Whether a viewer's list (its search, hidden-only filter) shows this request now."""
    query = selectors.InboxQuery.from_params(params)
    return (
        selectors.inbox_matching(query, user_id=user_id, hidden_agents=hidden)
        .filter(pk=request_pk)
        .exists()
    )


def inbox_update(
    *, row: str = "", card: str = "", prepend: bool = False, drop: str = "", toast=None
) -> str:
    """A change's frame for an inbox: the detail pane's card (first, as rendered: only the
    page showing that request gets it, so it is not kept), its row, the row to drop, the
    toast (a dict of text, level, about)."""
    frame = _inbox_update(row, prepend, drop, tuple(sorted((toast or {}).items())))
    return mark_safe(card + frame) if card else frame  # both rendered from templates


@functools.lru_cache(maxsize=256)
def _inbox_update(row: str, prepend: bool, drop: str, toast: tuple) -> str:
    return render_to_string(
        "approvals/_live.html#inbox-update",
        {"row": row, "prepend": prepend, "drop": drop, "toast": dict(toast)},
    )


def presence_html(request_pk: int, names: list[str]) -> str:
    return render_to_string(
        "approvals/_live.html#presence", {"request_pk": request_pk, "names": names}
    )


def toast_html(text: str, about: str = "") -> str:
    """A toast on its own (an escalation's notice to the people it names)."""
    toast = {"text": text, "level": "warning", "role": "alert", "about": about}
    return render_to_string("approvals/_live.html#toast", {"toast": toast})
