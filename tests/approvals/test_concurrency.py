"""Many reviewers deciding one request at once: exactly one decision, one resume."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from approvals import services
from approvals.domain.exceptions import AlreadyDecided
from approvals.execution import recovery
from approvals.models import ApprovalRequest, Event

from .factories import drain, fresh, make_user, start_and_halt, tasks_for, tool_output

pytestmark = pytest.mark.django_db(transaction=True)


def _race(request_id: str, users: list, decide) -> tuple[list, list, list]:
    """Every user decides at once, each in its own thread with its own DB connection."""
    barrier = threading.Barrier(len(users))
    won, lost, crashed = [], [], []
    lock = threading.Lock()

    def attempt(user) -> None:
        try:
            barrier.wait(timeout=30)
            decide(request_id, user)
            with lock:
                won.append(user.username)
        except AlreadyDecided as exc:
            with lock:
                lost.append(exc)
        except BaseException as exc:
            with lock:
                crashed.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return won, lost, crashed


def _decline(request_id, user):
    services.request_decline(request_id=request_id, user=user, reason=f"by {user.username}")


def _approve(request_id, user):
    services.request_approve(request_id=request_id, user=user)


def _mixed(request_id, user):
    (_decline if int(user.username.rsplit("-", 1)[1]) % 2 else _approve)(request_id, user)


def _check_one_decision(run, request, users, won, lost, crashed) -> None:
    assert crashed == []
    assert len(won) == 1, won
    assert len(lost) == len(users) - 1
    winner = won[0]
    request.refresh_from_db()
    assert request.decided_by.username == winner
    decisions = Event.objects.filter(request=request).exclude(action="request_created")
    assert decisions.count() == 1
    assert Event.objects.filter(run=run, action="run_resumed").count() == 1
    assert len(tasks_for(run)) == 2  # the start and exactly one resume
    assert fresh(run).status == "queued"
    assert drain() == 1
    run = fresh(run)
    assert run.status == "done"
    assert len([m for m in run.messages if m.get("tool_call_id") == "call_refund"]) == 1
    if request.state == "declined":
        assert tool_output(run, "call_refund") == f"relay declined for refund: by {winner}"
    else:
        assert tool_output(run, "call_refund") == "refund issued: $120 to order A-1001"
        assert run.executions.count() == 1
    # every loser is told who won (checked last: the invariants above matter more)
    assert all(f"by {winner} at" in str(exc) for exc in lost), [str(e) for e in lost][:3]


@pytest.mark.postgres
@pytest.mark.parametrize("decide", [_decline, _mixed], ids=["decline", "mixed"])
def test_twenty_concurrent_decisions_on_postgres(on_postgres, decide):
    if not on_postgres:
        pytest.skip("needs PostgreSQL (set DATABASE_URL)")
    users = [make_user(username=f"pg-{i}") for i in range(20)]
    run = start_and_halt(user=users[0])
    request = run.requests.get()
    won, lost, crashed = _race(request.request_id, users, decide)
    _check_one_decision(run, request, users, won, lost, crashed)


@pytest.mark.parametrize(
    "decide", [_decline, _approve, _mixed], ids=["decline", "approve", "mixed"]
)
def test_five_concurrent_decisions(decide):
    users = [make_user(username=f"r-{i}") for i in range(5)]
    run = start_and_halt(user=users[0])
    request = run.requests.get()
    won, lost, crashed = _race(request.request_id, users, decide)
    _check_one_decision(run, request, users, won, lost, crashed)


def test_concurrent_expiry_and_decision_yield_one_outcome():
    user = make_user(username="r-0")
    run = start_and_halt(user=user)
    request = run.requests.get()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    barrier = threading.Barrier(2)
    outcomes: list = []

    def expire():
        try:
            barrier.wait(timeout=30)
            outcomes.append(("expired", recovery.requests_expire_overdue()))
        finally:
            connections.close_all()

    def decline():
        try:
            barrier.wait(timeout=30)
            _decline(request.request_id, user)
            outcomes.append(("declined", 1))
        except AlreadyDecided:
            outcomes.append(("declined", 0))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=expire), threading.Thread(target=decline)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(n for _, n in outcomes) == [0, 1]
    request.refresh_from_db()
    assert request.state in ("expired", "declined")
    assert len(tasks_for(run)) == 2
    assert Event.objects.filter(run=run, action="run_resumed").count() == 1
