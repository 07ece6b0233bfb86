"""Reads: querysets shaped for each page and endpoint (constant query counts), and the
plain-dict views of rows the API returns.

Every read of runs and requests takes `hidden_agents`: the agents the viewer may not see,
from `permissions.hidden_agents(user)` (the caller asks; selectors do not know users). A row
of a hidden agent is left out of lists and counts, and does not exist for a get (404)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from django.db import connections
from django.db.models import (
    BooleanField,
    Exists,
    ExpressionWrapper,
    F,
    FilteredRelation,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.utils import timezone

from .conf import app_settings
from .domain import statements
from .domain.arguments import diff
from .domain.exceptions import InvalidInput
from .domain.records import MCP_SERVER_TOLD
from .models import ApiToken, ApprovalRequest, Event, RequestCall, RequestHide, Run

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


def request_view(row: ApprovalRequest) -> dict[str, Any]:
    decided = row.state != State.PENDING
    return {
        "request": row.wire,
        "run": row.run_id,
        "agent": row.agent,
        "state": row.state,
        "created_at": row.created_at,
        "calls": [call_view(c) for c in row.call_list()],
        "claim": claim_view(row),
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


# -- the triage inbox (issue 14) -------------------------------------------------------------

INBOX_SORTS = ("newest", "oldest", "deadline")
INBOX_CLAIMS = ("", "mine", "unclaimed")
INBOX_HIDDEN = ("", "only")
MAX_SEARCH_CHARS = 200
MAX_BULK_IDS = 500
_TRUE = ("1", "true", "on", "yes")


def param_text(params: Any, name: str) -> str:
    """One GET parameter as clean text: a QueryDict's last value, a dict's value, never a
    list; NUL removed (it never names anything, and PostgreSQL refuses it in a query)."""
    value = params.get(name, "") if params is not None else ""
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else ""
    return str(value if value is not None else "").replace("\x00", "").strip()


@dataclass(frozen=True)
class InboxQuery:
    """What the inbox shows: filters, search and sort, as read from a page's GET parameters
    (`from_params`, tolerant) and written back into its links (`as_params`)."""

    state: str = "pending"  # an ApprovalRequest.State value, or "all"
    agent: str = ""
    kind: str = ""
    q: str = ""  # case-insensitive substring of prompt, agent, tool names, arguments
    claim: str = ""  # "" | "mine" | "unclaimed" (active claims only)
    overdue: bool = False  # pending and expires_at < now
    hidden: str = ""  # "" = leave out what I snoozed/ignored | "only" = only those
    sort: str = "newest"  # "newest" | "oldest" | "deadline"

    @classmethod
    def from_params(cls, params: Any) -> InboxQuery:
        """Never raises: an unknown value is the default."""
        state = param_text(params, "state") or "pending"
        if state != "all" and state not in State.values:
            state = "pending"
        claim = param_text(params, "claim")
        hidden = param_text(params, "hidden")
        sort = param_text(params, "sort")
        return cls(
            state=state,
            agent=param_text(params, "agent")[:100],
            kind=param_text(params, "kind")[:50],
            q=" ".join(param_text(params, "q").split())[:MAX_SEARCH_CHARS],
            claim=claim if claim in INBOX_CLAIMS else "",
            overdue=param_text(params, "overdue").lower() in _TRUE,
            hidden=hidden if hidden in INBOX_HIDDEN else "",
            sort=sort if sort in INBOX_SORTS else "newest",
        )

    def as_params(self) -> dict[str, str]:
        """Only the values that differ from the defaults (for URLs), in a stable order."""
        out: dict[str, str] = {}
        default = InboxQuery()
        for name in ("state", "agent", "kind", "q", "claim", "hidden", "sort"):
            value = getattr(self, name)
            if value != getattr(default, name):
                out[name] = value
        if self.overdue:
            out["overdue"] = "1"
        return out


def _claim_cutoff(now: Any) -> Any:
    """Claims taken at or before this moment have lapsed (None: claims never lapse)."""
    minutes = int(app_settings.CLAIM_MINUTES or 0)
    return now - timedelta(minutes=minutes) if minutes > 0 else None


def _active_claim_q(now: Any) -> Q:
    active = Q(state=State.PENDING, claimed_by__isnull=False, claimed_at__isnull=False)
    cutoff = _claim_cutoff(now)
    return active & Q(claimed_at__gt=cutoff) if cutoff is not None else active


def _no_active_claim_q(now: Any) -> Q:
    """The negation of `_active_claim_q`, spelled out (NULLs included)."""
    free = Q(claimed_by__isnull=True) | Q(claimed_at__isnull=True) | ~Q(state=State.PENDING)
    cutoff = _claim_cutoff(now)
    return free | Q(claimed_at__lte=cutoff) if cutoff is not None else free


def _viewer_hides(user_id: Any, now: Any) -> QuerySet[RequestHide]:
    """The viewer's own hide of the row: snoozed until later than now, or ignored."""
    return _viewer_hides_q(user_id, now).filter(request_id=OuterRef("pk"))


