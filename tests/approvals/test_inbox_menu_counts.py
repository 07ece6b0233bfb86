"""The inbox's filter menus with counts: each option of the agent, kind and state menus says
how many rows the list shows with it chosen, the other filters kept (as the chips count),
capped as the chips are; values and URLs stay as they were; a list update (htmx's list, the
socket's snapshot) brings the menus' counts along, the live count pushes do not count them.
The query count with them: test_inbox_page.py's constant-query test."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from approvals import agents
from approvals.agents.demo import demo_generate, demo_tools
from approvals.live import rendering
from approvals.models import ApprovalRequest
from toolnexus import create_in_process_client

from .factories import make_request, make_user, session_client

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def menu(html: str, name: str) -> dict[str, str]:
    """A filter menu as the page renders it: {option value: label}, in the menu's order."""
    select = re.search(rf'<select name="{name}">(.*?)</select>', html, re.S).group(1)
    return dict(re.findall(r'<option id="[^"]+" value="([^"]*)"[^>]*>([^<]*)</option>', select))


def chosen(html: str, name: str) -> list[str]:
    select = re.search(rf'<select name="{name}">(.*?)</select>', html, re.S).group(1)
    return re.findall(r'value="([^"]*)" selected>', select)


def swapped(html: str) -> dict[str, str]:
    """The menus' counts a list update swaps in: {option element id: label}."""
    return dict(re.findall(r'<span hx-swap-oob="innerHTML:#(filter-[^"]+)">([^<]*)</span>', html))


def option_ids(html: str) -> dict[str, str]:
    return dict(
        re.findall(r'<option id="(filter-[^"]+)" value="[^"]*"[^>]*>([^<]*)</option>', html)
    )


@pytest.fixture
def reviewer():
    return make_user(role="reviewer")


@pytest.fixture
def rows(second_demo_agent):
    """demo: 3 pending relay calls, a pending question, a declined relay call; demo2: a
    pending approval and a pending relay call."""
    for _ in range(3):
        make_request()
    make_request(kind="question")
    declined = make_request()
    ApprovalRequest.objects.filter(pk=declined.pk).update(
        state="declined", decided_at=timezone.now()
    )
    make_request(agent="demo2", kind="approval")
    make_request(agent="demo2")


def test_each_menu_option_counts_the_list_it_would_show(reviewer, rows):
    html = session_client(reviewer).get("/?kind=tool_call").content.decode()
    # relay calls only: per agent, per kind (the agent kept: all), per state
    assert menu(html, "agent") == {
        "": "all (4)",
        "demo": "demo (3)",
        "demo2": "demo2 (1)",
        "demo-team": "demo-team (0)",
    }
    assert menu(html, "kind") == {
        "": "all (6)",
        "tool_call": "relay call (4)",
        "approval": "approval (1)",
        "question": "question (1)",
        "input": "input (0)",
        "authorization": "sign-in (0)",
        "elicitation": "MCP question (0)",
    }
    assert menu(html, "state") == {
        "pending": "Pending (4)",
        "approved": "Approved (0)",
        "answered": "Answered (0)",
        "declined": "Declined (1)",
        "expired": "Expired (0)",
        "cancelled": "Cancelled (0)",
        "all": "all (5)",
    }
    # the values and the chosen ones are as before: the URL's filters
    assert (chosen(html, "agent"), chosen(html, "kind"), chosen(html, "state")) == (
        [""],
        ["tool_call"],
        ["pending"],
    )
    # the chips keep counting as they did, with the same filters
    assert re.search(r'data-chip="claim=unclaimed"[^>]*>[^<]*<span class="chip-count">4<', html)


def test_menu_counts_keep_the_other_filters_chips_and_search_included(reviewer, rows):
    client = session_client(reviewer)
    html = client.get("/?agent=demo2&state=all").content.decode()
    assert menu(html, "agent") == {
        "": "all (7)",
        "demo": "demo (5)",
        "demo2": "demo2 (2)",
        "demo-team": "demo-team (0)",
    }
    assert menu(html, "kind")["approval"] == "approval (1)"
    assert menu(html, "state")["declined"] == "Declined (0)"  # demo2 has declined nothing
    html = client.get("/?claim=mine").content.decode()
    assert set(menu(html, "agent").values()) == {
        "all (0)",
        "demo (0)",
        "demo2 (0)",
        "demo-team (0)",
    }


def test_menu_counts_stop_at_the_cap_like_the_chips(reviewer, rows, settings):
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 3
    html = session_client(reviewer).get("/").content.decode()
    assert menu(html, "agent") == {
        "": "all (3+)",
        "demo": "demo (3+)",
        "demo2": "demo2 (2)",
        "demo-team": "demo-team (0)",
    }
    assert menu(html, "kind")["tool_call"] == "relay call (3+)"
    assert menu(html, "state")["all"] == "all (3+)"
    assert re.search(r'data-chip="claim=unclaimed"[^>]*>[^<]*<span class="chip-count">3\+<', html)


def test_a_list_update_brings_the_menus_counts_for_its_filters(reviewer, rows):
    client = session_client(reviewer)
    page = client.get("/").content.decode()
    listed = client.get("/?kind=question", headers=HX).content.decode()
    counts = swapped(listed)
    # one for every option of the page's three menus, each replacing that option's text only
    assert counts.keys() == option_ids(page).keys()
    assert counts["filter-agent-any"] == "all (1)"
    assert counts["filter-kind-" + b"tool_call".hex()] == "relay call (4)"
    assert counts["filter-state-" + b"all".hex()] == "all (1)"
    # the socket's snapshot of a list (connect, reconnect, other filters) brings them too
    snapshot = swapped(rendering.request_list(reviewer, {"kind": "question"}, 1))
    assert snapshot == counts


def test_live_count_pushes_carry_the_menus_counts_too(reviewer, rows):
    """A filtered list's count push carries every count of its page (issue 33: the menus'
    counts followed only when the list was drawn again), the same as the list's own."""
    counted = rendering.list_counts(reviewer, {"kind": "question"})
    assert "options" in counted["counts"] and counted["menus"]
    pushed = swapped(rendering.counts_html(counted))
    assert pushed == swapped(rendering.request_list(reviewer, {"kind": "question"}, 1))


def test_any_agent_name_names_its_option_safely(reviewer):
    odd = "ops \"eu\" <b>'1'</b>"
    agents.register(
        odd,
        model=lambda: create_in_process_client(generate=demo_generate, model="odd"),
        tools=demo_tools,
        replace=True,
    )
    try:
        make_request(agent=odd)
        client = session_client(reviewer)
        html = client.get("/").content.decode()
        escaped = "ops &quot;eu&quot; &lt;b&gt;&#x27;1&#x27;&lt;/b&gt;"
        dom_id = f"filter-agent-{odd.encode().hex()}"  # a CSS-safe id whatever the name
        assert f'<option id="{dom_id}" value="{escaped}">{escaped} (1)</option>' in html
        listed = client.get("/?state=all", headers=HX).content.decode()
        assert f'<span hx-swap-oob="innerHTML:#{dom_id}">{escaped} (1)</span>' in listed
    finally:
        agents.unregister(odd)
