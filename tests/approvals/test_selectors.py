"""approvals.selectors, the triage inbox's reads (issue 14): InboxQuery, search, filters,
active claims, sorts, counts, and a query count that does not grow with rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import selectors, services
from approvals.models import ApprovalRequest
from approvals.selectors import InboxQuery, sql
from approvals.selectors import counts as count_statements

from .factories import claim, counts, ids, inbox, make_request, make_user

pytestmark = pytest.mark.django_db


# -- InboxQuery -------------------------------------------------------------------------


def test_query_from_params_is_tolerant_and_as_params_gives_only_non_defaults():
    assert InboxQuery.from_params({}) == InboxQuery()
    assert InboxQuery().as_params() == {}
    bad = InboxQuery.from_params(
        {"state": "nope", "claim": "theirs", "hidden": "all", "sort": "random", "overdue": "x"}
    )
    assert bad == InboxQuery()
    query = InboxQuery.from_params(
        {
            "state": "all",
            "agent": "demo\x00",
            "kind": "approval",
            "q": "  Refund   A-1 ",
            "claim": "mine",
            "overdue": "1",
            "hidden": "only",
            "sort": "deadline",
        }
    )
    assert query == InboxQuery(
        state="all",
        agent="demo",
        kind="approval",
        q="Refund A-1",
        claim="mine",
        overdue=True,
        hidden="only",
        sort="deadline",
    )
    assert query.as_params() == {
        "state": "all",
        "agent": "demo",
        "kind": "approval",
        "q": "Refund A-1",
        "claim": "mine",
        "hidden": "only",
        "sort": "deadline",
        "overdue": "1",
    }
    assert InboxQuery.from_params(query.as_params()) == query
    assert len(InboxQuery.from_params({"q": "x" * 5000}).q) == selectors.MAX_SEARCH_CHARS


def test_query_from_a_querydict_takes_the_last_value():
    from django.http import QueryDict

    query = InboxQuery.from_params(QueryDict("sort=oldest&sort=deadline&state=declined"))
    assert (query.sort, query.state) == ("deadline", "declined")


# -- search -----------------------------------------------------------------------------


def test_search_is_a_case_insensitive_substring_of_prompt_agent_tool_and_arguments(
    second_demo_agent,
):
    user = make_user()
    by_prompt = make_request(prompt="Refund the DOUBLE charge")
    by_run_prompt = make_request(prompt="relay tool call", run_prompt="Customer Zanzibar")
    by_agent = make_request(agent="demo2")
    by_tool = make_request(tool="send_email")
    by_input = make_request(input={"to": "Ops@Example.com"})
    by_raw_arguments = make_request(arguments='{"account": "ACCT-77"}')
    by_approval_tool = make_request(kind="approval", tool="delete_account", input={"id": 3})
    question = make_request(kind="question", prompt="Which plan? Basic or PRO")

    assert inbox(user, q="double charge") == [by_prompt.request_id]
    assert inbox(user, q="zanzibar") == [by_run_prompt.request_id]
    assert inbox(user, q="DEMO2") == [by_agent.request_id]
    assert inbox(user, q="Send_Email") == [by_tool.request_id]
    assert inbox(user, q="ops@example") == [by_input.request_id]
    assert inbox(user, q="acct-77") == [by_raw_arguments.request_id]
    assert inbox(user, q="delete_acc") == [by_approval_tool.request_id]
    assert inbox(user, q="or pro") == [question.request_id]
    assert inbox(user, q="no such words") == []
    # LIKE's wildcards are plain characters in a search
    assert inbox(user, q="%") == [] and inbox(user, q="_") != ids(ApprovalRequest.objects.all())


# -- filters ----------------------------------------------------------------------------


def test_state_agent_and_kind_filters(second_demo_agent):
    user = make_user()
    a = make_request()
    b = make_request(agent="demo2", kind="approval", tool="delete_account")
    c = make_request(kind="question")
    ApprovalRequest.objects.filter(pk=c.pk).update(state="declined", decided_at=timezone.now())
    assert set(inbox(user)) == {a.request_id, b.request_id}
    assert inbox(user, state="declined") == [c.request_id]
    assert set(inbox(user, state="all")) == {a.request_id, b.request_id, c.request_id}
    assert inbox(user, agent="demo2") == [b.request_id]
    assert inbox(user, kind="approval") == [b.request_id]
    assert inbox(user, state="all", kind="question") == [c.request_id]


def test_hidden_agents_are_left_out_of_rows_counts_and_ids(second_demo_agent):
    user = make_user()
    visible = make_request(agent="demo")
    make_request(agent="demo2")
    query = InboxQuery()
    rows = selectors.inbox_requests(query, user_id=user.pk, hidden_agents={"demo2"})
    assert ids(rows) == [visible.request_id]
    assert selectors.inbox_counts(query, user_id=user.pk, hidden_agents={"demo2"})["matching"] == 1
    assert selectors.request_ids_matching(query, user_id=user.pk, hidden_agents={"demo2"}) == [
        visible.request_id
    ]


def test_overdue_filter_is_pending_past_expiry():
    user = make_user()
    late = make_request(expires_in=timedelta(minutes=-5))
    make_request(expires_in=timedelta(minutes=5))
    make_request()
    decided_late = make_request(expires_in=timedelta(minutes=-5))
    ApprovalRequest.objects.filter(pk=decided_late.pk).update(
        state="expired", decided_at=timezone.now()
    )
    assert inbox(user, overdue=True) == [late.request_id]
    assert inbox(user, state="all", overdue=True) == [late.request_id]


def test_claim_filters_count_only_active_claims(settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    me, other = make_user(), make_user()
    mine = make_request()
    theirs = make_request()
    lapsed = make_request()
    free = make_request()
    claim(mine, me)
    claim(theirs, other)
    claim(lapsed, me, minutes_ago=31)
    assert inbox(me, claim="mine") == [mine.request_id]
    assert set(inbox(me, claim="unclaimed")) == {lapsed.request_id, free.request_id}
    assert inbox(other, claim="mine") == [theirs.request_id]
    settings.TOOLNEXUS_CLAIM_MINUTES = 0  # claims never lapse
    assert set(inbox(me, claim="mine")) == {mine.request_id, lapsed.request_id}
    assert inbox(me, claim="unclaimed") == [free.request_id]


def test_a_decided_request_keeps_its_claim_fields_but_has_no_active_claim():
    me = make_user()
    row = make_request()
    claim(row, me)
    ApprovalRequest.objects.filter(pk=row.pk).update(state="declined", decided_at=timezone.now())
    row = selectors.inbox_requests(InboxQuery(state="all"), user_id=me.pk).get()
    assert row.claimed_by == me and row.claimed_at is not None
    assert selectors.active_claim(row) is None
    assert inbox(me, state="all", claim="mine") == []
    assert inbox(me, state="all", claim="unclaimed") == [row.request_id]


def test_active_claim_reads_no_query_and_lapses(settings, django_assert_num_queries):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    me = make_user(username="claimer")
    row = make_request()
    claim(row, me, minutes_ago=10)
    (row,) = selectors.inbox_requests(InboxQuery(), user_id=me.pk)
    with django_assert_num_queries(0):
        assert selectors.active_claim(row).get_username() == "claimer"
        later = timezone.now() + timedelta(minutes=21)
        assert selectors.active_claim(row, now=later) is None
    assert selectors.claim_view(row) == {"by": "claimer", "at": row.claimed_at}


# -- sorts ------------------------------------------------------------------------------


def test_sorts_newest_oldest_and_deadline_with_no_deadline_last():
    user = make_user()
    old_no_deadline = make_request(age=timedelta(hours=3))
    mid_late_deadline = make_request(age=timedelta(hours=2), expires_in=timedelta(hours=5))
    new_soon_deadline = make_request(age=timedelta(hours=1), expires_in=timedelta(minutes=10))
    newest_no_deadline = make_request()
    assert inbox(user) == ids(
        [newest_no_deadline, new_soon_deadline, mid_late_deadline, old_no_deadline]
    )
    assert inbox(user, sort="oldest") == ids(
        [old_no_deadline, mid_late_deadline, new_soon_deadline, newest_no_deadline]
    )
    assert inbox(user, sort="deadline") == ids(
        [new_soon_deadline, mid_late_deadline, newest_no_deadline, old_no_deadline]
    )
    assert selectors.request_ids_matching(
        InboxQuery(sort="deadline"), user_id=user.pk, limit=3
    ) == ids([new_soon_deadline, mid_late_deadline, newest_no_deadline])


def test_ids_matching_stop_at_the_newest_request_the_list_showed():
    """“All matching” takes the rows up to the list's newest when it was drawn (`upto`, a
    request pk: they only grow); what arrived after is counted apart, never decided."""
    user = make_user()
    first, second = make_request(), make_request()
    later = make_request()
    query = InboxQuery(sort="oldest")
    matching = selectors.request_ids_matching
    assert matching(query, user_id=user.pk, upto=second.pk) == ids([first, second])
    assert matching(query, user_id=user.pk) == ids([first, second, later])  # no cutoff
    assert matching(query, user_id=user.pk, upto=0) == []
    assert selectors.count_matching_after(query, user_id=user.pk, after=second.pk) == 1
    assert selectors.count_matching_after(query, user_id=user.pk, after=later.pk) == 0


# -- counts -----------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [1000, 4])  # the scope (5) counted in one pass, or capped
def test_counts_give_each_chip_with_the_other_filters(settings, cap):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    settings.TOOLNEXUS_INBOX_COUNT_CAP = cap
    me, other = make_user(), make_user()
    mine_late = make_request(prompt="refund late", expires_in=timedelta(minutes=-1))
    theirs = make_request(prompt="refund theirs")
    make_request(prompt="refund free", expires_in=timedelta(minutes=-1))
    hidden_mine = make_request(prompt="refund hidden")
    make_request(prompt="question nobody", kind="question")
    claim(mine_late, me)
    claim(theirs, other)
    claim(hidden_mine, me)
    services.request_hide(request_id=hidden_mine.request_id, user=me)

    assert counts(me) == {
        "matching": 4,
        "mine": 1,
        "unclaimed": 2,
        "routed": 0,
        "overdue": 2,
        "hidden": 1,
        "waiting": 4,  # the title's: pending less what I hid, whatever the filters
    }
    assert counts(me, q="refund") == {
        "matching": 3,
        "mine": 1,
        "unclaimed": 1,
        "routed": 0,
        "overdue": 2,
        "hidden": 1,
        "waiting": 4,
    }
    # with claim=mine on: matching is mine; the overdue and hidden chips keep claim=mine
    assert counts(me, claim="mine") == {
        "matching": 1,
        "mine": 1,
        "unclaimed": 2,
        "routed": 0,
        "overdue": 1,
        "hidden": 1,
        "waiting": 4,
    }
    assert counts(me, overdue=True) == {
        "matching": 2,
        "mine": 1,
        "unclaimed": 1,
        "routed": 0,
        "overdue": 2,
        "hidden": 0,
        "waiting": 4,
    }
    assert counts(me, hidden="only") == {
        "matching": 1,
        "mine": 1,
        "unclaimed": 0,
        "routed": 0,
        "overdue": 0,
        "hidden": 1,
        "waiting": 4,
    }
    assert counts(other)["hidden"] == 0 and counts(other)["matching"] == 5
    assert counts(other, q="refund")["waiting"] == 5
    # each count is what the list with that chip on holds
    assert counts(me, claim="mine")["matching"] == len(inbox(me, claim="mine"))
    assert counts(me, q="refund")["matching"] == len(inbox(me, q="refund"))


def test_counting_stops_past_the_cap_and_reads_as_more_than_it():
    me = make_user()
    rows = [make_request(prompt=f"refund {i}") for i in range(5)]
    for row in rows[:4]:
        services.request_hide(request_id=row.request_id, user=me)
    query = InboxQuery(q="refund")
    capped = selectors.inbox_counts(query, user_id=me.pk, cap=2)
    assert capped == {
        "matching": 1,  # under the cap: exact
        "mine": 0,
        "unclaimed": 1,
        "routed": 0,
        "overdue": 0,
        "hidden": 3,  # 4 hidden: counting stopped at cap + 1
        "waiting": 1,
    }
    assert selectors.inbox_counts(query, user_id=me.pk)["hidden"] == 4  # the default cap
    assert [selectors.count_label(n, cap=2) for n in (0, 2, 3)] == ["0", "2", "2+"]


# -- the filter menus' counts ------------------------------------------------------------------

MENUS = {
    "agent": ["", "demo", "demo2"],
    "kind": ["", "tool_call", "approval", "question"],
    "state": ["pending", "approved", "declined", "all"],
}


def option_counts(user, *, cap=None, hidden_agents=(), **query) -> dict[str, dict[str, int]]:
    return selectors.inbox_counts(
        InboxQuery(**query), user_id=user.pk, cap=cap, hidden_agents=hidden_agents, options=MENUS
    )["options"]


def decide(row: ApprovalRequest, state: str) -> None:
    ApprovalRequest.objects.filter(pk=row.pk).update(state=state, decided_at=timezone.now())


@pytest.fixture
def menu_rows(second_demo_agent):
    """Pending and decided requests of two agents and three kinds; `me` claimed one and hid
    one, another reviewer claimed one."""
    me, other = make_user(), make_user()
    rows = {
        "demo refund mine": make_request(prompt="refund mine"),
        "demo refund theirs": make_request(prompt="refund theirs"),
        "demo refund hidden": make_request(prompt="refund hidden"),
        "demo question": make_request(prompt="which refund?", kind="question"),
        "demo2 approval": make_request(agent="demo2", kind="approval", prompt="delete it"),
        "demo2 refund": make_request(agent="demo2", prompt="refund two"),
        "demo declined": make_request(prompt="refund declined"),
        "demo2 approved": make_request(agent="demo2", kind="approval", prompt="approved one"),
    }
    claim(rows["demo refund mine"], me)
    claim(rows["demo refund theirs"], other)
    services.request_hide(request_id=rows["demo refund hidden"].request_id, user=me)
    decide(rows["demo declined"], "declined")
    decide(rows["demo2 approved"], "approved")
    return me, rows


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"agent": "demo"},
        {"agent": "demo2", "kind": "approval"},
        {"state": "all", "q": "refund"},
        {"claim": "unclaimed"},
        {"claim": "mine", "state": "all"},
        {"hidden": "only"},
        {"state": "declined", "kind": "tool_call"},
        {"overdue": True},
        # a search: the options counted in one pass over what it finds
        {"q": "refund"},
        {"q": "refund", "agent": "demo2"},
        {"q": "refund", "claim": "mine", "state": "all"},
        {"q": "refund", "kind": "question", "claim": "unclaimed"},
        {"q": "refund", "overdue": True},
        {"q": "refund", "hidden": "only"},
    ],
)
def test_each_option_counts_what_the_list_shows_with_it_chosen(menu_rows, query):
    me, _ = menu_rows
    counted = option_counts(me, **query)
    assert list(counted) == ["agent", "kind", "state"]
    for menu, values in MENUS.items():
        assert list(counted[menu]) == values  # every option, in the menu's order
        for value in values:
            listed = inbox(me, **{**query, menu: value})
            assert counted[menu][value] == len(listed), (menu, value)


def test_option_counts_keep_the_other_filters(menu_rows):
    me, _ = menu_rows
    # agent demo: its pending rows less what I hid, whichever kind or state is chosen
    assert option_counts(me, agent="demo") == {
        "agent": {"": 5, "demo": 3, "demo2": 2},
        "kind": {"": 3, "tool_call": 2, "approval": 0, "question": 1},
        "state": {"pending": 3, "approved": 0, "declined": 1, "all": 4},
    }
    # unclaimed (the other reviewer's claim and mine are active): decided rows count too
    assert option_counts(me, claim="unclaimed", state="all") == {
        "agent": {"": 5, "demo": 2, "demo2": 3},
        "kind": {"": 5, "tool_call": 2, "approval": 2, "question": 1},
        "state": {"pending": 3, "approved": 1, "declined": 1, "all": 5},
    }
    # what I hid, counted among my hidden ones only
    assert option_counts(me, hidden="only") == {
        "agent": {"": 1, "demo": 1, "demo2": 0},
        "kind": {"": 1, "tool_call": 1, "approval": 0, "question": 0},
        "state": {"pending": 1, "approved": 0, "declined": 0, "all": 1},
    }


def test_option_counts_leave_out_hidden_agents(menu_rows):
    me, _ = menu_rows
    counted = option_counts(me, hidden_agents={"demo2"})
    assert counted["agent"] == {"": 3, "demo": 3, "demo2": 0}
    assert counted["kind"]["approval"] == 0 and counted["state"]["approved"] == 0


def test_option_counts_stop_past_the_cap_decided_history_too():
    me = make_user()
    for _ in range(4):
        make_request()
    for _ in range(5):
        decide(make_request(kind="question"), "declined")
    make_request(kind="approval")
    counted = option_counts(me, cap=2)
    assert counted["agent"] == {"": 3, "demo": 3, "demo2": 0}  # 5 pending: stopped at 3
    assert counted["kind"] == {"": 3, "tool_call": 3, "approval": 1, "question": 0}
    assert counted["state"] == {"pending": 3, "approved": 0, "declined": 3, "all": 3}
    exact = option_counts(me)
    assert exact["state"] == {"pending": 5, "approved": 0, "declined": 5, "all": 10}
    assert option_counts(me, cap=2, state="declined")["kind"]["question"] == 3
    assert [selectors.count_label(n, cap=2) for n in counted["state"].values()] == [
        "2+",
        "0",
        "2+",
        "2+",
    ]


def test_hidden_only_option_counts_either_way_stop_past_the_cap(second_demo_agent):
    """With hidden=only an option is counted from its own rows when it has few (no more than
    the cap), else from the viewer's hides: both ways give the same counts, capped."""
    me = make_user()
    for _ in range(4):
        services.request_hide(request_id=make_request().request_id, user=me)
    services.request_hide(request_id=make_request(kind="question").request_id, user=me)
    for _ in range(3):
        make_request(agent="demo2", kind="approval")  # not hidden: many rows, none of mine
    exact = {
        "agent": {"": 5, "demo": 5, "demo2": 0},
        "kind": {"": 5, "tool_call": 4, "approval": 0, "question": 1},
        "state": {"pending": 5, "approved": 0, "declined": 0, "all": 5},
    }
    assert option_counts(me, hidden="only") == exact
    assert option_counts(me, hidden="only", cap=2) == {
        menu: {value: min(n, 3) for value, n in counts.items()} for menu, counts in exact.items()
    }
    assert option_counts(me, hidden="only", cap=2, agent="demo2")["kind"] == {
        "": 0,
        "tool_call": 0,
        "approval": 0,
        "question": 0,
    }