def _viewer_hides_q(user_id: Any, now: Any) -> QuerySet[RequestHide]:
    """Every request the viewer hid: snoozed until later than now, or ignored."""
    return RequestHide.objects.filter(user_id=user_id).filter(
        Q(until__isnull=True) | Q(until__gt=now)
    )


def _search_q(text: str) -> Q:
    """Case-insensitive substring over the stored lowercased search text (see
    ApprovalRequest.search_text: prompt, agent, tool names, arguments). On PostgreSQL a
    pg_trgm GIN index serves LIKE '%...%' (migration 0004)."""
    return Q(search_text__contains=text.lower())


def _inbox_base(query: InboxQuery, *, hidden_agents: Collection[str]) -> QuerySet[ApprovalRequest]:
    """The query's state, agent, kind and search filters, and per-agent access."""
    qs = ApprovalRequest.objects.all()
    if hidden_agents:
        qs = qs.exclude(agent__in=sorted(hidden_agents))
    if query.state and query.state != "all":
        qs = qs.filter(state=query.state)
    if query.agent:
        qs = qs.filter(agent=query.agent)
    if query.kind:
        qs = qs.filter(kind=query.kind)
    if query.q:
        qs = qs.filter(_search_q(query.q))
    return qs


def _chip_conditions(query: InboxQuery, *, user_id: Any, now: Any) -> dict[str, Q]:
    """Each chip's filter as a condition on rows annotated with `viewer_hidden` (see
    `inbox_matching`)."""
    active = _active_claim_q(now)
    return {
        "mine": active & Q(claimed_by_id=user_id),
        "unclaimed": _no_active_claim_q(now),
        "overdue": Q(state=State.PENDING, expires_at__lt=now),
        "hidden": Q(viewer_hidden=True),
        "shown": Q(viewer_hidden=False),
    }


def _query_conditions(query: InboxQuery, chips: dict[str, Q]) -> dict[str, Q | None]:
    """The query's own claim, overdue and hidden filters (None: no filter)."""
    return {
        "claim": chips[query.claim] if query.claim else None,
        "overdue": chips["overdue"] if query.overdue else None,
        "hidden": chips["hidden"] if query.hidden == "only" else chips["shown"],
    }


def _all_of(conditions: Collection[Q | None]) -> Q:
    out = Q()
    for condition in conditions:
        if condition is not None:
            out &= condition
    return out


def _inbox_order(sort: str) -> list[Any]:
    if sort == "oldest":
        return ["created_at", "id"]
    if sort == "deadline":
        return [F("expires_at").asc(nulls_last=True), "-created_at", "-id"]
    return ["-created_at", "-id"]


INBOX_ROW_DEFERRED = (
    "search_text",
    "run__messages",
    "run__system_prompt",
    "run__text",
    "run__usage",
    "run__error",
)


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
        ApprovalRequest.objects.filter(pk__in=keys)
        .select_related("run", "decided_by", "claimed_by")
        # A list, not a queryset per row (Django builds one per row otherwise): call_list().
        .prefetch_related(Prefetch("calls", queryset=_calls_in_order(), to_attr="listed_calls"))
        .defer(*INBOX_ROW_DEFERRED)
    )
    return list(rows.order_by(*order))


