"""approvals.models: the inbox search text of a request (filled when the row is made, capped,
lowercased) and the PostgreSQL indexes that serve the inbox."""

from __future__ import annotations

import pytest
from django.db import connection

from approvals import selectors
from approvals.selectors import InboxQuery

from .factories import inbox, make_user, start_and_halt

pytestmark = pytest.mark.django_db


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
    # a search can be served by the trigram index: with sequential and plain index scans
    # priced out (on a near-empty table the planner may walk any index and filter), only
    # a bitmap scan, which needs an index condition, is left for the search's LIKE
    with connection.cursor() as cursor:
        for path in ("seqscan", "indexscan", "indexonlyscan"):
            cursor.execute(f"SET LOCAL enable_{path} = off")
        plan = InboxQuery(q="zanzibar", state="all")
        explained = selectors.inbox_requests(plan, user_id=None).order_by().explain()
    assert "req_search_trgm" in explained