def test_option_counts_ride_in_the_counts_two_queries(django_assert_num_queries):
    me = make_user()
    make_request()
    many = {
        "agent": ["", *(f"agent{i}" for i in range(30))],
        "kind": MENUS["kind"],
        "state": MENUS["state"],
    }
    for options in (None, MENUS, many):
        with django_assert_num_queries(2):
            selectors.inbox_counts(InboxQuery(), user_id=me.pk, options=options)


# What the search finds counted in one pass (its menus in one statement, the rest in
# another), or not (one statement more: then the options are counted one by one).
@pytest.mark.parametrize("cap, statements", [(1000, 2), (2, 3)])
def test_a_searchs_option_counts_match_option_by_option(
    menu_rows, django_assert_num_queries, monkeypatch, cap, statements
):
    me, _ = menu_rows
    queries = [{"q": "refund"}, {"q": "refund", "agent": "demo", "state": "all"}]
    for query in queries:
        with django_assert_num_queries(statements):
            counted = selectors.inbox_counts(
                InboxQuery(**query), user_id=me.pk, cap=cap, options=MENUS, newest=True
            )
        monkeypatch.setattr(count_statements, "_options_of_a_search", lambda *a, **k: None)
        assert (
            selectors.inbox_counts(
                InboxQuery(**query), user_id=me.pk, cap=cap, options=MENUS, newest=True
            )
            == counted  # every count, not the menus' alone
        )
        monkeypatch.undo()