def inbox_counts(
    query: InboxQuery,
    *,
    user_id: Any,
    hidden_agents: Collection[str] = (),
    now: Any = None,
    cap: int | None = None,
    options: Mapping[str, Iterable[str]] | None = None,
    newest: bool = False,
) -> dict[str, Any]:
    """TWO queries: {"matching", "mine", "unclaimed", "overdue", "hidden", "waiting"}, and
    with `options` ({"agent": [...], "kind": [...], "state": [...]}: the filter menus'
    values) "options": {menu: {value: count}}, in the same two queries (a search that finds
    no more than the cap: its menus in one, `_search_options_statement`, and the rest in
    the other). With `newest`, "newest" too, in the second: the highest request pk among
    the rows the query matches (0 if none), which the bulk bar's "all matching" stops at (`request_ids_matching`'s
    `upto`): a request that arrives later has a higher pk, and is not decided with them.

    "matching" counts the query's rows; each chip counts them with the query's other filters
    and that chip's filter instead of the query's own for the same thing (so "hidden" counts
    what the viewer snoozed or ignored among otherwise matching rows); "waiting" is the
    viewer's pending requests, less what they snoozed or ignored (the page title's count).

    Each count stops past `cap` (TOOLNEXUS_INBOX_COUNT_CAP): a value above the cap reads
    "more than the cap" (see `count_label`), as an exact count reads every matching row and
    a page at 100k pending would cost 100 times one at 1k. The first query counts the
    query's scope (its state, agent, kind and search) and "waiting", each up to the cap; a
    scope within the cap (a search that finds few) is then counted exactly in one pass,
    a larger one count by count, each stopping at the cap. The menus' options are counted
    in the first query, each up to the cap (decided states too: their history grows without
    end), the option the query has chosen being "matching".

    The statements are compiled once per shape of count (`_statement`) and bound to `now`."""
    now = now or timezone.now()
    shape = _CountShape(
        query=replace(query, sort=InboxQuery().sort),  # no count depends on the order
        user_id=user_id,
        hidden_agents=tuple(sorted(hidden_agents)),
        cap=count_cap() if cap is None else cap,
        options=tuple((m, tuple(dict.fromkeys(v))) for m, v in options.items()) if options else (),
        newest=newest,
    )
    # A search's menu counts in one statement of their own when it finds few rows; else
    # each option is counted in the first statement below.
    searched = _options_of_a_search(shape, now)
    if searched is not None:
        # Its statement counted the query's scope too (up to the cap): the rest, with the
        # viewer's waiting requests, in one more.
        options, scope = searched
        rest = _one_pass_with_waiting if scope <= shape.cap else _each_capped_with_waiting
        return {**_run(_statement(rest, shape), now), "options": options}
    first_statement = _statement(_first_statement, shape)
    first = _run(first_statement, now)
    second = _one_pass_statement if first["scope"] <= shape.cap else _each_capped_statement
    counts = _run(_statement(second, shape), now)
    out: dict[str, Any] = {**counts, "waiting": first["waiting"]}
    if options is not None:
        out["options"] = _option_counts(shape, first_statement, first, matching=counts["matching"])
    return out


# The filter menus that carry counts (InboxQuery fields). A menu's "all" is "" (agent,
# kind) or "all" (state): no filter on that field.
OPTION_MENUS = ("agent", "kind", "state")
# Stands for an option's value in a menu's count, compiled once for all its options: no
# value of a query holds a NUL (`param_text` removes it).
_OPTION = "\x00option\x00"


def _option_counted(
    query: InboxQuery,
    options: Mapping[str, Iterable[str]],
    hides: QuerySet,
    *,
    user_id: Any,
    now: Any,
    hidden_agents: Collection[str],
    cap: int,
) -> dict[str, tuple[str, str, _Sql]]:
    """The count of the rows each menu option would list: the query with that option
    chosen instead of its own value for the same filter, every other filter kept (as the
    chips count), up to the cap + 1. The option the query has chosen is the query itself
    (`matching`): not counted again. Each menu's count is built and compiled once (and its
    "all" once), each option binding its value: the ORM would take 5 ms for 13 options.
    Keyed by an SQL-safe name: (menu, value, count)."""
    chips = _chips_by_hides(query, hides, user_id=user_id, now=now)
    own = _query_conditions(query, chips)
    compiled: dict[tuple[str, bool], _Sql] = {}
    out: dict[str, tuple[str, str, _Sql]] = {}
    for menu in OPTION_MENUS:
        every = "all" if menu == "state" else ""
        for value in dict.fromkeys(options.get(menu, ())):
            if replace(query, **{menu: value}) == query:
                continue
            variant = (menu, value == every)
            if variant not in compiled:
                chosen = replace(query, **{menu: every if value == every else _OPTION})
                counted = _option_rows(
                    chosen, own, chips, hides, user_id=user_id, now=now, hidden_agents=hidden_agents
                )
                compiled[variant] = _capped_sql(counted, cap)
            out[f"option_{len(out)}"] = (menu, value, compiled[variant].bind(_OPTION, value))
    return out


