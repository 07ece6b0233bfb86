"""Escalation: a request a rule left waiting, still undecided after the rule's minutes, is
notified to a group, routed to a person or group, or declined; once, by the worker's
maintenance."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from approvals import services
from approvals.execution import escalation
from approvals.models import ApprovalRequest, Event, RequestRequirement, Rule

from .factories import bearer, drain, fresh, inbox, make_user, start_and_halt, tool_output

pytestmark = pytest.mark.django_db

State = ApprovalRequest.State


def escalating_rule(action: str, **fields) -> Rule:
    fields.setdefault("effect", Rule.Effect.REQUIRE_APPROVERS)
    fields.setdefault("approvals_needed", 2)
    return Rule.objects.create(
        name="big refunds",
        tool="refund",
        escalate_after_minutes=30,
        escalate_action=action,
        **fields,
    )


def later(minutes: int = 31):
    return timezone.now() + timedelta(minutes=minutes)


def test_the_rule_sets_when_the_request_escalates():
    escalating_rule("decline")
    row = start_and_halt().requests.get()
    due = RequestRequirement.objects.get(request=row).escalate_at
    assert timedelta(minutes=29) < due - row.created_at <= timedelta(minutes=31)
    assert escalation.requests_escalate_due() == 0  # not yet
    assert Event.objects.filter(action="request_escalated").count() == 0


def test_decline_escalation_declines_with_the_reason_and_the_run_resumes_once():
    escalating_rule("decline", escalate_reason="nobody approved it within 30 minutes")
    run = start_and_halt()
    row = run.requests.get()
    assert escalation.requests_escalate_due(now=later()) == 1
    assert escalation.requests_escalate_due(now=later(40)) == 0  # applied once
    row.refresh_from_db()
    assert row.state == State.DECLINED and row.decided_by is None
    assert row.reason == "nobody approved it within 30 minutes"
    escalated = Event.objects.get(request=row, action="request_escalated")
    assert escalated.detail == {"escalation": "decline"}
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == (
        "relay declined for refund: nobody approved it within 30 minutes"
    )


def test_a_request_decided_meanwhile_is_not_escalated():
    escalating_rule(
        "decline",
        effect=Rule.Effect.REQUIRE_GROUP,
        approvals_needed=1,
        approver_group=Group.objects.create(name="Finance"),
    )
    row = start_and_halt().requests.get()
    member = make_user()
    member.groups.add(Group.objects.get(name="Finance"))
    services.request_approve(request_id=row.request_id, user=member)
    assert escalation.requests_escalate_due(now=later()) == 0
    row.refresh_from_db()
    assert row.state == State.APPROVED


def test_notify_escalation_records_the_group_and_its_members():
    oncall = Group.objects.create(name="On call")
    rita, sam = make_user(username="rita"), make_user(username="sam")
    rita.groups.add(oncall)
    sam.groups.add(oncall)
    escalating_rule("notify", escalate_group=oncall)
    row = start_and_halt().requests.get()
    assert escalation.requests_escalate_due(now=later()) == 1
    event = Event.objects.get(request=row, action="request_escalated")
    assert event.detail == {"escalation": "notify", "group": "On call", "notified": ["rita", "sam"]}
    row.refresh_from_db()
    assert row.state == State.PENDING


def test_reassign_routes_to_a_person_who_sees_it_under_routed_to_me(client):
    rita = make_user(username="rita")
    other = make_user()
    escalating_rule("reassign", escalate_user=rita)
    row = start_and_halt().requests.get()
    assert inbox(rita, claim="routed") == []
    assert escalation.requests_escalate_due(now=later()) == 1
    requirement = RequestRequirement.objects.get(request=row)
    assert requirement.routed_user == rita and requirement.escalated_at is not None
    event = Event.objects.get(request=row, action="request_escalated")
    assert event.detail == {"escalation": "reassign", "routed_to": "rita"}
    assert inbox(rita, claim="routed") == [row.request_id]
    assert inbox(other, claim="routed") == []
    listed = client.get("/api/requests?claim=routed", headers=bearer(rita)).json()
    assert [r["request"]["id"] for r in listed["items"]] == [row.request_id]
    page = client.get(f"/requests/{row.request_id}/", headers={})  # signed out: redirect
    assert page.status_code == 302
    client.force_login(other)
    card = client.get(f"/requests/{row.request_id}/").content.decode()
    assert "routed to rita" in card


def test_reassign_to_a_group_routes_to_its_members():
    team = Group.objects.create(name="Refund desk")
    member, outsider = make_user(), make_user()
    member.groups.add(team)
    escalating_rule("reassign", escalate_group=team)
    row = start_and_halt().requests.get()
    escalation.requests_escalate_due(now=later())
    assert inbox(member, claim="routed") == [row.request_id]
    assert inbox(outsider, claim="routed") == []


def test_an_escalation_needs_its_action_and_target():
    from approvals.services.rules import RuleInvalid, rule_create

    admin = make_user(role="superuser")
    with pytest.raises(RuleInvalid, match="escalate_group: notify needs the group"):
        rule_create(
            user=admin,
            name="x",
            effect="require_approvers",
            approvals_needed=2,
            escalate_action="notify",
            escalate_after_minutes=5,
        )
    with pytest.raises(RuleInvalid, match="an escalation needs both an action and its minutes"):
        rule_create(
            user=admin,
            name="x",
            effect="require_approvers",
            approvals_needed=2,
            escalate_action="decline",
        )
    with pytest.raises(RuleInvalid, match="escalate_user: reassign routes to one person"):
        rule_create(
            user=admin,
            name="x",
            effect="require_approvers",
            approvals_needed=2,
            escalate_action="reassign",
            escalate_after_minutes=5,
        )
