"""The operating commands: api_token, db_worker --batch, expire_requests."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from approvals import services
from approvals.models import ApiToken, ApprovalRequest

from .factories import drain, fresh, make_user, start_and_halt, tasks_for, tool_output
from .factories import make_overdue as _overdue

pytestmark = pytest.mark.django_db(transaction=True)


def _token_for(username: str, *args: str) -> str:
    out = io.StringIO()
    call_command("api_token", username, *args, stdout=out)
    return out.getvalue().strip()


def test_api_token_prints_a_token_that_authenticates():
    user = make_user()
    token = _token_for(user.username, "--name", "ci")
    assert token.startswith("tnx_") and "\n" not in token
    row = ApiToken.objects.get(user=user)
    assert row.name == "ci" and token.startswith(row.prefix)
    assert row.key_hash == ApiToken.hash(token) and token not in row.key_hash  # stored hashed
    response = Client().get("/api/requests", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.json() == {"items": [], "count": 0}
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_each_api_token_call_makes_a_new_token():
    user = make_user()
    assert _token_for(user.username) != _token_for(user.username)
    assert ApiToken.objects.filter(user=user).count() == 2


def test_api_token_for_an_unknown_user_is_an_error():
    with pytest.raises(CommandError, match="ghost"):
        call_command("api_token", "ghost", stdout=io.StringIO())
    assert ApiToken.objects.count() == 0


def test_revoked_token_and_inactive_user_do_not_authenticate():
    user = make_user()
    revoked = _token_for(user.username)
    ApiToken.objects.filter(key_hash=ApiToken.hash(revoked)).update(revoked_at=timezone.now())
    assert (
        Client().get("/api/requests", headers={"Authorization": f"Bearer {revoked}"}).status_code
        == 401
    )
    other = make_user()
    token = _token_for(other.username)
    other.is_active = False
    other.save()
    assert (
        Client().get("/api/requests", headers={"Authorization": f"Bearer {token}"}).status_code
        == 401
    )


def test_db_worker_batch_runs_queued_tasks():
    user = make_user()
    first = services.run_start(agent="demo", prompt="refund A-1 $1", started_by=user)
    second = services.run_start(agent="demo", prompt="a question", started_by=user)
    out = io.StringIO()
    call_command("db_worker", "--batch", stdout=out)
    assert "ran 2 task(s)" in out.getvalue()
    assert fresh(first).status == "pending"
    assert fresh(second).status == "pending"
    out = io.StringIO()
    call_command("db_worker", "--batch", stdout=out)
    assert "ran 0 task(s)" in out.getvalue()


def test_db_worker_batch_also_expires_and_resumes():
    run = start_and_halt()
    ApprovalRequest.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(minutes=5))
    out = io.StringIO()
    call_command("db_worker", "--batch", stdout=out)
    assert "ran 1 task(s)" in out.getvalue()
    run = fresh(run)
    assert run.status == "done"
    assert run.requests.get().state == "expired"


def test_db_worker_takes_the_stock_options():
    user = make_user()
    runs = [services.run_start(agent="demo", prompt="refund", started_by=user) for _ in (1, 2)]
    out = io.StringIO()
    call_command("db_worker", "--batch", "--queue-name", "elsewhere", stdout=out)
    assert "ran 0 task(s)" in out.getvalue()
    out = io.StringIO()
    call_command("db_worker", "--batch", "--max-tasks", "1", "--worker-id", "w-one", stdout=out)
    assert "ran 1 task(s)" in out.getvalue()
    out = io.StringIO()
    call_command("db_worker", "--batch", "--queue-name", "*", "--exclude-queues", "x", stdout=out)
    assert "ran 1 task(s)" in out.getvalue()
    assert {fresh(run).status for run in runs} == {"pending"}
    assert ["w-one"] in [t.worker_ids for run in runs for t in tasks_for(run)]
    with pytest.raises(CommandError, match="exclude-queues"):
        call_command("db_worker", "--batch", "--exclude-queues", "x", stdout=io.StringIO())


def test_expire_requests_command():
    run = start_and_halt()
    request = _overdue(run)
    out = io.StringIO()
    call_command("expire_requests", stdout=out)
    assert "expired 1 request" in out.getvalue()
    request.refresh_from_db()
    assert request.state == "expired" and request.reason == "expired"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: expired"


def test_expire_requests_with_nothing_overdue():
    start_and_halt()
    out = io.StringIO()
    call_command("expire_requests", stdout=out)
    assert "expired 0 request(s)" in out.getvalue()
    assert ApprovalRequest.objects.get().state == "pending"