def _option_rows(
    chosen: InboxQuery,
    own: dict[str, Q | None],
    chips: dict[str, Q],
    hides: QuerySet,
    *,
    user_id: Any,
    now: Any,
    hidden_agents: Collection[str],
) -> QuerySet | _Either:
    """The rows the query `chosen` (a menu's option chosen) lists, to be counted."""
    base = _inbox_base(chosen, hidden_agents=hidden_agents)
    if chosen.state == "all":
        # Every state spelled out: the (state, agent, ...) and (state, kind, ...) indexes
        # then serve an agent or a kind alone (one probe per state) instead of a scan of
        # every request for it (5 times faster at 100k).
        base = base.filter(state__in=State.values)
    if own["hidden"] is not chips["hidden"]:
        return base.filter(_all_of(own.values()))
    # What the viewer hid (`hidden=only`). Read from the viewer's hides, each looking up
    # its request (`_hidden_rows`, as the hidden chip counts), every option would read every
    # hide (100k pending, 2000 of them hidden as in bench/inbox_scale.py: 30 ms for the 13
    # options). So an option with few rows (no more than the cap, hidden or not: a decided
    # state, another agent) is counted from its rows, each looking up its one hide, and only
    # a large one from the hides.
    others = base.filter(_all_of(q for name, q in own.items() if name != "hidden"))
    return _Either(
        probe=others,
        few=others.filter(Exists(_viewer_hides(user_id, now))),
        many=_hidden_rows(base, own, hides),
    )


def _option_counts(
    shape: _CountShape, statement: _Statement, row: Mapping[str, int], *, matching: int
) -> dict[str, dict[str, int]]:
    """{menu: {value: count}} in the options' order: what `statement` counted (its row),
    the query's own choice (not counted again) `matching`."""
    found = {(menu, value): row[column] for column, menu, value in statement.options}
    options = dict(shape.options)
    return {
        menu: {value: found.get((menu, value), matching) for value in options[menu]}
        for menu in OPTION_MENUS
        if menu in options
    }


def _chips_by_hides(query: InboxQuery, hides: QuerySet, *, user_id: Any, now: Any) -> dict:
    """`_chip_conditions` with hidden / shown as membership in the viewer's hides (for
    counts: no per-row EXISTS annotation)."""
    return {
        **_chip_conditions(query, user_id=user_id, now=now),
        "hidden": Q(pk__in=hides.values("request_id")),
        "shown": ~Q(pk__in=hides.values("request_id")),
    }


def inbox_matching_count(
    query: InboxQuery, *, user_id: Any, hidden_agents: Collection[str] = (), now: Any = None
) -> int:
    """The exact number of rows the query matches (one query): the API's `count`, which
    clients page by. The pages use `inbox_counts`, capped."""
    now = now or timezone.now()
    hides = _viewer_hides_q(user_id, now)
    chips = _chips_by_hides(query, hides, user_id=user_id, now=now)
    own = _query_conditions(query, chips)
    return _inbox_base(query, hidden_agents=hidden_agents).filter(_all_of(own.values())).count()


def _newest_sql(rows: QuerySet) -> _Sql:
    """The highest request pk among `rows` (requests, or the viewer's hides of them:
    `_hidden_rows`), as an SQL expression: NULL when there is none."""
    key = "request_id" if rows.model is RequestHide else "pk"
    newest = rows.order_by(f"-{key}").values(key)[:1]
    sql, params = newest.query.get_compiler(using=newest.db).as_sql()
    return _Sql(f"({sql})", tuple(params), newest.db)