@pytest.mark.parametrize("cap", [1000, 2])  # the scope counted in one pass, or capped
def test_newest_is_the_highest_pk_the_list_matches_in_the_counts_two_queries(
    settings, django_assert_num_queries, cap
):
    """The bulk bar's cutoff for "all matching": the newest request the list matches when it
    is drawn, read in the counts' two statements; 0 when nothing matches."""
    settings.TOOLNEXUS_INBOX_COUNT_CAP = cap
    me = make_user()
    make_request(prompt="refund older")
    hidden = make_request(prompt="refund hidden")
    newest = make_request(prompt="refund newest")
    make_request(prompt="which plan?", kind="question")  # newer, not matching the search
    declined = make_request(prompt="refund declined")
    ApprovalRequest.objects.filter(pk=declined.pk).update(
        state="declined", decided_at=timezone.now()
    )
    services.request_hide(request_id=hidden.request_id, user=me)

    def newest_of(*, more: bool = False, **query) -> int:
        # A search that finds more than the cap (3 rows in any state, with cap 2) takes one
        # statement more: its menus are then counted option by option.
        with django_assert_num_queries(3 if more and cap == 2 else 2):
            found = selectors.inbox_counts(
                InboxQuery(**query), user_id=me.pk, options=MENUS, newest=True
            )
        return found["newest"]

    assert newest_of(q="refund", more=True) == newest.pk
    assert newest_of(q="refund", hidden="only") == hidden.pk
    assert newest_of(q="refund", state="declined", more=True) == declined.pk
    assert newest_of(q="refund", claim="mine") == 0
    assert "newest" not in counts(me)  # only when asked


