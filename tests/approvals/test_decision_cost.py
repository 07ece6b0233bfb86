"""What a decision costs and how its live push goes out.

The query ceilings guard the decision path against regressions (every statement is a round
trip on PostgreSQL while the reviewer waits); the push tests pin that a decision's message is
built from the decided row in memory, sent when the decision commits, and rendered only by
the pages that show it, once per change and variant.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.live import publisher, rendering
from approvals.live.groups import INBOX_GROUP, run_group

from .factories import bearer, make_user, post_json, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


# -- permissions -----------------------------------------------------------------------------


def test_a_permission_check_reads_user_and_group_permissions_in_one_query():
    reviewer = make_user(role="reviewer")  # the permission comes from the Reviewers group
    with CaptureQueriesContext(connection) as ctx:
        assert reviewer.has_perm("approvals.decide_request")
        assert reviewer.has_perm("approvals.view_run")  # cached on the user object
    assert len(_statements(ctx)) == 1


def test_direct_user_permissions_count_and_inactive_or_unpermitted_users_have_none():
    nobody = make_user(role="nobody")
    assert not nobody.has_perm("approvals.decide_request")
    assert nobody.get_all_permissions() == set()

    direct = make_user(role="nobody")
    direct.user_permissions.add(Permission.objects.get(codename="decide_request"))
    direct = type(direct).objects.get(pk=direct.pk)  # no cached permissions
    assert direct.has_perm("approvals.decide_request")
    assert not direct.has_perm("approvals.add_run")

    inactive = make_user(role="reviewer")
    inactive.is_active = False
    assert not inactive.has_perm("approvals.decide_request")

    watcher = make_user(role="watcher")
    assert watcher.has_perm("approvals.view_run")
    assert not watcher.has_perm("approvals.decide_request")


# -- the decision path ---------------------------------------------------------------------


def test_declining_through_the_api_stays_within_its_query_budget():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    headers = bearer(user)
    client = Client()
    client.get("/api/requests", headers=headers)  # the token's last-used stamp is written now
    with CaptureQueriesContext(connection) as ctx:
        response = post_json(
            client, f"/api/requests/{request_id}/decline", {"reason": "no"}, headers=headers
        )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "declined" and body["decision"]["reason"] == "no"
    assert body["decision"]["decided_by"] == user.username
    assert [c["decision"] for c in body["calls"]] == ["decline"]
    statements = _statements(ctx)
    # token, permissions, lock request, lock calls, update call, update request, lock run,
    # update run, one insert for both audit events, enqueue the resume (and NOTIFY the workers
    # on PostgreSQL), the calls for the reply
    budget = 12 if connection.vendor == "postgresql" else 11
    assert len(statements) <= budget, "\n".join(statements)
    assert sum(s.startswith('INSERT INTO "approvals_event"') for s in statements) == 1


def test_the_run_lock_of_a_decision_does_not_read_the_transcript():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    with CaptureQueriesContext(connection) as ctx:
        services.request_decline(request_id=request_id, user=user, reason="no")
    run_reads = [s for s in _statements(ctx) if s.startswith("SELECT") and "approvals_run" in s]
    assert run_reads and all('"messages"' not in s for s in run_reads), run_reads


# -- the live push ---------------------------------------------------------------------------


def test_a_decisions_push_is_built_from_the_row_in_memory_and_carries_no_html():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    row = services.request_decline(request_id=request_id, user=user, reason="over the limit")
    with CaptureQueriesContext(connection) as ctx:
        from_memory = publisher.messages_for(
            run_id=run.pk, request_pk=row.pk, created=False, decided=row
        )
    assert _statements(ctx) == []
    from_database = publisher.messages_for(
        run_id=run.pk, request_pk=row.pk, created=False, decided=None
    )

    def without_change(messages):
        return [(group, {**m, "change": None}) for group, m in messages]

    assert without_change(from_memory) == without_change(from_database)
    (inbox_group, event), (run_grp, run_event) = from_memory
    assert (inbox_group, run_grp) == (INBOX_GROUP, run_group(run.pk))
    assert event["change"] == run_event["change"]  # one change, one name for its renderings
    assert f"Already declined by {user.username}" in event["toast"]
    assert "The agent wants to run refund" in event["toast"]
    assert not any("<" in str(value) for value in [*event.values(), *run_event.values()])


def test_a_decision_is_pushed_when_it_commits_before_its_service_returns(monkeypatch):
    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    assert [[group for group, _ in batch] for batch in sent] == [[INBOX_GROUP, run_group(run.pk)]]
    assert sent[0][0][1]["state"] == "declined"


def test_a_rolled_back_change_is_never_pushed(monkeypatch):
    from django.db import transaction

    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.request_decline(request_id=run.requests.get().request_id, user=user)
        raise RuntimeError("the caller fails after the decision")
    assert sent == []
    assert run.requests.get().state == "pending"


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