def _hidden_rows(
    base: QuerySet[ApprovalRequest], conditions: dict[str, Q | None], hides: QuerySet
) -> QuerySet:
    """The viewer's hidden rows that meet `conditions`, read from the viewer's own hides: each
    hide looks up its one request (a LIMIT 1 subquery, so the planner keeps it a lookup by
    key instead of reading every request to join them)."""
    others = {name: q for name, q in conditions.items() if name != "hidden"}
    match = base.filter(_all_of(others.values()), pk=OuterRef("request_id")).order_by().values("pk")
    return hides.annotate(match=Subquery(match[:1])).filter(match__isnull=False)


@dataclass(frozen=True)
class _Either:
    """Rows counted one of two ways, whichever reads fewer: `few` when `probe` (a superset
    of them) has no more rows than the cap, else `many` (`_capped_sql` counts each up to
    the cap + 1, and PostgreSQL runs only the branch of the CASE it takes)."""

    probe: QuerySet
    few: QuerySet
    many: QuerySet


@dataclass(frozen=True)
class _Sql:
    """A count compiled: an SQL expression and its parameters."""

    sql: str
    params: tuple
    db: str

    def bind(self, placeholder: str, value: str) -> _Sql:
        params = tuple(value if p == placeholder else p for p in self.params)
        return _Sql(self.sql, params, self.db)

    def at(self, now: Any) -> _Sql:
        """Compiled at `_STAND_IN_NOW`, bound to `now`: each value derived from the stand-in
        (`_moments`), as the ORM passed it or as the database's adapter wrote it, becomes
        the same value derived from `now`."""
        adapt = connections[self.db].ops.adapt_datetimefield_value
        swap: dict[Any, Any] = {}
        for stand_in, real in zip(_moments(_STAND_IN_NOW), _moments(now), strict=True):
            swap[stand_in] = real
            swap[adapt(stand_in)] = adapt(real)
        params = tuple(swap.get(p, p) if isinstance(p, (datetime, str)) else p for p in self.params)
        return _Sql(self.sql, params, self.db)


def _capped_sql(counted: QuerySet | _Either, cap: int) -> _Sql:
    """The count of `counted`'s rows, stopping at `cap` + 1, as an SQL expression."""
    if isinstance(counted, _Either):
        probe, few, many = (
            _capped_sql(qs, cap) for qs in (counted.probe, counted.few, counted.many)
        )
        return _Sql(
            f"CASE WHEN {probe.sql} <= {int(cap)} THEN {few.sql} ELSE {many.sql} END",
            probe.params + few.params + many.params,
            probe.db,
        )
    limited = counted.order_by().values("pk")[: cap + 1]
    sql, params = limited.query.get_compiler(using=limited.db).as_sql()
    return _Sql(f"(SELECT COUNT(*) FROM ({sql}) AS counted)", tuple(params), limited.db)


def _options_of_a_search(
    shape: _CountShape, now: Any
) -> tuple[dict[str, dict[str, int]], int] | None:
    """The menus' counts of a search and its scope's count (up to the cap + 1), when it
    finds no more rows than the cap (`_search_options_statement`); else None: each option
    is counted on its own."""
    if not shape.options or not shape.query.q or shape.query.hidden == "only":
        return None
    statement = _statement(_search_options_statement, shape)
    found = _run(statement, now)
    if found["found"] > shape.cap:
        return None
    return _option_counts(shape, statement, found, matching=0), found["scope"]


# -- counting statements, compiled once per shape ------------------------------------------


@dataclass(frozen=True)
class _CountShape:
    """What a count's SQL depends on, but the moment: compiling it takes the ORM longer than
    PostgreSQL takes to run it (bench/inbox_scale.py at 100k pending: 12 ms of a page's
    44 ms, the statements 9), so it is done once per shape and bound to each `now`."""

    query: InboxQuery
    user_id: Any
    hidden_agents: tuple[str, ...]
    cap: int
    options: tuple[tuple[str, tuple[str, ...]], ...]  # ((menu, (value, ...)), ...)
    newest: bool


@dataclass(frozen=True)
class _Statement:
    """A compiled statement of one row: its values' names, and for the menus' options which
    (menu, value) each `option_N` counts."""

    sql: _Sql
    columns: tuple[str, ...]
    options: tuple[tuple[str, str, str], ...] = ()  # ((column, menu, value), ...)