@pytest.mark.parametrize(
    "query, queries",
    [
        # rows, calls, counts (the scope, then the rest; a search that finds few: its
        # menus, then the rest), ids
        (InboxQuery(q="refund", claim="unclaimed", sort="deadline"), 5),
        (InboxQuery(claim="unclaimed", sort="deadline"), 5),
    ],
)
def test_query_counts_do_not_grow_with_rows(django_assert_num_queries, query, queries):
    user = make_user()

    def read() -> None:
        rows = selectors.inbox_page(query, user_id=user.pk, start=0, stop=20)
        for row in rows:
            selectors.active_claim(row)
            assert [c.tool_name for c in row.call_list()] == ["refund"]
            assert row.run.prompt
        selectors.inbox_counts(query, user_id=user.pk, options=MENUS)  # the menus' too
        selectors.request_ids_matching(query, user_id=user.pk)

    for _ in range(2):
        row = make_request(expires_in=timedelta(hours=1))
        claim(row, make_user(), minutes_ago=60)  # lapsed: unclaimed, and joined
    with django_assert_num_queries(queries):
        read()
    for _ in range(15):
        make_request()
    with django_assert_num_queries(queries):
        read()


@pytest.mark.parametrize(
    "query", [{"q": "refund"}, {"q": "refund", "claim": "mine"}, {"q": "refund", "overdue": True}]
)
def test_a_search_finding_few_of_a_large_scope_still_counts_each_up_to_the_cap(
    django_assert_num_queries, monkeypatch, query
):
    """What a search finds passes the query's claim, overdue and hidden filters; the scope it
    searches does not: 1 found of 6 in scope (5 hidden by the viewer, claimed by another),
    with cap 2, the chips stop past the cap as without the search's menu statement."""
    me, other = make_user(), make_user()
    rows = [make_request(prompt=f"refund {i}") for i in range(6)]
    for row in rows[:5]:
        services.request_hide(request_id=row.request_id, user=me)
        claim(row, other)

    def counted() -> dict:
        return selectors.inbox_counts(
            InboxQuery(**query), user_id=me.pk, cap=2, options=MENUS, newest=True
        )

    with django_assert_num_queries(2):
        found = counted()
    assert found["waiting"] == 1
    if query == {"q": "refund"}:
        assert found["hidden"] == 3  # 5 hidden: stopped at cap + 1
    assert all(n <= 3 for name, n in found.items() if name not in ("options", "newest"))
    monkeypatch.setattr(count_statements, "_options_of_a_search", lambda *a, **k: None)
    assert counted() == found  # option by option: the same counts, every one


