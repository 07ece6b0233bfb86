"""approvals.live.rendering: the fragments live pages show, from the views' own partials,
rendered once per change and variant however many pages ask, and afresh for a later change."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.live import rendering

from .factories import make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


def test_a_decided_card_is_rendered_once_for_deciders_and_watchers():
    user = make_user()
    run = start_and_halt(user=user)
    row = services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    decide = rendering.changed_card(row.pk, change="c1", can_decide=True, oob=True)
    view = rendering.changed_card(row.pk, change="c1", can_decide=False, oob=True)
    assert decide == view
    assert "/decline/" not in decide
    assert 'hx-swap-oob="true"' in decide


def test_a_pending_card_differs_for_deciders_and_watchers():
    user = make_user()
    run = start_and_halt(user=user)
    row = run.requests.get()
    decide = rendering.changed_card(row.pk, change="c2", can_decide=True, oob=False)
    view = rendering.changed_card(row.pk, change="c2", can_decide=False, oob=False)
    assert "/decline/" in decide
    assert "/decline/" not in view
    assert "hx-swap-oob" not in decide  # inserted into the list, not swapped by id


def test_a_change_is_rendered_and_counted_once_however_many_pages_ask():
    user = make_user()
    run = start_and_halt(user=user)
    row = run.requests.get()
    with CaptureQueriesContext(connection) as ctx:
        cards = {
            rendering.changed_card(row.pk, change="c3", can_decide=True, oob=True) for _ in range(5)
        }
        counts = {rendering.pending_count(change="c3") for _ in range(5)}
    assert len(cards) == 1 and counts == {1}
    statements = _statements(ctx)
    assert sum(s.startswith("SELECT COUNT(*)") for s in statements) == 1
    assert (
        sum('FROM "approvals_approvalrequest"' in s and "COUNT" not in s for s in statements) == 1
    )
    # a later change is rendered afresh: a page never gets a stale card
    services.request_decline(request_id=row.request_id, user=user)
    after = rendering.changed_card(row.pk, change="c4", can_decide=True, oob=True)
    assert "state-declined" in after and rendering.pending_count(change="c4") == 0
