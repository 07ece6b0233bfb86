"""Issue 33, "say each once": a decision's news reads in one place of the page it returns
to (the card's footer, or a late decision's notice), not again beside it."""

from __future__ import annotations

import pytest

from .factories import make_user, session_client, start_and_halt
from .test_web_views import HX, pending, toasts, url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reviewer():
    return make_user(role="reviewer")


@pytest.fixture
def row(reviewer):
    return pending(start_and_halt(user=reviewer, prompt="Refund order A-1001, $250"))


def test_a_form_approval_back_to_its_card_adds_no_message(reviewer, row):
    client = session_client(reviewer)
    back = f"/?r={row.request_id}"
    response = client.post(url(row, "approve"), {"confirmed": "1", "next": back})
    assert response.status_code == 302 and response["Location"] == back
    page = client.get(back).content.decode()
    assert "<strong>Approved</strong> by" in page
    assert "Approved." not in toasts(page)


def test_a_form_approval_back_to_a_page_without_its_card_says_it(reviewer, row):
    client = session_client(reviewer)
    client.post(url(row, "approve"), {"confirmed": "1", "next": "/?kind=tool_call"})
    assert "Approved." in toasts(client.get("/?kind=tool_call").content.decode())


@pytest.mark.parametrize("typed", ["", "too late"])
def test_a_late_decision_says_who_decided_once_in_its_notice(reviewer, row, typed):
    session_client(reviewer).post(url(row, "decline"), {"reason": "first"}, headers=HX)
    late = session_client(make_user(role="reviewer"))
    html = late.post(url(row, "decline"), {"reason": typed}, headers=HX).content.decode()
    card = html.split('<div hx-swap-oob="beforeend:#toasts">')[0]
    assert card.count(f"Already declined by {reviewer.username}") == 1
    assert "Their reason: “first”" in card
    assert 'class="decided' not in card  # no footer saying it again