# -- counting statements compiled once per shape -----------------------------------------------

BUILDERS = [
    count_statements._first_statement,
    count_statements._search_options_statement,
    count_statements._one_pass_statement,
    count_statements._one_pass_with_waiting,
    count_statements._each_capped_with_waiting,
    count_statements._each_capped_statement,
]


@pytest.mark.parametrize("claim_minutes", [30, 0])  # claims lapse (a second moment), or not
@pytest.mark.parametrize(
    "query",
    [
        InboxQuery(),
        InboxQuery(q="refund", claim="unclaimed", sort="deadline"),
        InboxQuery(claim="mine", overdue=True, state="all"),
        InboxQuery(hidden="only", agent="demo", kind="question"),
        InboxQuery(q="refund", hidden="only", claim="unclaimed", overdue=True),
    ],
)
def test_a_statement_compiled_once_binds_to_each_moment_as_if_compiled_then(
    settings, query, claim_minutes
):
    """A count's statement is compiled at a stand-in moment and bound to each `now`: the
    result is the very statement the ORM compiles at that `now` (SQL and parameters), for
    every shape of count."""
    settings.TOOLNEXUS_CLAIM_MINUTES = claim_minutes
    shape = sql._CountShape(
        query=query,
        user_id=7,
        hidden_agents=("demo2",),
        cap=50,
        options=tuple((menu, tuple(values)) for menu, values in MENUS.items()),
        newest=True,
    )
    for now in (timezone.now(), timezone.now() - timedelta(days=3, microseconds=17)):
        for build in BUILDERS:
            fresh = build(shape, now)
            bound = build(shape, sql._STAND_IN_NOW).sql.at(now)
            assert (bound.sql, bound.params) == (fresh.sql.sql, fresh.sql.params), build


