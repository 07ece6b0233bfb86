"""Two-person approval across connections: approvers racing on PostgreSQL (one decision, one
resume), and a counted approval reaching the other reviewers' pages live."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from approvals import services
from approvals.domain.exceptions import AlreadyDecided, InvalidTransition
from approvals.models import ApprovalGiven, Event, Rule

from .factories import (
    drain,
    frame_with,
    fresh,
    halted_run,
    in_thread,
    make_user,
    open_socket,
    start_and_halt,
    tasks_for,
    tool_output,
    user_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _two_person_rule(**fields) -> Rule:
    return Rule.objects.create(
        name="big refunds", effect=Rule.Effect.REQUIRE_APPROVERS, approvals_needed=2, **fields
    )


def _race(request_id: str, users: list) -> dict[str, list]:
    """Every user approves at once, each in its own thread with its own connection."""
    barrier = threading.Barrier(len(users))
    out: dict[str, list] = {"decided": [], "counted": [], "late": [], "crashed": []}
    lock = threading.Lock()

    def attempt(user) -> None:
        try:
            barrier.wait(timeout=30)
            row = services.request_approve(request_id=request_id, user=user)
            key = "counted" if getattr(row, "partial_approval", None) else "decided"
            with lock:
                out[key].append(user.username)
        except (AlreadyDecided, InvalidTransition) as exc:
            with lock:
                out["late"].append(str(exc))
        except BaseException as exc:
            with lock:
                out["crashed"].append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return out


def _check_decided_once(run, row, out, users) -> None:
    assert out["crashed"] == []
    assert len(out["counted"]) == 1 and len(out["decided"]) == 1, out
    assert len(out["late"]) == len(users) - 2
    row.refresh_from_db()
    assert row.state == "approved" and row.decided_by.username == out["decided"][0]
    assert ApprovalGiven.objects.filter(request=row).count() == 2
    assert Event.objects.filter(request=row, action="approval_given").count() == 1
    assert Event.objects.filter(request=row, action="request_approved").count() == 1
    assert Event.objects.filter(run=run, action="run_resumed").count() == 1
    assert len(tasks_for(run)) == 2  # the start and exactly one resume
    assert drain() == 1
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "refund issued: $120 to order A-1001"
    assert run.executions.count() == 1


@pytest.mark.postgres
def test_ten_approvers_racing_on_postgres_decide_once(on_postgres):
    if not on_postgres:
        pytest.skip("needs PostgreSQL (set DATABASE_URL)")
    _two_person_rule()
    users = [make_user(username=f"pg-{i}") for i in range(10)]
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    _check_decided_once(run, row, _race(row.request_id, users), users)


@pytest.mark.postgres
def test_two_approvers_racing_on_postgres_decide_once(on_postgres):
    if not on_postgres:
        pytest.skip("needs PostgreSQL (set DATABASE_URL)")
    _two_person_rule()
    users = [make_user(username="ann"), make_user(username="bob")]
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    _check_decided_once(run, row, _race(row.request_id, users), users)


def test_three_approvers_racing_decide_once():
    _two_person_rule()
    users = [make_user(username=f"r-{i}") for i in range(3)]
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    _check_decided_once(run, row, _race(row.request_id, users), users)


@pytest.mark.usefixtures("in_memory_layer")
async def test_a_counted_approval_shows_live_on_the_request_page_and_in_the_inbox():
    await in_thread(_two_person_rule)
    starter, first, second = (
        await user_of("reviewer"),
        await user_of("reviewer"),
        await user_of("reviewer"),
    )
    _, row = await halted_run(starter)
    page, snapshot = await open_socket(f"/ws/inbox/?view=request&r={row.request_id}", second)
    inbox, _ = await open_socket(f"/ws/inbox/?r={row.request_id}", starter)
    try:
        assert "0 of 2 approved" in snapshot
        await in_thread(services.request_approve, request_id=row.request_id, user=first)
        said = await frame_with(page, "of 2 approved")
        assert f"1 of 2 approved: {first.username}" in said
        assert f'<article id="request-{row.pk}" hx-swap-oob="true"' in said
        assert "state-pending" in said
        listed = await frame_with(inbox, "of 2 approved")
        assert f"1 of 2 approved: {first.username}" in listed
        assert 'class="approval-progress">1 of 2 approved<' in listed  # the row, too
    finally:
        await page.disconnect()
        await inbox.disconnect()


def _notify_rule_and_member(member_id: int) -> None:
    from django.contrib.auth.models import Group

    oncall = Group.objects.create(name="On call")
    oncall.user_set.add(member_id)
    _two_person_rule(escalate_after_minutes=30, escalate_action="notify", escalate_group=oncall)


def _escalate_later() -> int:
    from datetime import timedelta

    from django.utils import timezone

    from approvals.execution import escalation

    return escalation.requests_escalate_due(now=timezone.now() + timedelta(minutes=31))


@pytest.mark.usefixtures("in_memory_layer")
async def test_a_notify_escalation_toasts_the_groups_members_only():
    member, outsider = await user_of("reviewer"), await user_of("reviewer")
    await in_thread(_notify_rule_and_member, member.pk)
    _, row = await halted_run(outsider)
    told, _ = await open_socket("/ws/inbox/", member)
    untold, _ = await open_socket(f"/ws/runs/{row.run_id}/", outsider)
    try:
        assert await in_thread(_escalate_later) == 1
        toast = await frame_with(told, "Escalated to On call")
        assert "is still waiting" in toast and f'data-request="request-{row.pk}"' in toast
        heard = []  # the outsider's run page hears the change, never the toast
        while not await untold.receive_nothing(timeout=0.5):
            heard.append(await untold.receive_from(timeout=1))
        assert not any("Escalated to" in frame for frame in heard)
    finally:
        await told.disconnect()
        await untold.disconnect()


def test_two_workers_escalating_at_once_decline_once():
    _two_person_rule(
        escalate_after_minutes=30, escalate_action="decline", escalate_reason="too slow"
    )
    run = start_and_halt(user=make_user())
    row = run.requests.get()
    barrier = threading.Barrier(2)
    counts, crashed = [], []

    def sweep() -> None:
        try:
            barrier.wait(timeout=30)
            counts.append(_escalate_later())
        except BaseException as exc:
            crashed.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert crashed == [] and sorted(counts) == [0, 1]
    row.refresh_from_db()
    assert row.state == "declined" and row.reason == "too slow"
    assert Event.objects.filter(request=row, action="request_escalated").count() == 1
    assert Event.objects.filter(run=run, action="run_resumed").count() == 1
    assert len(tasks_for(run)) == 2