# The moment a statement is compiled at, standing for the `now` it is bound to (`_Sql.at`):
# no real moment of a request or a hide is this one.
_STAND_IN_NOW = datetime(1901, 2, 3, 4, 5, 6, 78901, tzinfo=UTC)
_STATEMENTS: dict[tuple, _Statement] = {}
# Shapes times viewers (a search text is a shape of its own); an entry is a few kB, up to
# 50 kB for a viewer's hidden requests counted over 30 agents' options.
_MAX_STATEMENTS = 1000


def _moments(now: Any) -> tuple:
    """Every value derived from `now` that a count compares with: `now`, and the claim
    cutoff when claims lapse."""
    cutoff = _claim_cutoff(now)
    return (now,) if cutoff is None else (now, cutoff)


def _statement(build: Any, shape: _CountShape) -> _Statement:
    """`build(shape, at)`'s statement, compiled at the stand-in moment once per shape (and
    per database and claim time, which the SQL depends on too)."""
    key = (build, shape, ApprovalRequest.objects.db, int(app_settings.CLAIM_MINUTES or 0))
    statement = _STATEMENTS.get(key)
    if statement is None:
        statement = build(shape, _STAND_IN_NOW)
        while len(_STATEMENTS) >= _MAX_STATEMENTS:  # the oldest goes (another thread may too)
            with suppress(KeyError, RuntimeError, StopIteration):
                del _STATEMENTS[next(iter(_STATEMENTS))]
        _STATEMENTS[key] = statement
    return statement


def _run(statement: _Statement, now: Any) -> dict[str, int]:
    """The statement's one row at the moment `now`, by column name.

    On PostgreSQL the values go into the statement as literals (quoted by psycopg on the
    client, as Django's default binding does): with server-side binding a statement run 5
    times is prepared and may get a generic plan, made without the values, in which a
    filter menu's option that matches no row (a decided state, a rare kind) is estimated
    as common and its count reads to the end of an index (100k pending: 27 ms for the
    inbox's first count instead of 2)."""
    values = _fetch_one(statement.sql.at(now))
    return {name: int(value or 0) for name, value in zip(statement.columns, values, strict=True)}


def _fetch_one(bound: _Sql) -> tuple:
    """A compiled statement's one row, its values as literals on PostgreSQL (`_run`)."""
    connection = connections[bound.db]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(connection.ops.compose_sql(bound.sql, list(bound.params)))
        else:
            cursor.execute(bound.sql, bound.params)
        return cursor.fetchone()


def _select(parts: Mapping[str, _Sql], **extra: Any) -> _Statement:
    """One statement selecting each expression of `parts`, named by its key."""
    db = next(iter(parts.values())).db
    sql = "SELECT " + ", ".join(part.sql for part in parts.values())
    params = tuple(p for part in parts.values() for p in part.params)
    return _Statement(_Sql(sql, params, db), tuple(parts), **extra)


def _filtered_counts(
    rows: QuerySet,
    counts: Mapping[str, Q],
    *,
    highest: Mapping[str, Q] | None = None,
    limit: int | None = None,
    also: Mapping[str, _Sql] | None = None,
) -> _Statement:
    """One scan of `rows` (its first `limit` only, with one): for each of `counts` the rows
    meeting its condition, for each of `highest` the highest pk among them (0 if none), and
    `also`'s expressions (subqueries of their own). The conditions are the rows' boolean
    columns, counted around them."""
    conditions = {**counts, **(highest or {})}
    assert len(conditions) == len(counts) + len(highest or {}), "a name counted twice"
    flags = {
        f"flag_{i}": ExpressionWrapper(condition, output_field=BooleanField())
        if condition
        else Value(True)
        for i, condition in enumerate(conditions.values())
    }
    inner = rows.order_by().annotate(row_key=F("pk"), **flags).values("row_key", *flags)
    if limit is not None:
        inner = inner[:limit]
    sql, params = inner.query.get_compiler(using=inner.db).as_sql()
    names = list(flags)
    columns = [f"COUNT(CASE WHEN {flag} THEN 1 END)" for flag in names[: len(counts)]]
    columns += [f"MAX(CASE WHEN {flag} THEN row_key END)" for flag in names[len(counts) :]]
    also = also or {}
    columns += [part.sql for part in also.values()]
    params = (*(p for part in also.values() for p in part.params), *params)
    return _Statement(
        _Sql(f"SELECT {', '.join(columns)} FROM ({sql}) AS counted_rows", params, inner.db),
        (*conditions, *also),
    )