def test_counts_follow_the_moment_they_are_asked_at():
    """The same count asked at two moments (one compiled statement): a snooze and a claim
    that have lapsed by the later one no longer count."""
    me, other = make_user(), make_user()
    snoozed, claimed, _ = make_request(), make_request(), make_request()
    now = timezone.now()
    services.request_hide(request_id=snoozed.request_id, user=me, until=now + timedelta(hours=1))
    claim(claimed, other)
    later = now + timedelta(hours=2)  # past the snooze and the 30-minute claim
    query = InboxQuery()
    assert selectors.inbox_counts(query, user_id=me.pk, now=now) == {
        "matching": 2,
        "mine": 0,
        "unclaimed": 1,
        "routed": 0,
        "overdue": 0,
        "hidden": 1,
        "waiting": 2,
    }
    assert selectors.inbox_counts(query, user_id=me.pk, now=later) == {
        "matching": 3,
        "mine": 0,
        "unclaimed": 3,
        "routed": 0,
        "overdue": 0,
        "hidden": 0,
        "waiting": 3,
    }


def test_a_changed_claim_time_is_a_statement_of_its_own(settings):
    """The claim time shapes the SQL (a cutoff, or none when claims never lapse): counts of
    the same query follow a change of it."""
    me, other = make_user(), make_user()
    claim(make_request(), other, minutes_ago=60)
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    assert selectors.inbox_counts(InboxQuery(), user_id=me.pk)["unclaimed"] == 1  # lapsed
    settings.TOOLNEXUS_CLAIM_MINUTES = 0
    assert selectors.inbox_counts(InboxQuery(), user_id=me.pk)["unclaimed"] == 0  # never
    settings.TOOLNEXUS_CLAIM_MINUTES = 90
    assert selectors.inbox_counts(InboxQuery(), user_id=me.pk)["unclaimed"] == 0  # active


