"""approvals.presenters.pages: the inbox page's paging when the count stops at the cap."""

from __future__ import annotations

from datetime import timedelta

import pytest

from .factories import make_request, make_user, session_client

pytestmark = pytest.mark.django_db


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