def _waiting_sql(shape: _CountShape, hides: QuerySet) -> _Sql:
    """The viewer's pending requests less what they hid, up to the cap (the page title's)."""
    shown = ~Q(pk__in=hides.values("request_id"))
    waiting = _inbox_base(InboxQuery(), hidden_agents=shape.hidden_agents).filter(shown)
    return _capped_sql(waiting, shape.cap)


def _first_statement(shape: _CountShape, at: Any) -> _Statement:
    """The query's scope and the viewer's waiting requests, each up to the cap, and the
    menus' options (`_option_counted`)."""
    hides = _viewer_hides_q(shape.user_id, at)
    scope = _inbox_base(shape.query, hidden_agents=shape.hidden_agents)
    counted = _option_counted(
        shape.query,
        dict(shape.options),
        hides,
        user_id=shape.user_id,
        now=at,
        hidden_agents=shape.hidden_agents,
        cap=shape.cap,
    )
    parts = {
        "scope": _capped_sql(scope, shape.cap),
        "waiting": _waiting_sql(shape, hides),
        **{column: sql for column, (_, _, sql) in counted.items()},
    }
    return _select(
        parts, options=tuple((column, menu, value) for column, (menu, value, _) in counted.items())
    )


def _search_options_statement(shape: _CountShape, at: Any) -> _Statement:
    """The menus' counts of a search that finds few rows, in ONE statement: the rows the
    search and the query's other filters find in any agent, kind and state, up to the cap
    + 1 ("found"), each option a condition over them. Counted option by option
    (`_option_counted`), every option repeats the search: 13 trigram searches, 27 ms at
    100k pending for a word 1 % of them hold, against 3. Used for a search without
    `hidden=only` (counted from the viewer's hides); when it finds more than the cap, each
    option is counted on its own (its count stops early anyway). With them, the query's
    scope up to the cap + 1 ("scope", as `_first_statement` counts it): the rows found are
    those the query's claim, overdue and hidden filters keep, and the scope may hold far
    more, which then are counted each up to the cap."""
    query = shape.query
    hides = _viewer_hides_q(shape.user_id, at)
    chips = _chips_by_hides(query, hides, user_id=shape.user_id, now=at)
    own = _query_conditions(query, chips)
    unfiltered = replace(query, agent="", kind="", state="all")
    found = _inbox_base(unfiltered, hidden_agents=shape.hidden_agents).filter(_all_of(own.values()))
    conditions: dict[str, Q] = {"found": Q()}
    columns: list[tuple[str, str, str]] = []
    options = dict(shape.options)
    for menu in OPTION_MENUS:
        for value in options.get(menu, ()):
            chosen = replace(query, **{menu: value})
            column = f"option_{len(columns)}"
            columns.append((column, menu, value))
            conditions[column] = _all_of(
                Q(**{field: getattr(chosen, field)})
                for field in OPTION_MENUS
                if getattr(chosen, field) not in ("", "all")
            )
    scope = _inbox_base(query, hidden_agents=shape.hidden_agents)
    counted = _filtered_counts(
        found, conditions, limit=shape.cap + 1, also={"scope": _capped_sql(scope, shape.cap)}
    )
    return replace(counted, options=tuple(columns))


def _one_pass_statement(shape: _CountShape, at: Any, *, with_waiting: bool = False) -> _Statement:
    """Exact counts of a small scope: one scan, a condition per count, the viewer's hides in
    ONE left join (unique per request and user); with `newest`, the matching rows' highest
    pk in the same scan; `with_waiting`, the viewer's waiting requests (`_waiting_sql`)."""
    query = shape.query
    hide = FilteredRelation(
        "hides",
        condition=Q(hides__user_id=shape.user_id)
        & (Q(hides__until__isnull=True) | Q(hides__until__gt=at)),
    )
    chips = {
        **_chip_conditions(query, user_id=shape.user_id, now=at),
        "hidden": Q(viewer_hide__id__isnull=False),
        "shown": Q(viewer_hide__id__isnull=True),
    }
    own = _query_conditions(query, chips)

    def count(**replace: Q) -> Q:
        return _all_of({**own, **replace}.values())

    scope = _inbox_base(query, hidden_agents=shape.hidden_agents)
    return _filtered_counts(
        scope.annotate(viewer_hide=hide),
        {
            "matching": count(),
            "mine": count(claim=chips["mine"]),
            "unclaimed": count(claim=chips["unclaimed"]),
            "overdue": count(overdue=chips["overdue"]),
            "hidden": count(hidden=chips["hidden"]),
        },
        highest={"newest": count()} if shape.newest else None,
        also={"waiting": _waiting_sql(shape, _viewer_hides_q(shape.user_id, at))}
        if with_waiting
        else None,
    )