# -- a run page's reads ------------------------------------------------------------------


def test_run_requests_read_each_request_with_its_calls_decider_starter_and_run():
    from approvals.models import RequestCall, Run

    starter, decider = make_user(username="starter"), make_user(username="decider")
    first = make_request(age=timedelta(minutes=2))
    run = first.run
    Run.objects.filter(pk=run.pk).update(started_by=starter)
    first.calls.create(position=1, call_id="second", tool_name="email", input={"to": "x"})
    ApprovalRequest.objects.filter(pk=first.pk).update(
        state="declined", decided_by=decider, decided_at=timezone.now()
    )
    later = ApprovalRequest.objects.create(
        run=run, agent="demo", request_id="later", kind="question", prompt="Why?"
    )
    fresh = selectors.run_row(run.pk)
    rows = selectors.run_requests(fresh)
    assert [r.pk for r in rows] == [first.pk, later.pk]
    assert fresh.started_by == starter
    assert rows[0].decided_by == decider and rows[1].decided_by is None
    assert [c.call_id for c in rows[0].call_list()] == [first.call_list()[0].call_id, "second"]
    assert rows[1].call_list() == []
    assert all(c.request is rows[0] for c in rows[0].call_list())
    assert all(r.run is fresh for r in rows)
    assert isinstance(rows[0].call_list()[1], RequestCall)
    assert selectors.run_row(run.pk + 1000) is None


def test_a_run_without_requests_still_has_its_starter_read():
    from approvals.models import Run

    starter = make_user(username="lonely-starter")
    run = Run.objects.create(agent="demo", prompt="p", started_by=starter)
    fresh = selectors.run_row(run.pk)
    assert selectors.run_requests(fresh) == []
    assert fresh.started_by == starter


def test_the_pending_count_compiled_once_follows_hidden_agents_and_the_cap(settings):
    for agent in ("demo", "demo", "other"):
        make_request(agent=agent)
    decided = make_request(agent="demo")
    ApprovalRequest.objects.filter(pk=decided.pk).update(
        state="declined", decided_at=timezone.now()
    )
    assert selectors.pending_count() == 3
    assert selectors.pending_count(hidden_agents={"demo"}) == 1
    assert selectors.pending_count(hidden_agents=["other", "demo"]) == 0
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 1
    assert selectors.pending_count() == 2  # stops at the cap + 1: "1+"
    make_request(agent="other")
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 1000
    assert selectors.pending_count(hidden_agents={"demo"}) == 2  # a new row is counted
