"""What each page shows, from the rows: the inbox (filters, one page of compact rows, the
selected request in a detail pane) and a run's body. Views, live pushes and websocket
snapshots render the same contexts."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib.auth.context_processors import PermWrapper
from django.core.paginator import Paginator
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from .. import agents, selectors, services
from ..models import ApprovalRequest, RequestHide, Run
from ..permissions import agents_visible_to, can_decide_request, hidden_agents
from .cards import (
    KIND_LABELS,
    mcp_call_servers,
    mcp_server_of,
    request_card,
    request_row,
    seconds_until,
)
from .history import history
from .team import team_tree
from .timeline import timeline

PAGE_SIZE = 20
KINDS = list(KIND_LABELS.items())
SORTS = [("newest", "newest first"), ("oldest", "oldest first"), ("deadline", "soonest deadline")]
# The chips above the list: (label, parameter, value, the count's key in inbox_counts).
CHIPS = [
    ("claimed by me", "claim", "mine", "mine"),
    ("unclaimed", "claim", "unclaimed", "unclaimed"),
    ("routed to me", "claim", "routed", "routed"),
    ("overdue", "overdue", "1", "overdue"),
    ("snoozed / ignored", "hidden", "only", "hidden"),
]
MAX_REQUEST_ID = 64


def inbox_query(params) -> selectors.InboxQuery:
    return selectors.InboxQuery.from_params(params)


def inbox_filters(params) -> dict[str, str]:
    """The inbox's filters as URL parameters (only those that differ from the defaults)."""
    return inbox_query(params).as_params()


def selected_id(params) -> str:
    value = str(params.get("r", "") or "").replace("\x00", "").strip()
    return value if len(value) <= MAX_REQUEST_ID else ""


def list_url(params: dict[str, str]) -> str:
    """The inbox's URL with these parameters."""
    return _url(params)


def _url(params: dict[str, str]) -> str:
    query = urlencode(params)
    return reverse("approvals:inbox") + (f"?{query}" if query else "")


def chips(query: selectors.InboxQuery, counts: dict[str, int]) -> list[dict]:
    """The filter chips: each a link that toggles it (page and selection dropped)."""
    params = query.as_params()
    out = []
    for label, name, value, key in CHIPS:
        active = params.get(name) == value
        toggled = {k: v for k, v in params.items() if k != name}
        if not active:
            toggled[name] = value
        out.append(
            {
                "label": label,
                "name": name,
                "value": value,
                "count": selectors.count_label(counts.get(key, 0)),
                "active": active,
                "url": _url(toggled),
            }
        )
    return out


# Past the count cap a page number is not checked against a count: a larger one only reads
# an empty page (and is kept below what an OFFSET can hold).
MAX_PAGE_NUMBER = 10**7


@dataclass(frozen=True)
class InboxPage:
    """One page of the inbox's rows, and where the pager may go from it. `num_pages` is 0
    when the rows were not counted (past the cap); `last_page` is set on a page past the
    end: the last page that has rows (0: none has)."""

    rows: list
    number: int
    has_next: bool
    num_pages: int = 0
    last_page: int = 0

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def has_other_pages(self) -> bool:
        return self.has_previous or self.has_next

    @property
    def previous_page_number(self) -> int:
        return self.number - 1

    @property
    def next_page_number(self) -> int:
        return self.number + 1

    @property
    def past_end(self) -> bool:
        """A page after the last one (a URL's page number, or rows decided meanwhile)."""
        return not self.rows and self.number > 1


def _page_number(page_number) -> int:
    try:
        return min(max(1, int(page_number or 1)), MAX_PAGE_NUMBER)
    except (TypeError, ValueError, OverflowError):
        return 1


class _PageRows:
    """The inbox's rows as Paginator slices them: each slice is one `selectors.inbox_page`."""

    ordered = True

    def __init__(self, fetch) -> None:
        self.fetch = fetch

    def __getitem__(self, window: slice) -> list:
        return self.fetch(window.start or 0, window.stop)


