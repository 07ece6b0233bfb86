"""The triage inbox's counts: chips, menus and the pending count, in one statement where it can."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

from django.db.models import (
    Exists,
    FilteredRelation,
    Q,
    QuerySet,
)
from django.utils import timezone

from ..conf import app_settings
from ..models import ApprovalRequest
from .inbox_query import (
    InboxQuery,
    _all_of,
    _chip_conditions,
    _inbox_base,
    _query_conditions,
    _viewer_hides,
    _viewer_hides_q,
)
from .sql import (
    _capped_sql,
    _CountShape,
    _Either,
    _fetch_one,
    _filtered_counts,
    _hidden_rows,
    _newest_sql,
    _run,
    _select,
    _Sql,
    _Statement,
    _statement,
)

State = ApprovalRequest.State


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
    """TWO queries: {"matching", "mine", "unclaimed", "routed", "overdue", "hidden", "waiting"}, and
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
            "routed": count(claim=chips["routed"]),
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
        "routed": {**own, "claim": chips["routed"]},
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