def _one_pass_with_waiting(shape: _CountShape, at: Any) -> _Statement:
    return _one_pass_statement(shape, at, with_waiting=True)


def _each_capped_statement(
    shape: _CountShape, at: Any, *, with_waiting: bool = False
) -> _Statement:
    """Counts of a large scope: each a subquery that stops at the cap + 1 rows; with
    `newest`, the matching rows' highest pk (a subquery that reads the newest first);
    `with_waiting`, the viewer's waiting requests (`_waiting_sql`)."""
    query = shape.query
    scope = _inbox_base(query, hidden_agents=shape.hidden_agents)
    hides = _viewer_hides_q(shape.user_id, at)
    chips = _chips_by_hides(query, hides, user_id=shape.user_id, now=at)
    own = _query_conditions(query, chips)
    specs = {
        "matching": own,
        "mine": {**own, "claim": chips["mine"]},
        "unclaimed": {**own, "claim": chips["unclaimed"]},
        "overdue": {**own, "overdue": chips["overdue"]},
        "hidden": {**own, "hidden": chips["hidden"]},
    }
    counted: dict[str, QuerySet] = {}
    for name, conditions in specs.items():
        if conditions["hidden"] is chips["hidden"]:
            counted[name] = _hidden_rows(scope, conditions, hides)
        else:
            counted[name] = scope.filter(_all_of(conditions.values()))
    parts = {name: _capped_sql(rows, shape.cap) for name, rows in counted.items()}
    if shape.newest:
        parts["newest"] = _newest_sql(counted["matching"])
    if with_waiting:
        parts["waiting"] = _waiting_sql(shape, hides)
    return _select(parts)


def _each_capped_with_waiting(shape: _CountShape, at: Any) -> _Statement:
    return _each_capped_statement(shape, at, with_waiting=True)


def pending_count(*, hidden_agents: Collection[str] = ()) -> int:
    """Pending requests of the agents not hidden, up to the cap + 1 (`count_label` reads
    it). Every change a live inbox follows asks it, so it is compiled once per database,
    hidden agents and cap."""
    statement = _pending_count_sql(
        ApprovalRequest.objects.db, tuple(sorted(hidden_agents)), count_cap()
    )
    return int(_fetch_one(statement)[0] or 0)


@lru_cache(maxsize=64)
def _pending_count_sql(db: str, hidden_agents: tuple[str, ...], cap: int) -> _Sql:
    scope = ApprovalRequest.objects.using(db).filter(state=ApprovalRequest.State.PENDING)
    if hidden_agents:
        scope = scope.exclude(agent__in=hidden_agents)
    counted = _capped_sql(scope, cap)
    return _Sql(f"SELECT {counted.sql}", counted.params, counted.db)


def count_cap() -> int:
    return max(1, int(app_settings.INBOX_COUNT_CAP or 1))


def count_label(value: int, cap: int | None = None) -> str:
    """A capped count as people read it: "12", or "1000+" past the cap."""
    cap = count_cap() if cap is None else cap
    return f"{cap}+" if value > cap else str(value)


def active_claim(row: ApprovalRequest, *, now: Any = None) -> Any:
    """Who holds an active claim on this request (a user), or None: decided requests and
    lapsed claims have none. No query when `claimed_by` was joined (inbox_requests)."""
    if row.state != State.PENDING or row.claimed_by_id is None or row.claimed_at is None:
        return None
    cutoff = _claim_cutoff(now or timezone.now())
    if cutoff is not None and row.claimed_at <= cutoff:
        return None
    return row.claimed_by


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


def claim_view(row: ApprovalRequest, *, now: Any = None) -> dict[str, Any] | None:
    """The API's `claim`: the active claim's holder and when it was taken, or None."""
    holder = active_claim(row, now=now)
    if holder is None:
        return None
    return {"by": _username(holder), "at": row.claimed_at}
