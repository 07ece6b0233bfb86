"""What a decision costs: the query ceilings guard the decision path against regressions
(every statement is a round trip on PostgreSQL while the reviewer waits)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import services

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
