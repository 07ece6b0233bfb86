"""What a decision costs and in what order its live push goes out.

The query ceilings guard the decision path against regressions (every statement is a round
trip on PostgreSQL while the reviewer waits); the broadcaster tests pin the two lanes: the
light message is built from the decided row in memory, and rendering waits for the requests
a process is serving.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.live import publisher as broadcast
from approvals.models import ApprovalRequest

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


# -- the broadcaster's lanes ---------------------------------------------------------------


def test_the_light_message_built_in_memory_equals_the_one_read_from_the_database():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    row = services.request_decline(request_id=request_id, user=user, reason="over the limit")
    with CaptureQueriesContext(connection) as ctx:
        from_memory = broadcast.light_event(row)
    assert _statements(ctx) == []
    stored = ApprovalRequest.objects.select_related("decided_by").get(pk=row.pk)
    from_database = broadcast.build_light_messages(
        run_id=run.pk, request_pk=stored.pk, created=False
    )
    assert from_database == [(broadcast.INBOX_GROUP, from_memory)]
    assert from_memory["cards"] is None and from_memory["pending_count"] is None
    assert f"Already declined by {user.username}" in from_memory["toast"]
    assert "The agent wants to run refund" in from_memory["toast"]


def test_a_decided_card_is_rendered_once_for_deciders_and_watchers():
    user = make_user()
    run = start_and_halt(user=user)
    row = services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    ((_, event), _) = broadcast.build_messages(run_id=run.pk, request_pk=row.pk, created=False)
    assert event["cards"]["decide"] is event["cards"]["view"]
    assert "/decline/" not in event["cards"]["decide"]
    assert event["pending_count"] == 0


def test_a_pending_card_differs_for_deciders_and_watchers():
    user = make_user()
    run = start_and_halt(user=user)
    row = run.requests.get()
    ((_, event), _) = broadcast.build_messages(run_id=run.pk, request_pk=row.pk, created=True)
    assert "/decline/" in event["cards"]["decide"]
    assert "/decline/" not in event["cards"]["view"]


def _record_builds(monkeypatch) -> dict[str, list[float]]:
    built: dict[str, list[float]] = {"light": [], "full": []}

    def record(name):
        def build(changes):
            built[name].append(time.monotonic())
            return []  # nothing to send: these tests watch the timing only

        return build

    monkeypatch.setattr(broadcast._light_lane, "build", record("light"))
    monkeypatch.setattr(broadcast._full_lane, "build", record("full"))
    return built


def _wait_until(predicate, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def _other_request_in_flight() -> tuple[threading.Event, threading.Thread]:
    """Another request being served by this process (its own thread and context)."""
    release, started = threading.Event(), threading.Event()

    def serve():
        token = broadcast.request_started()
        started.set()
        release.wait(10)
        broadcast.request_finished(token)

    thread = threading.Thread(target=serve)
    thread.start()
    assert started.wait(5)
    return release, thread


def test_a_requests_light_push_goes_when_its_view_returns_and_rendering_when_all_are_done(
    monkeypatch,
):
    built = _record_builds(monkeypatch)
    # A patience far beyond this test's sleeps: only the requests finishing may release it.
    monkeypatch.setattr(broadcast._full_lane, "yield_to_requests", 30.0)
    token = broadcast.request_started()
    broadcast.changed(run_id=1, request_pk=1)  # committed while the view still works
    time.sleep(0.1)
    assert built == {"light": [], "full": []}, "a push competed with the view for the GIL"
    release, other = _other_request_in_flight()
    try:
        returned = time.monotonic()
        broadcast.request_finished(token)
        assert _wait_until(lambda: built["light"]), "the light push stayed held"
        assert built["light"][0] >= returned
        time.sleep(0.1)
        assert not built["full"], "the full lane rendered while a request was in flight"
    finally:
        finished = time.monotonic()
        release.set()
        other.join()
    broadcast.flush()
    assert built["full"] and built["full"][0] >= finished


def test_a_change_outside_any_request_is_pushed_light_at_once_even_when_requests_run(
    monkeypatch,
):
    built = _record_builds(monkeypatch)
    monkeypatch.setattr(broadcast._full_lane, "yield_to_requests", 30.0)
    release, other = _other_request_in_flight()
    try:
        broadcast.changed(run_id=2, request_pk=2)  # e.g. a worker expiring a request
        assert _wait_until(lambda: built["light"]), "the light push waited for a request"
        assert not built["full"]
    finally:
        release.set()
        other.join()
    broadcast.flush()
    assert built["full"]


def test_rendering_does_not_wait_forever_for_a_busy_process(monkeypatch):
    built = threading.Event()
    monkeypatch.setattr(broadcast._full_lane, "yield_to_requests", 0.25)
    monkeypatch.setattr(broadcast._full_lane, "build", lambda changes: built.set() or [])
    release, other = _other_request_in_flight()  # a request that does not finish
    try:
        started = time.monotonic()
        broadcast.changed(run_id=1)
        assert built.wait(5)
        assert time.monotonic() - started >= 0.2
    finally:
        release.set()
        other.join()


def test_a_burst_of_decisions_counts_the_pending_inbox_once():
    user = make_user()
    changes = []
    for _ in range(3):
        run = start_and_halt(user=user)
        row = services.request_decline(
            request_id=run.requests.get().request_id, user=user, reason="no"
        )
        changes.append({"run_id": run.pk, "request_pk": row.pk, "created": False})
    with CaptureQueriesContext(connection) as ctx:
        messages = broadcast._full_batch(changes)
    counts = [s for s in _statements(ctx) if s.startswith("SELECT COUNT(*)")]
    assert len(counts) == 1, counts
    inbox = [m for group, m in messages if group == broadcast.INBOX_GROUP]
    assert [m["request_pk"] for m in inbox] == [c["request_pk"] for c in changes]
    assert {m["pending_count"] for m in inbox} == {0}
