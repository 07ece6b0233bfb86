"""The triage inbox page (issue 14): compact rows with a one-line summary, the selected
request in a detail pane (`r=` in the URL), filters, search, sort and chips kept in the URL
with counts, the pending count in the title, and a constant number of queries."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals import agents, services
from approvals.agents.demo import demo_tools
from approvals.models import ApprovalRequest, Run
from approvals.presenters.cards import request_row, row_summary

from .factories import drain, make_request, make_user, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}


def pending(run: Run) -> ApprovalRequest:
    return run.requests.get(state="pending")


@pytest.fixture
def reviewer():
    return make_user(role="reviewer")


@pytest.fixture
def halted(reviewer):
    run = start_and_halt(user=reviewer, prompt="Refund order A-1001, $250")
    return run, pending(run)


def row_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<li id="row-(\d+)"', html)]


# -- the row's summary --------------------------------------------------------------------------


def test_a_tool_calls_row_names_the_tool_and_its_key_arguments(halted):
    _, row = halted
    what, summary = row_summary(row)
    assert what == "refund"
    assert summary == "order A-1001 · amount 250"  # names: a row has no labels around it


def test_a_two_call_row_names_both_tools(reviewer):
    row = pending(start_and_halt(user=reviewer, prompt="Refund A-2002 $40 and email the customer"))
    what, summary = row_summary(row)
    assert what == "refund and send_email"
    assert summary.startswith("order A-2002 · amount 40; ")


def test_a_questions_row_says_question_and_the_question(reviewer):
    row = pending(start_and_halt(user=reviewer, prompt="ask a question please"))
    what, summary = row_summary(row)
    assert what == "question"
    assert summary == "Which plan should the customer move to?"


def test_a_long_summary_is_one_truncated_line(reviewer):
    row = pending(start_and_halt(user=reviewer, prompt="ask a question please"))
    row.data = {"questions": [{"question": "Why?\n" + "x" * 300}]}
    _, summary = row_summary(row)
    assert "\n" not in summary
    assert len(summary) == 90 and summary.endswith("…")


def test_a_row_marks_overdue_and_the_claim(reviewer, halted):
    _, row = halted
    row.expires_at = timezone.now() - timezone.timedelta(minutes=1)
    row.claimed_by, row.claimed_at = reviewer, timezone.now()
    item = request_row(row)
    assert item.overdue
    assert item.claim_holder == reviewer


# -- the page ------------------------------------------------------------------------------------


def test_rows_show_agent_tool_summary_age_and_no_card_until_one_is_selected(reviewer, halted):
    _, row = halted
    html = session_client(reviewer).get("/").content.decode()
    assert row_ids(html) == [row.pk]
    item = re.search(rf'<li id="row-{row.pk}".*?</li>', html, re.S).group(0)
    assert '<strong class="agent">demo</strong>' in item
    assert ">refund</span>" in item
    assert "order A-1001 · amount 250" in item
    assert " ago</time>" in item
    assert f'href="?r={row.request_id}"' in item
    assert 'hx-target="#detail"' in item and 'hx-push-url="true"' in item
    # nothing selected: no card, a hint instead
    assert f'id="request-{row.pk}"' not in html
    assert "Select a request in the list" in html
    assert 'data-selected=""' in html


def test_the_selected_request_is_in_the_url_and_the_detail_pane(reviewer, halted):
    _, row = halted
    html = session_client(reviewer).get(f"/?r={row.request_id}").content.decode()
    assert (
        f'<li id="row-{row.pk}" class="row state-pending" data-request-id="{row.request_id}" aria-current="true">'
        in html
    )
    assert f'data-selected="{row.request_id}"' in html
    detail = html[html.index('<section id="detail"') :]
    assert f'<article id="request-{row.pk}"' in detail
    assert f'id="presence-{row.pk}"' in detail
    assert f'id="claim-bar-{row.pk}"' in detail
    assert "History" in detail and "Request created" in detail
    assert "The run so far" in detail and "Transcript" in detail
    assert "Back to list" in detail
    # the socket is told the selection, so others see who is viewing
    assert f'ws-connect="/ws/inbox/?page=1&amp;r={row.request_id}"' in html


def test_an_unknown_selection_selects_nothing(reviewer, halted):
    html = session_client(reviewer).get("/?r=nope").content.decode()
    assert "Select a request in the list" in html
    assert 'data-selected=""' in html


def test_a_row_click_with_htmx_answers_the_detail_pane_only(reviewer, halted):
    _, row = halted
    response = session_client(reviewer).get(
        f"/?q=refund&r={row.request_id}", headers={**HX, "HX-Target": "detail"}
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="detail"')
    assert f'<article id="request-{row.pk}"' in html
    assert 'id="request-list"' not in html
    assert "HX-Target" in response["Vary"]
    # a decision without JavaScript comes back to the same list and selection
    assert f'name="next" value="/?q=refund&amp;r={row.request_id}"' in html


def test_a_history_restore_gets_the_whole_page(reviewer, halted):
    _, row = halted
    headers = {**HX, "HX-History-Restore-Request": "true", "HX-Target": "detail"}
    html = session_client(reviewer).get(f"/?r={row.request_id}", headers=headers).content.decode()
    assert "<html" in html and 'id="request-list"' in html and f'id="request-{row.pk}"' in html


def test_the_title_counts_what_is_pending(reviewer, halted):
    start_and_halt(user=reviewer, prompt="ask a question please")
    html = session_client(reviewer).get("/?kind=question").content.decode()
    assert "<title>(2) Inbox · toolnexus</title>" in html
    assert 'id="request-count" data-count="1" data-pending="2"' in html
    services.request_decline(
        request_id=ApprovalRequest.objects.filter(state="pending").first().request_id, user=reviewer
    )
    drain()
    html = session_client(reviewer).get("/").content.decode()
    assert "<title>(1) Inbox · toolnexus</title>" in html


def test_filters_search_sort_and_chips_are_kept_in_the_url(reviewer, halted):
    _, refund = halted
    question = pending(start_and_halt(user=reviewer, prompt="ask a question please"))
    client = session_client(reviewer)

    assert row_ids(client.get("/?q=plan").content.decode()) == [question.pk]
    assert row_ids(client.get("/?q=A-1001").content.decode()) == [refund.pk]
    assert row_ids(client.get("/?sort=oldest").content.decode()) == [refund.pk, question.pk]
    assert row_ids(client.get("/?sort=newest").content.decode()) == [question.pk, refund.pk]

    services.request_claim(request_id=refund.request_id, user=reviewer)
    html = client.get("/?sort=oldest").content.decode()
    assert row_ids(client.get("/?claim=mine").content.decode()) == [refund.pk]
    assert row_ids(client.get("/?claim=unclaimed").content.decode()) == [question.pk]
    assert f"claimed by {reviewer.get_username()}" in html
    # chips: a link that adds (or, when on, removes) the filter, with its count
    chips = dict(
        re.findall(
            r'data-chip="([^"]+)"[^>]*>[^<]*<span class="chip-count">(\d+)</span>', html, re.S
        )
    )
    assert chips == {
        "claim=mine": "1",
        "claim=unclaimed": "1",
        "claim=routed": "0",
        "overdue=1": "0",
        "hidden=only": "0",
    }
    hrefs = re.findall(r'<a class="chip[^"]*" href="([^"]+)"', html)
    assert {
        k: v[0] for k, v in parse_qs(urlsplit(hrefs[0].replace("&amp;", "&")).query).items()
    } == {
        "sort": "oldest",
        "claim": "mine",
    }
    on = client.get("/?claim=mine").content.decode()
    assert re.search(r'<a class="chip active" href="/"', on)  # clicking it again: off
    # the rows' links keep the filters
    assert f'href="?claim=mine&r={refund.request_id}"' in on
    # the form knows them all
    assert 'id="inbox-search"' in on and 'name="sort"' in on


def test_a_list_with_htmx_answers_the_list_and_its_chips(reviewer, halted):
    html = session_client(reviewer).get("/?overdue=1", headers=HX).content.decode()
    assert html.lstrip().startswith('<section id="request-list"')
    assert '<div id="inbox-chips" class="chips" role="group" hx-swap-oob="true"' in html
    assert '<input type="hidden" name="overdue" value="1">' in html


def test_the_request_page_looks_like_the_detail_pane(reviewer, halted):
    _, row = halted
    html = session_client(reviewer).get(f"/requests/{row.request_id}/").content.decode()
    assert '<section id="detail"' in html
    assert f'<article id="request-{row.pk}"' in html
    assert f'id="claim-bar-{row.pk}"' in html
    assert "The run so far" in html and "History" in html


@pytest.mark.parametrize("selected", [False, True])
def test_the_inbox_costs_the_same_queries_for_5_or_25_requests(
    reviewer, django_assert_num_queries, selected
):
    def halt(n: int) -> list[Run]:
        runs = [
            services.run_start(
                agent="demo", prompt=f"Refund order A-{i:04d}, $5", started_by=reviewer
            )
            for i in range(n)
        ]
        drain()
        return runs

    runs = halt(5)
    client = session_client(reviewer)
    path = f"/?r={pending(runs[0]).request_id}" if selected else "/"
    client.get(path)  # warm: the session, permissions
    with CaptureQueriesContext(connection) as seen:
        assert client.get(path).status_code == 200
    halt(20)  # a full page of 20 rows now
    # ...and more options in the filter menus, each with its count: agents, decided states
    extra = [f"extra-{i}" for i in range(3)]
    for name in extra:
        agents.register(name, model=lambda: None, tools=demo_tools, replace=True)
        make_request(agent=name, kind="question")
    approved = make_request(kind="approval")
    ApprovalRequest.objects.filter(pk=approved.pk).update(
        state="approved", decided_at=timezone.now()
    )
    try:
        with django_assert_num_queries(len(seen)) as again:
            html = client.get(path).content.decode()
    finally:
        for name in extra:
            agents.unregister(name)
    assert len(row_ids(html)) == 20
    assert ">extra-2 (1)</option>" in html and ">Approved (1)</option>" in html
    # the menus' counts ride in the counts' two statements (each option a capped subquery)
    for captured in (seen, again):
        # (the rows' statement counts approvals given in a subquery: not a count statement)
        counting = ("SELECT COUNT(", "SELECT (SELECT COUNT(")
        assert sum(q["sql"].startswith(counting) for q in captured.captured_queries) == 2
    if not selected:
        # session, user, permissions, the counts' two, rows, calls, the viewer's next snooze end
        assert len(seen) == 8


# -- links that cannot be followed say why --------------------------------------------------------


def test_a_link_to_a_request_that_is_not_there_says_so(reviewer, halted):
    client = session_client(reviewer)
    html = client.get("/?r=pnd-nope").content.decode()
    assert "No request “pnd-nope” here: it does not exist, or its agent is hidden" in html
    assert 'data-selected=""' in html  # nothing selected; the list is still there
    assert "row-" in html
    # the same when a row link asks for the detail pane only
    pane = client.get("/?r=pnd-nope", headers={**HX, "HX-Target": "detail"}).content.decode()
    assert "No request “pnd-nope” here" in pane
    assert "No request" not in client.get("/").content.decode()


def test_filter_values_the_inbox_does_not_know_are_named_not_ignored(reviewer, halted):
    client = session_client(reviewer)
    html = client.get("/?sort=sideways&state=lost&claim=theirs&agent=ghost&kind=poem").content
    html = html.decode()
    assert "Unknown sort “sideways”: showing newest first." in html
    assert "Unknown state “lost”: showing pending requests." in html
    assert "Unknown claim “theirs”: showing every request." in html
    assert "No agent named “ghost” that you can see." in html
    assert "Unknown kind “poem”: nothing is of that kind." in html
    # known values say nothing, in the list htmx swaps in too (the notices' place is emptied)
    listed = client.get("/?sort=oldest&state=pending&agent=demo", headers=HX).content.decode()
    assert 'class="notice warning filter-notice"' not in listed
    assert '<div id="filter-notices" class="filter-notices" hx-swap-oob="true"></div>' in listed
    assert "Unknown sort" in client.get("/?sort=x", headers=HX).content.decode()


def test_filter_notices_sit_outside_the_list_live_updates_replace(reviewer, halted):
    html = session_client(reviewer).get("/?sort=sideways").content.decode()
    notices = html.index('<div id="filter-notices"')
    assert "Unknown sort “sideways”" in html[notices : html.index("</div>", notices)]
    assert notices < html.index('<section id="request-list"')
    assert "Unknown sort" not in html[html.index('<section id="request-list"') :]


# -- pages past the count cap ------------------------------------------------------------------


@pytest.fixture
def forty(settings):
    """40 pending requests, newest last: two full pages, counted past a cap of 5."""
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 5
    return [make_request(age=timedelta(minutes=100 - i)) for i in range(40)]


def test_past_the_cap_next_is_offered_only_when_a_row_follows(reviewer, forty):
    client = session_client(reviewer)
    client.get("/")  # warm: the session, permissions
    with CaptureQueriesContext(connection) as seen:
        first = client.get("/").content.decode()
    assert ">5+ requests pending</p>" in first
    assert "page 1</span>" in first and 'rel="next"' in first and 'rel="prev"' not in first
    with CaptureQueriesContext(connection) as again:
        last = client.get("/?page=2").content.decode()
    assert len(again) == len(seen)  # reading one row more costs no query more
    assert row_ids(last) == [r.pk for r in reversed(forty[:20])]  # a full page...
    assert 'rel="prev"' in last and 'rel="next"' not in last  # ...and nothing after it
    assert "No more requests" not in last
    oldest = client.get("/?sort=oldest&page=2").content.decode()
    assert 'rel="next"' not in oldest and ">Previous</a>" in oldest


def test_a_page_past_the_end_says_so_and_links_back(reviewer, forty):
    client = session_client(reviewer)
    client.get("/")  # warm: the session, permissions
    with CaptureQueriesContext(connection) as first:
        client.get("/")
    with CaptureQueriesContext(connection) as past:
        html = client.get("/?page=7").content.decode()
    # no rows, so no calls to prefetch; one COUNT (up to this page) says which page is the last
    assert len(past) == len(first)
    assert row_ids(html) == []
    assert "<h2>No more requests</h2>" in html
    assert 'This list ends at page 2: <a href="?page=2">back to page 2</a>' in html
    assert '<a href="/">to the first page</a>' in html
    assert 'rel="next"' not in html and 'rel="prev"' not in html
    assert "Nothing waiting for you" not in html and "No requests match" not in html
    # the links keep the filters
    html = client.get("/?sort=oldest&page=3").content.decode()
    assert '<a href="?sort=oldest&page=2">back to page 2</a>' in html
    assert '<a href="/?sort=oldest">to the first page</a>' in html
    # a page number no OFFSET could hold reads the same, no error
    huge = client.get("/?page=" + "9" * 30)
    assert huge.status_code == 200 and "<h2>No more requests</h2>" in huge.content.decode()


def test_a_page_past_a_one_page_list_links_to_the_first_page(reviewer, settings):
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 2
    for _ in range(3):
        make_request()
    html = session_client(reviewer).get("/?page=2", headers=HX).content.decode()
    assert "This list ends before page 2: " in html
    assert '<a href="/">back to the first page</a>' in html