def _page(matching, fetch, counted: int, page_number) -> tuple[InboxPage, bool]:
    """One page of the rows (`fetch(start, stop)`), and whether the count was capped (see
    selectors.inbox_counts; `matching()`: the rows' queryset, read only past the end).
    Counted already: no COUNT query for a page. Within the cap the count numbers the pages
    (a number past the end reads the last page). Past it every page with rows stays
    reachable: PAGE_SIZE + 1 rows are read (the same query), and Next is offered only when
    that one more row exists. A page past the end says so, and which page is the last: one
    COUNT that stops at the rows before this page (no more than the page's OFFSET read)."""
    if counted <= selectors.count_cap():
        paginator = Paginator(_PageRows(fetch), PAGE_SIZE)
        paginator.__dict__["count"] = counted
        page = paginator.get_page(page_number)
        found = InboxPage(
            rows=list(page.object_list),
            number=page.number,
            has_next=page.has_next(),
            num_pages=paginator.num_pages,
        )
        return found, False
    number = _page_number(page_number)
    start = (number - 1) * PAGE_SIZE
    fetched = fetch(start, start + PAGE_SIZE + 1)
    rows = fetched[:PAGE_SIZE]
    last_page = 0
    if not rows and number > 1:
        before = matching().order_by().values("pk")[:start].count()
        last_page = -(-before // PAGE_SIZE)  # rounded up
    return InboxPage(rows, number, len(fetched) > PAGE_SIZE, last_page=last_page), True


def bulk_all_label(count: int) -> str:
    """The bulk bar's "all matching" choice: the count as the page shows it ("1000+" past
    the cap) and, when one bulk decision handles fewer (services.MAX_BULK_IDS, in the list's
    order) or may, how many."""
    limit = services.MAX_BULK_IDS
    label = f"all {selectors.count_label(count)} matching"
    if count > limit:
        return f"{label} (the first {limit})"
    if count > selectors.count_cap():  # more than a cap below the limit: how many, unknown
        return f"{label} (at most {limit})"
    return label


# A filter value the inbox does not know, and what it shows instead.
_FALLBACKS = {
    "state": "pending requests",
    "claim": "every request",
    "hidden": "requests you did not hide",
    "sort": "newest first",
}


def filter_notices(params, query: selectors.InboxQuery, agent_names: list[str]) -> list[str]:
    """What the URL asked that the inbox could not do, in words: an unknown state, claim,
    hidden or sort value is replaced by the default; an unknown agent or kind matches
    nothing (a link that shows nothing says why)."""
    notices = []
    for name, fallback in _FALLBACKS.items():
        asked = selectors.param_text(params, name)
        if asked and asked != getattr(query, name):
            notices.append(f"Unknown {name} “{asked[:40]}”: showing {fallback}.")
    if query.agent and query.agent not in agent_names:
        notices.append(f"No agent named “{query.agent[:40]}” that you can see.")
    if query.kind and query.kind not in KIND_LABELS:
        notices.append(f"Unknown kind “{query.kind[:40]}”: nothing is of that kind.")
    return notices


def menu_options(agent_names: list[str]) -> dict[str, list[tuple[str, str]]]:
    """The filter menus' options, (value, label), in the order they show: "all" first for
    agent and kind, last for state."""
    return {
        "agent": [("", "all"), *((name, name) for name in agent_names)],
        "kind": [("", "all"), *KINDS],
        "state": [*ApprovalRequest.State.choices, ("all", "all")],
    }


def menus(query: selectors.InboxQuery, options: dict, counts: dict[str, dict[str, int]]) -> dict:
    """Each filter menu's options with the number of rows the list shows when it is chosen
    (the query's other filters kept), capped as the chips are: "refund (12)", "(1000+)".
    `dom_id` names the option for the counts a list update swaps in (`menu-counts`)."""
    out = {}
    for menu, choices in options.items():
        chosen = getattr(query, menu)
        out[menu] = [
            {
                "value": value,
                "label": f"{label} ({selectors.count_label(counts[menu].get(value, 0))})",
                "selected": value == chosen,
                "dom_id": f"filter-{menu}-{value.encode().hex() or 'any'}",
            }
            for value, label in choices
        ]
    return out


def counts_context(
    user, params, *, now=None, agent_names: list[str] | None = None, newest: bool = False
) -> dict:
    """The inbox's counts for one viewer (two queries): the list's, the page title's (pending,
    less what the viewer snoozed or ignored) and the chips'; with `agent_names` (the agent
    menu's) the filter menus' too, in the same two queries (three for a search that finds
    more than the cap: `menus`, selectors.inbox_counts). Live count pushes ask
    without: they update the list's count and the chips', the menus' follow with the list.
    With `newest`, the bulk bar's cutoff as well (`bulk_upto`: see selectors.inbox_counts)."""
    query = inbox_query(params)
    options = menu_options(agent_names) if agent_names is not None else {}
    counts = selectors.inbox_counts(
        query,
        user_id=user.pk,
        hidden_agents=hidden_agents(user),
        now=now or timezone.now(),
        options={menu: [value for value, _ in pairs] for menu, pairs in options.items()} or None,
        newest=newest,
    )
    extra = {"bulk_upto": counts["newest"]} if newest else {}
    return {
        **extra,
        "query": query,
        "filters": {**query.as_params(), "state": query.state},
        "counts": counts,
        "chips": chips(query, counts),
        "menus": menus(query, options, counts["options"]) if options else {},
        "count": counts["matching"],
        "pending": counts["waiting"],
        # Beside the count it must agree with: both change together (`request-count`).
        "bulk_all_label": bulk_all_label(counts["matching"]),
    }


def lapse_in(user, query: selectors.InboxQuery, now) -> float | None:
    """Seconds until this viewer's list changes by itself (a snooze of theirs ends; on an
    "unclaimed" list, a claim lapses), or None: the page redraws its list then. The rows
    say when their own claims lapse (`RequestRow.lapse_in`)."""
    at = selectors.next_lapse(
        user_id=user.pk,
        now=now,
        claims=query.claim == "unclaimed",
        hidden_agents=hidden_agents(user),
    )
    return seconds_until(at, now)


def page_counts(user, params, *, lapse: bool = True) -> dict:
    """Every count of an inbox page with these filters, as its list would show them: the
    list's, the title's, the chips', the menus', "all N matching", and when the list next
    changes by itself (for an htmx answer that changed them: a snooze, a claim)."""
    now = timezone.now()
    agent_names = agents_visible_to(user, [a.name for a in agents.all()])
    counted = counts_context(user, params, now=now, agent_names=agent_names)
    return {**counted, "lapse_in": lapse_in(user, counted["query"], now) if lapse else None}


def list_context(user, params, page_number=None, *, now=None) -> dict:
    """The inbox list: filters (their menus' counts), chip counts, one page of rows (4
    queries: the counts' two, the page's rows and their calls; the menu counts of a search
    that finds more than the cap, one more; a page past the end of a list counted past the
    cap, one more, for which page is the last: see `_page`)."""
    now = now or timezone.now()
    agent_names = agents_visible_to(user, [a.name for a in agents.all()])
    # The bulk bar's cutoff (`bulk_upto`) is read with the counts, before the rows: a row that
    # arrives in between is listed but not taken by "all matching" (never the other way).
    counted = counts_context(user, params, now=now, agent_names=agent_names, newest=True)
    query = counted["query"]
    hidden = hidden_agents(user)  # per-agent access: not listed, not counted
    reads = {"user_id": user.pk, "hidden_agents": hidden, "now": now}

    def fetch(start: int, stop: int) -> list[ApprovalRequest]:
        return selectors.inbox_page(query, start=start, stop=stop, **reads)

    page, capped = _page(
        lambda: selectors.inbox_matching(query, **reads), fetch, counted["count"], page_number
    )
    filters = query.as_params()
    filter_query = urlencode(filters)
    selected = selected_id(params)
    return {
        **counted,
        "bulk_drawn": now.isoformat(),  # "all matching" takes what matched at this moment
        "notices": filter_notices(params, query, agent_names),
        "nav": "inbox",
        "page": page,
        "count_capped": capped,
        "lapse_in": lapse_in(user, query, now),
        "rows": [request_row(row, now=now) for row in page],
        "selected_id": selected,
        "agent_names": agent_names,
        "kinds": KINDS,
        "states": ApprovalRequest.State.choices,
        "sorts": SORTS,
        "filter_query": filter_query,
        "list_url": _url(filters),
        # A search that matches nothing offers the list without it (the other filters kept).
        "clear_search_url": _url({k: v for k, v in filters.items() if k != "q"}),
        "live_query": urlencode(
            {**filters, "page": page.number, **({"r": selected} if selected else {})}
        ),
        "perms": PermWrapper(user),
    }


def _hidden_for(user, row: ApprovalRequest, now) -> tuple[bool, object]:
    """Whether `user` snoozed or ignored the request, and until when (None: ignored)."""
    found = list(
        RequestHide.objects.filter(request_id=row.pk, user_id=user.pk)
        .filter(Q(until__isnull=True) | Q(until__gt=now))
        .values_list("until", flat=True)[:1]
    )
    return bool(found), (found[0] if found else None)


def detail_context(
    user, row: ApprovalRequest | None, *, card=None, list_url: str = "", asked_id: str = ""
) -> dict:
    """The detail pane: the request's card, its claim bar, who else views it, the run's
    transcript so far and the request's history (constant queries). With no row, the hint,
    or (`asked_id`: the URL named a request that is not there) why nothing shows."""
    if row is None:
        return {
            "card": None,
            "row": None,
            "selected_id": "",
            "list_url": list_url,
            "missing_id": asked_id[:MAX_REQUEST_ID],
        }
    now = timezone.now()
    card = card or request_card(row, can_decide=can_decide_request(user, row))
    run_context = run_context_for(row.run, can_decide=False, open_can_decide=False)
    hidden, until = _hidden_for(user, row, now)
    params = {"r": row.request_id}
    return {
        "row": row,
        "run": row.run,
        "card": card,
        "entries": run_context["entries"],
        "tree": run_context["tree"],
        "history": history(selectors.request_history(row=row), card.outcome),
        "hidden": hidden,
        "hidden_until": until,
        "selected_id": row.request_id,
        "list_url": list_url or _url({}),
        "detail_url": _url(params),
    }


def selected_row(user, request_id: str) -> ApprovalRequest | None:
    if not request_id:
        return None
    try:
        return selectors.request_get(request_id=request_id, hidden_agents=hidden_agents(user))
    except ApprovalRequest.DoesNotExist:
        return None


def inbox_context(user, params, page_number=None) -> dict:
    """The whole inbox page: the list and the selected request's detail pane."""
    context = list_context(user, params, page_number)
    row = selected_row(user, context["selected_id"])
    detail = detail_context(
        user, row, list_url=context["list_url"], asked_id=context["selected_id"]
    )
    if row is None:
        context["selected_id"] = ""
    context.update({k: v for k, v in detail.items() if k not in ("list_url",)})
    context["next_url"] = _url(
        {**context["query"].as_params(), **({"r": row.request_id} if row else {})}
    )
    context["nav"] = "inbox"
    return context


def _told(run: Run, requests: list[ApprovalRequest]) -> dict[int, dict]:
    """What MCP servers were told of their questions, read only for a cancelled run with a
    server's question it never resumed with (the one case a page shows it)."""
    if run.status != Run.Status.CANCELLED or not any(
        r.applied_at is None and r.state != ApprovalRequest.State.PENDING and mcp_server_of(r)
        for r in requests
    ):
        return {}
    return selectors.mcp_servers_told(run)


def run_context_for(
    run: Run, *, can_decide: bool, viewer=None, open_can_decide: bool | None = None
) -> dict:
    """`can_decide`: the run's reviewer actions (cancel, retry). The open request's card may
    differ (the starter rule): `open_can_decide` says so, or `viewer` has it asked of
    `can_decide_request`; with neither it follows `can_decide`."""
    decide = can_decide
    requests = selectors.run_requests(run)
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
        "entries": timeline(
            run.messages, requests, mcp_call_servers(requests, journaled), _told(run, requests)
        ),
        "open_card": request_card(open_row, can_decide=open_can_decide) if open_row else None,
        "tree": team_tree(run.team_state, requests),  # a team run's agents ([] for one agent)
        "next_url": reverse("approvals:run-detail", args=[run.pk]),
    }
