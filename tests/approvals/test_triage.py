"""The triage inbox's data layer (issue 14): InboxQuery, search, filters, sorts, counts,
per-reviewer snooze / ignore, claims, bulk decisions, and their API endpoints."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import events, selectors, services
from approvals.domain.exceptions import AlreadyDecided, ClaimedByOther, InvalidInput, NotAllowed
from approvals.models import (
    AgentAccess,
    AgentPolicy,
    ApprovalRequest,
    Event,
    RequestHide,
    Run,
)
from approvals.selectors import InboxQuery
from approvals.services import bulk as bulk_module

from .factories import make_user, post_json, session_client, start_and_halt

pytestmark = pytest.mark.django_db

_ids = iter(range(1, 1_000_000))


def make_request(
    *,
    prompt: str = "Refund order A-1",
    agent: str = "demo",
    kind: str = "tool_call",
    tool: str = "refund",
    arguments: str | None = None,
    input: dict | None = None,
    expires_in: timedelta | None = None,
    age: timedelta = timedelta(0),
    run_prompt: str = "",
) -> ApprovalRequest:
    """A pending request made directly (no model turn), `age` old, with one call."""
    n = next(_ids)
    input = input if input is not None else {"order": f"A-{n}", "amount": 5}
    run = Run.objects.create(agent=agent, prompt=run_prompt or prompt, status="pending")
    if kind == "tool_call":
        data = {
            "calls": [{"id": f"c{n}", "name": tool, "input": input, "arguments": arguments or ""}]
        }
    elif kind == "approval":
        data = {"callId": f"c{n}", "tool": tool, "input": input, "arguments": arguments or ""}
    else:
        data = None
    row = ApprovalRequest.objects.create(
        run=run,
        agent=agent,
        request_id=f"req-{n}",
        kind=kind,
        prompt=prompt,
        data=data,
        expires_at=timezone.now() + expires_in if expires_in is not None else None,
    )
    if data is not None:
        row.calls.create(position=0, call_id=f"c{n}", tool_name=tool, input=input)
    if age:
        ApprovalRequest.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)
        row.refresh_from_db()
    return row


def ids(rows) -> list[str]:
    return [r.request_id for r in rows]


def inbox(user, **query) -> list[str]:
    return ids(selectors.inbox_requests(InboxQuery(**query), user_id=user.pk))


def counts(user, **query) -> dict[str, int]:
    return selectors.inbox_counts(InboxQuery(**query), user_id=user.pk)


def claim(row: ApprovalRequest, user, *, minutes_ago: float = 0) -> None:
    """Test-only: put a claim on the row directly, `minutes_ago` old."""
    ApprovalRequest.objects.filter(pk=row.pk).update(
        claimed_by=user, claimed_at=timezone.now() - timedelta(minutes=minutes_ago)
    )


# -- InboxQuery ----------------------------------------------------------------------------


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


# -- search --------------------------------------------------------------------------------


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


def test_search_text_is_filled_from_a_real_halt_and_found():
    user = make_user()
    run = start_and_halt(prompt="Delete account acct-9", user=user)
    row = run.requests.get()
    assert "acct-9" in row.search_text and "delete_account" in row.search_text
    assert inbox(user, q="ACCT-9") == [row.request_id]


def test_search_text_is_capped_and_lowercased():
    from approvals.models import SEARCH_TEXT_CHARS, search_text_of

    text = search_text_of(
        agent="Demo",
        kind="approval",
        prompt="Ä" + "x" * 20_000,
        data={"callId": "c1", "tool": "Wipe", "input": {"Who": "Ünïcode"}},
    )
    assert text.startswith("demo\nä") and len(text) == SEARCH_TEXT_CHARS
    short = search_text_of(
        agent="demo", kind="approval", prompt="p", data={"tool": "Wipe", "input": {"Who": "Ü"}}
    )
    assert short == 'demo\np\nwipe\n{"who": "ü"}'


@pytest.mark.postgres
def test_postgres_has_the_trigram_and_covering_indexes(on_postgres):
    if not on_postgres:
        pytest.skip("needs PostgreSQL (set DATABASE_URL)")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s",
            ["approvals_approvalrequest"],
        )
        indexes = dict(cursor.fetchall())
    assert "gin_trgm_ops" in indexes["req_search_trgm"]
    assert "INCLUDE (id, claimed_by_id, claimed_at, expires_at)" in indexes["req_inbox_counts"]
    # a search is served by the trigram index once the table is large enough to prefer it
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = InboxQuery(q="zanzibar", state="all")
        explained = selectors.inbox_requests(plan, user_id=None).order_by().explain()
    assert "req_search_trgm" in explained


# -- filters -------------------------------------------------------------------------------


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


# -- hiding: snooze and ignore, per reviewer -----------------------------------------------


def test_snooze_and_ignore_hide_only_for_that_reviewer_until_then():
    me, other = make_user(), make_user()
    snoozed, ignored, shown = make_request(), make_request(), make_request()
    until = timezone.now() + timedelta(hours=1)
    services.request_hide(request_id=snoozed.request_id, user=me, until=until)
    services.request_hide(request_id=ignored.request_id, user=me)

    assert inbox(me) == [shown.request_id]
    assert set(inbox(other)) == {snoozed.request_id, ignored.request_id, shown.request_id}
    hidden = {
        r.request_id: r for r in selectors.inbox_requests(InboxQuery(hidden="only"), user_id=me.pk)
    }
    assert set(hidden) == {snoozed.request_id, ignored.request_id}
    assert (
        hidden[snoozed.request_id].viewer_hidden
        and hidden[snoozed.request_id].hidden_until == until
    )
    assert (
        hidden[ignored.request_id].viewer_hidden and hidden[ignored.request_id].hidden_until is None
    )
    assert counts(me)["hidden"] == 2 and counts(other)["hidden"] == 0
    (row,) = selectors.inbox_requests(InboxQuery(), user_id=me.pk)
    assert row.viewer_hidden is False and row.hidden_until is None

    # a snooze that has run out shows the request again; un-hiding shows an ignored one
    RequestHide.objects.filter(request=snoozed).update(until=timezone.now() - timedelta(seconds=1))
    assert set(inbox(me)) == {snoozed.request_id, shown.request_id}
    services.request_unhide(request_id=ignored.request_id, user=me)
    assert set(inbox(me)) == {snoozed.request_id, ignored.request_id, shown.request_id}
    services.request_unhide(request_id=ignored.request_id, user=me)  # nothing hidden: no-op


def test_hiding_again_replaces_the_end_and_bad_ends_are_refused():
    me = make_user()
    row = make_request()
    services.request_hide(request_id=row.request_id, user=me)
    later = timezone.now() + timedelta(minutes=5)
    services.request_hide(request_id=row.request_id, user=me, until=later)
    assert RequestHide.objects.get(request=row, user=me).until == later
    with pytest.raises(InvalidInput, match="until: must be in the future"):
        services.request_hide(
            request_id=row.request_id, user=me, until=timezone.now() - timedelta(minutes=1)
        )
    with pytest.raises(InvalidInput, match="until: give a time zone"):
        services.request_hide(
            request_id=row.request_id,
            user=me,
            until=(timezone.now() + timedelta(hours=1)).replace(tzinfo=None),
        )


def test_hiding_needs_the_view_permission_and_a_visible_agent():
    row = make_request()
    with pytest.raises(NotAllowed):
        services.request_hide(request_id=row.request_id, user=make_user(role="nobody"))
    services.request_hide(request_id=row.request_id, user=make_user(role="watcher"))  # may view
    group = Group.objects.create(name="Others")
    policy = AgentPolicy.objects.create(agent="demo")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    with pytest.raises(ApprovalRequest.DoesNotExist):
        services.request_hide(request_id=row.request_id, user=make_user())


# -- sorts ---------------------------------------------------------------------------------


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


# -- counts --------------------------------------------------------------------------------


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
        "overdue": 2,
        "hidden": 1,
        "waiting": 4,  # the title's: pending less what I hid, whatever the filters
    }
    assert counts(me, q="refund") == {
        "matching": 3,
        "mine": 1,
        "unclaimed": 1,
        "overdue": 2,
        "hidden": 1,
        "waiting": 4,
    }
    # with claim=mine on: matching is mine; the overdue and hidden chips keep claim=mine
    assert counts(me, claim="mine") == {
        "matching": 1,
        "mine": 1,
        "unclaimed": 2,
        "overdue": 1,
        "hidden": 1,
        "waiting": 4,
    }
    assert counts(me, overdue=True) == {
        "matching": 2,
        "mine": 1,
        "unclaimed": 1,
        "overdue": 2,
        "hidden": 0,
        "waiting": 4,
    }
    assert counts(me, hidden="only") == {
        "matching": 1,
        "mine": 1,
        "unclaimed": 0,
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
        "overdue": 0,
        "hidden": 3,  # 4 hidden: counting stopped at cap + 1
        "waiting": 1,
    }
    assert selectors.inbox_counts(query, user_id=me.pk)["hidden"] == 4  # the default cap
    assert [selectors.count_label(n, cap=2) for n in (0, 2, 3)] == ["0", "2", "2+"]


def test_a_page_past_the_count_cap_says_more_and_every_page_stays_reachable(settings):
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 30
    user = make_user(role="reviewer")
    made = [make_request(age=timedelta(minutes=100 - i)) for i in range(65)]
    client = session_client(user)
    html = client.get("/").content.decode()
    assert "<title>(30+) Inbox · " in html
    assert ">30+ requests pending</p>" in html
    assert 'data-pending="30+"' in html
    assert "page 1</span>" in html and 'rel="next"' in html  # no "of N": not counted
    third = client.get("/?page=4").content.decode()  # past the counted pages: still there
    assert f'data-request-id="{made[4].request_id}"' in third
    assert 'rel="prev"' in third


def test_query_counts_do_not_grow_with_rows(django_assert_num_queries):
    user = make_user()
    query = InboxQuery(q="refund", claim="unclaimed", sort="deadline")

    def read() -> None:
        rows = list(selectors.inbox_requests(query, user_id=user.pk)[:20])
        for row in rows:
            selectors.active_claim(row)
            assert [c.tool_name for c in row.calls.all()] == ["refund"]
            assert row.run.prompt
        selectors.inbox_counts(query, user_id=user.pk)
        selectors.request_ids_matching(query, user_id=user.pk)

    for _ in range(2):
        row = make_request(expires_in=timedelta(hours=1))
        claim(row, make_user(), minutes_ago=60)  # lapsed: unclaimed, and joined
    with django_assert_num_queries(5):  # rows, calls, counts (scope, then the rest), ids
        read()
    for _ in range(15):
        make_request()
    with django_assert_num_queries(5):
        read()


# -- claims --------------------------------------------------------------------------------


@pytest.fixture
def announced():
    """The (run_id, request_pk) of every change announced after commit."""
    heard: list[tuple[int, int | None]] = []

    def receiver(sender, run_id, request_pk, **kwargs):
        heard.append((run_id, request_pk))

    events.changed.connect(receiver)
    yield heard
    events.changed.disconnect(receiver)


def _actions(row) -> list[str]:
    return list(Event.objects.filter(request=row).order_by("id").values_list("action", flat=True))


def test_claim_release_and_takeover_are_audited_and_announced(
    django_capture_on_commit_callbacks, announced, settings
):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    ann, bob = make_user(username="ann"), make_user(username="bob")
    row = make_request()
    with django_capture_on_commit_callbacks(execute=True):
        claimed = services.request_claim(request_id=row.request_id, user=ann)
    assert claimed.claimed_by == ann and claimed.claimed_at is not None
    assert announced == [(row.run_id, row.pk)]

    with pytest.raises(ClaimedByOther, match="claimed by ann") as caught:
        services.request_claim(request_id=row.request_id, user=bob)
    assert caught.value.claimed_by == "ann" and caught.value.status == 409
    with pytest.raises(ClaimedByOther, match="claimed by ann"):
        services.request_release(request_id=row.request_id, user=bob)

    # claiming again refreshes one's own claim, without another audit event
    first = claimed.claimed_at
    again = services.request_claim(request_id=row.request_id, user=ann)
    assert again.claimed_at >= first and _actions(row) == ["claimed"]

    taken = services.request_claim(request_id=row.request_id, user=bob, takeover=True)
    assert taken.claimed_by == bob
    event = Event.objects.get(request=row, action="claim taken over")
    assert event.actor == bob and event.detail["previous"] == "ann"

    with django_capture_on_commit_callbacks(execute=True):
        released = services.request_release(request_id=row.request_id, user=bob)
    assert released.claimed_by is None and released.claimed_at is None
    assert _actions(row) == ["claimed", "claim taken over", "released"]
    assert announced[-1] == (row.run_id, row.pk)
    services.request_release(request_id=row.request_id, user=bob)  # nothing held: no-op
    assert _actions(row) == ["claimed", "claim taken over", "released"]


def test_a_lapsed_claim_is_replaced_without_takeover(settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    ann, bob = make_user(username="ann2"), make_user()
    row = make_request()
    claim(row, ann, minutes_ago=45)
    taken = services.request_claim(request_id=row.request_id, user=bob)
    assert taken.claimed_by == bob
    assert _actions(row) == ["claimed"]


def test_claim_needs_decide_rights_and_a_pending_request():
    row = make_request()
    with pytest.raises(NotAllowed):
        services.request_claim(request_id=row.request_id, user=make_user(role="watcher"))
    group = Group.objects.create(name="Watch demo")
    policy = AgentPolicy.objects.create(agent="demo")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=False)
    viewer = make_user()
    viewer.groups.add(group)
    viewer = type(viewer).objects.get(pk=viewer.pk)
    with pytest.raises(NotAllowed, match="may not decide requests of agent 'demo'"):
        services.request_claim(request_id=row.request_id, user=viewer)
    with pytest.raises(ApprovalRequest.DoesNotExist):  # hidden from a non-member
        services.request_claim(request_id=row.request_id, user=make_user())
    with pytest.raises(ApprovalRequest.DoesNotExist):
        services.request_claim(request_id="no-such-request", user=make_user(role="superuser"))

    admin = make_user(role="superuser")
    services.request_decline(request_id=row.request_id, user=admin, reason="no")
    with pytest.raises(AlreadyDecided):
        services.request_claim(request_id=row.request_id, user=admin)


def test_deciding_keeps_the_claim_as_history():
    user = make_user()
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    services.request_claim(request_id=row.request_id, user=user)
    services.request_decline(request_id=row.request_id, user=user, reason="no")
    row.refresh_from_db()
    assert row.state == "declined" and row.claimed_by == user
    assert selectors.active_claim(row) is None


# -- bulk ----------------------------------------------------------------------------------


def _halted(prompt: str, starter) -> ApprovalRequest:
    return start_and_halt(prompt=prompt, user=starter).requests.get()


def test_bulk_approve_outcomes_per_kind():
    starter, reviewer = make_user(), make_user()
    refund = _halted("Refund order A-5, $10", starter)  # relay call with an executor
    delete = make_request(kind="approval", tool="delete_account", prompt="Close account 3?")
    irreversible = _halted("Delete account acct-3", starter)  # "This cannot be undone."
    question = _halted("question", starter)
    two = _halted("email two", starter)  # refund (executor) + send_email (none)
    results = services.requests_bulk(
        request_ids=[
            refund.request_id,
            delete.request_id,
            question.request_id,
            two.request_id,
            "nope",
            refund.request_id,
        ],
        user=reviewer,
        action="approve",
    )
    by_id = {r.request_id: r for r in results}
    assert [r.request_id for r in results] == [
        refund.request_id,
        delete.request_id,
        question.request_id,
        two.request_id,
        "nope",
    ]  # once per id, in order
    assert by_id[refund.request_id].status == "done"
    assert by_id[delete.request_id].status == "done"
    assert by_id[question.request_id].status == "invalid"
    assert "typed on its card" in by_id[question.request_id].message
    again = services.requests_bulk(
        request_ids=[irreversible.request_id], user=reviewer, action="approve"
    )
    assert again[0].status == "invalid" and "cannot be undone" in again[0].message
    assert ApprovalRequest.objects.get(pk=irreversible.pk).state == "pending"
    assert by_id[two.request_id].status == "invalid"
    assert "send_email has no executor" in by_id[two.request_id].message
    assert by_id["nope"].status == "missing"
    states = dict(ApprovalRequest.objects.values_list("request_id", "state"))
    assert states[refund.request_id] == "approved" and states[delete.request_id] == "approved"
    assert states[question.request_id] == "pending" and states[two.request_id] == "pending"
    assert ApprovalRequest.objects.get(pk=refund.pk).decided_by == reviewer


def test_bulk_decline_takes_every_kind_with_one_reason():
    starter, reviewer = make_user(), make_user()
    rows = [_halted(p, starter) for p in ("Refund order A-6", "question", "email two")]
    results = services.requests_bulk(
        request_ids=[r.request_id for r in rows], user=reviewer, action="decline", reason="batch"
    )
    assert [r.status for r in results] == ["done", "done", "done"]
    assert set(ApprovalRequest.objects.values_list("state", "reason")) == {("declined", "batch")}


def test_bulk_leaves_a_request_another_reviewer_claimed(settings):
    starter, me, rita = make_user(), make_user(), make_user(username="rita")
    theirs = _halted("Refund order A-17", starter)
    mine = _halted("Refund order A-18", starter)
    free = _halted("Refund order A-19", starter)
    services.request_claim(request_id=theirs.request_id, user=rita)
    services.request_claim(request_id=mine.request_id, user=me)
    for action in ("approve", "decline"):
        results = services.requests_bulk(
            request_ids=[theirs.request_id], user=me, action=action, reason="batch"
        )
        assert results[0].status == "invalid"
        assert "claimed by rita" in results[0].message
    assert ApprovalRequest.objects.get(pk=theirs.pk).state == "pending"
    results = services.requests_bulk(
        request_ids=[mine.request_id, free.request_id], user=me, action="approve"
    )
    assert [r.status for r in results] == ["done", "done"]  # my own claim, and no claim
    # a lapsed claim no longer holds the request back
    settings.TOOLNEXUS_CLAIM_MINUTES = 1
    ApprovalRequest.objects.filter(pk=theirs.pk).update(
        claimed_at=timezone.now() - timedelta(minutes=5)
    )
    results = services.requests_bulk(request_ids=[theirs.request_id], user=me, action="approve")
    assert results[0].status == "done"


def test_bulk_reports_a_request_someone_else_decided_first(monkeypatch):
    starter, me, rita = make_user(), make_user(), make_user(username="rita")
    first = _halted("Refund order A-7", starter)
    second = _halted("Refund order A-8", starter)
    real_approve = bulk_module.request_approve

    def approve_racing(*, request_id, user):
        # rita declines the second one after the batch read it as pending
        if request_id == first.request_id:
            services.request_decline(request_id=second.request_id, user=rita, reason="mine")
        return real_approve(request_id=request_id, user=user)

    monkeypatch.setattr(bulk_module, "request_approve", approve_racing)
    results = services.requests_bulk(
        request_ids=[first.request_id, second.request_id], user=me, action="approve"
    )
    assert [r.status for r in results] == ["done", "already"]
    assert "declined by rita" in results[1].message
    assert ApprovalRequest.objects.get(pk=second.pk).decided_by == rita


def test_bulk_forbidden_for_the_starter_rule_and_hidden_agents_are_missing(
    settings, second_demo_agent
):
    settings.TOOLNEXUS_STARTER_CANNOT_APPROVE = True
    starter = make_user()
    own = _halted("Refund order A-9", starter)
    hidden = start_and_halt(
        agent="demo2", prompt="Refund order A-10", user=make_user()
    ).requests.get()
    group = Group.objects.create(name="demo2 people")
    policy = AgentPolicy.objects.create(agent="demo2")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)
    starter = type(starter).objects.get(pk=starter.pk)
    results = services.requests_bulk(
        request_ids=[own.request_id, hidden.request_id], user=starter, action="approve"
    )
    assert [r.status for r in results] == ["forbidden", "missing"]
    assert "second reviewer" in results[0].message
    assert ApprovalRequest.objects.filter(state="pending").count() == 2


def test_bulk_input_is_checked_first():
    user = make_user()
    with pytest.raises(InvalidInput, match="action: must be approve or decline"):
        services.requests_bulk(request_ids=["a"], user=user, action="maybe")
    with pytest.raises(InvalidInput, match="at most 500"):
        services.requests_bulk(
            request_ids=[f"r{i}" for i in range(501)], user=user, action="decline"
        )
    with pytest.raises(InvalidInput, match="ids: give at least one"):
        services.requests_bulk(request_ids=[], user=user, action="decline")
    with pytest.raises(NotAllowed):
        services.requests_bulk(request_ids=["a"], user=make_user(role="watcher"), action="decline")


# -- API -----------------------------------------------------------------------------------


def test_api_list_search_sort_and_filters(settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    user = make_user()
    client = session_client(user)
    old = make_request(
        prompt="refund old", age=timedelta(hours=2), expires_in=timedelta(minutes=-1)
    )
    new = make_request(prompt="Refund new", expires_in=timedelta(hours=1))
    make_request(prompt="question", kind="question")
    claim(new, user)

    def listed(query: str) -> list[str]:
        response = client.get(f"/api/requests?{query}")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["count"] == len(body["items"])
        return [i["request"]["id"] for i in body["items"]]

    assert listed("q=REFUND") == [new.request_id, old.request_id]
    assert listed("q=refund&sort=oldest") == [old.request_id, new.request_id]
    assert listed("sort=deadline")[:2] == [old.request_id, new.request_id]  # overdue first
    assert listed("claim=mine") == [new.request_id]
    assert listed("overdue=true") == [old.request_id]
    claimed = client.get(f"/api/requests/{new.request_id}").json()["claim"]
    assert claimed["by"] == user.get_username() and claimed["at"]
    assert client.get(f"/api/requests/{old.request_id}").json()["claim"] is None
    client.post(f"/api/requests/{old.request_id}/ignore")
    assert old.request_id not in listed("")
    assert listed("hidden=only") == [old.request_id]

    for bad, field in (
        ("sort=random", "sort"),
        ("claim=theirs", "claim"),
        ("hidden=all", "hidden"),
    ):
        response = client.get(f"/api/requests?{bad}")
        assert response.status_code == 400 and response.json()["detail"].startswith(f"{field}:")


def test_api_claim_release_and_409_naming_the_holder():
    ann, bob = make_user(username="ann3"), make_user(username="bob3")
    row = make_request()
    a, b = session_client(ann), session_client(bob)
    response = post_json(a, f"/api/requests/{row.request_id}/claim")
    assert response.status_code == 200 and response.json()["claim"]["by"] == "ann3"
    response = post_json(b, f"/api/requests/{row.request_id}/claim", {"takeover": False})
    assert response.status_code == 409 and "claimed by ann3" in response.json()["detail"]
    response = post_json(b, f"/api/requests/{row.request_id}/release")
    assert response.status_code == 409
    response = post_json(b, f"/api/requests/{row.request_id}/claim", {"takeover": True})
    assert response.status_code == 200 and response.json()["claim"]["by"] == "bob3"
    response = post_json(b, f"/api/requests/{row.request_id}/release")
    assert response.status_code == 200 and response.json()["claim"] is None
    assert post_json(b, "/api/requests/nope/claim").status_code == 404
    watcher = session_client(make_user(role="watcher"))
    assert post_json(watcher, f"/api/requests/{row.request_id}/claim").status_code == 403
    response = post_json(a, f"/api/requests/{row.request_id}/claim", {"takeover": "yes"})
    assert response.status_code == 400 and response.json()["detail"].startswith("takeover")


def test_api_snooze_ignore_unhide():
    user = make_user()
    client = session_client(user)
    row = make_request()
    url = f"/api/requests/{row.request_id}"
    response = post_json(client, f"{url}/snooze", {"minutes": 30})
    body = response.json()
    assert response.status_code == 200 and body["hidden"] is True and body["until"]
    assert RequestHide.objects.get(request=row, user=user).until > timezone.now()
    until = (timezone.now() + timedelta(days=1)).isoformat()
    assert post_json(client, f"{url}/snooze", {"until": until}).status_code == 200
    for bad in ({}, {"minutes": 5, "until": until}, {"minutes": 0}):
        response = post_json(client, f"{url}/snooze", bad)
        assert response.status_code == 400, bad
    past = (timezone.now() - timedelta(days=1)).isoformat()
    response = post_json(client, f"{url}/snooze", {"until": past})
    assert response.status_code == 400 and "future" in response.json()["detail"]
    response = post_json(client, f"{url}/ignore")
    assert response.json() == {"id": row.request_id, "hidden": True, "until": None}
    response = post_json(client, f"{url}/unhide")
    assert response.json() == {"id": row.request_id, "hidden": False, "until": None}
    assert not RequestHide.objects.exists()
    assert post_json(client, "/api/requests/nope/ignore").status_code == 404


def test_api_bulk():
    starter, user = make_user(), make_user()
    client = session_client(user)
    refund = _halted("Refund order A-11", starter)
    question = _halted("question", starter)
    response = post_json(
        client,
        "/api/requests/bulk",
        {"ids": [refund.request_id, question.request_id, "nope"], "action": "approve"},
    )
    assert response.status_code == 200, response.content
    assert [(r["id"], r["status"]) for r in response.json()["results"]] == [
        (refund.request_id, "done"),
        (question.request_id, "invalid"),
        ("nope", "missing"),
    ]
    response = post_json(
        client,
        "/api/requests/bulk",
        {"ids": [question.request_id], "action": "decline", "reason": "x"},
    )
    assert response.json()["results"][0]["status"] == "done"
    response = post_json(client, "/api/requests/bulk", {"ids": ["a"], "action": "maybe"})
    assert response.status_code == 400 and response.json()["detail"].startswith("action")
    response = post_json(
        client, "/api/requests/bulk", {"ids": [f"r{i}" for i in range(501)], "action": "decline"}
    )
    assert response.status_code == 400 and response.json()["detail"].startswith("ids")
    watcher = session_client(make_user(role="watcher"))
    response = post_json(watcher, "/api/requests/bulk", {"ids": ["a"], "action": "decline"})
    assert response.status_code == 403


def test_api_list_query_count_does_not_grow_with_rows():
    user = make_user()
    client = session_client(user)
    for _ in range(3):
        make_request()
    client.get("/api/requests?q=refund&sort=deadline")  # warm: session, permissions
    with CaptureQueriesContext(connection) as few:
        assert client.get("/api/requests?q=refund&sort=deadline").status_code == 200
    for _ in range(12):
        claim(make_request(), make_user())
    with CaptureQueriesContext(connection) as many:
        body = client.get("/api/requests?q=refund&sort=deadline").json()
    assert body["count"] == 15 and len(body["items"]) == 15
    assert len(many) == len(few)
