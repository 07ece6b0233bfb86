"""Rules that require people: N distinct approvers, a group, no approval by the run's starter.

A matching require_* rule decides nothing: the request waits with the rule's requirements
on it; each approval short of N is counted (once per person) and the Nth decides it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group

from approvals import services
from approvals.domain.exceptions import InvalidTransition, NotAllowed
from approvals.models import ApprovalGiven, ApprovalRequest, Event, RequestRequirement, Rule
from approvals.services.rules import RuleInvalid, rule_create

from .factories import (
    bearer,
    drain,
    fresh,
    make_user,
    post_json,
    session_client,
    start_and_halt,
    tasks_for,
    tool_output,
)

pytestmark = pytest.mark.django_db

State = ApprovalRequest.State


def two_person_rule(**fields) -> Rule:
    fields.setdefault("name", "big refunds")
    fields.setdefault("effect", Rule.Effect.REQUIRE_APPROVERS)
    fields.setdefault("approvals_needed", 2)
    fields.setdefault("tool", "refund")
    return Rule.objects.create(**fields)


def manager():
    user = make_user(role="superuser")
    return user


# -- rules as people write them ------------------------------------------------------------


def test_require_approvers_needs_two_or_more():
    with pytest.raises(RuleInvalid, match="approvals_needed: require_approvers needs 2 or more"):
        rule_create(user=manager(), name="x", effect="require_approvers")
    rule = rule_create(user=manager(), name="x", effect="require_approvers", approvals_needed=3)
    assert rule.approvals_needed == 3


def test_require_group_needs_an_existing_group_by_name():
    with pytest.raises(RuleInvalid, match="approver_group: require_group needs the group"):
        rule_create(user=manager(), name="x", effect="require_group")
    with pytest.raises(RuleInvalid, match="approver_group: there is no group named 'Finance'"):
        rule_create(user=manager(), name="x", effect="require_group", approver_group="Finance")
    finance = Group.objects.create(name="Finance")
    rule = rule_create(user=manager(), name="x", effect="require_group", approver_group="Finance")
    assert rule.approver_group == finance


def test_requirements_and_escalation_refused_on_a_deciding_rule():
    with pytest.raises(RuleInvalid, match="effect: approvers, a group or the starter flag"):
        rule_create(user=manager(), name="x", effect="approve", approvals_needed=2)
    with pytest.raises(RuleInvalid, match="escalate_action: only a request that waits"):
        rule_create(
            user=manager(),
            name="x",
            effect="approve",
            escalate_action="decline",
            escalate_after_minutes=5,
        )


def test_api_creates_and_shows_a_two_person_rule(client):
    group = Group.objects.create(name="Finance")
    admin = manager()
    response = post_json(
        client,
        "/api/rules",
        {
            "name": "big refunds",
            "effect": "require_approvers",
            "approvals_needed": 2,
            "approver_group": "Finance",
            "starter_may_not_approve": True,
        },
        headers=bearer(admin),
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["effect"] == "require_approvers" and body["approvals_needed"] == 2
    assert body["approver_group"] == group.name and body["starter_may_not_approve"] is True
    bad = post_json(
        client,
        "/api/rules",
        {"name": "x", "effect": "require_approvers", "approvals_needed": 1},
        headers=bearer(admin),
    )
    assert bad.status_code == 400
    assert bad.json()["detail"].startswith("approvals_needed:")


# -- a matching rule leaves the request pending with its requirements ------------------------


def test_a_require_rule_leaves_the_request_pending_with_its_requirements():
    rule = two_person_rule(starter_may_not_approve=True)
    run = start_and_halt()
    assert run.status == "pending"
    row = run.requests.get()
    assert row.state == State.PENDING and row.decided_by_rule is None
    requirement = RequestRequirement.objects.get(request=row)
    assert requirement.rule == rule and requirement.rule_version == 1
    assert requirement.approvals_needed == 2 and requirement.starter_may_not_approve
    assert requirement.escalate_at is None
    rule.refresh_from_db()
    assert rule.match_count == 1


def test_a_request_outside_the_rule_has_no_requirement():
    two_person_rule(condition="args.amount > 1000")
    run = start_and_halt()
    assert not RequestRequirement.objects.filter(request__run=run).exists()


# -- two-person approval ---------------------------------------------------------------------


def test_the_second_distinct_approval_decides_and_resumes_once():
    two_person_rule()
    run = start_and_halt()
    row = run.requests.get()
    first, second = make_user(username="ann"), make_user(username="bob")
    done = services.request_approve(request_id=row.request_id, user=first)
    assert done.partial_approval.message == "1 of 2 approved: ann"
    row.refresh_from_db()
    assert row.state == State.PENDING and fresh(run).status == "pending"
    assert len(tasks_for(run)) == 1  # no resume queued
    given = Event.objects.get(request=row, action="approval_given")
    assert given.actor == first and given.detail["approvers"] == ["ann"]
    with pytest.raises(InvalidTransition, match="you already approved"):
        services.request_approve(request_id=row.request_id, user=first)
    assert ApprovalGiven.objects.filter(request=row).count() == 1
    decided = services.request_approve(request_id=row.request_id, user=second)
    assert getattr(decided, "partial_approval", None) is None
    row.refresh_from_db()
    assert row.state == State.APPROVED and row.decided_by == second
    assert len(tasks_for(run)) == 2
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "refund issued: $120 to order A-1001"
    assert run.executions.count() == 1


def test_one_decline_ends_it_after_an_approval():
    two_person_rule()
    run = start_and_halt()
    row = run.requests.get()
    services.request_approve(request_id=row.request_id, user=make_user())
    services.request_decline(request_id=row.request_id, user=make_user(), reason="no")
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: no"


def test_edits_are_refused_on_a_request_needing_several_approvers():
    two_person_rule(kind="approval", tool="delete_account")
    run = start_and_halt(prompt="delete account acct-7")
    row = run.requests.get()
    with pytest.raises(services.InvalidInput, match="needs 2 approvers: approve it as shown"):
        services.request_approve(
            request_id=row.request_id, user=make_user(), input={"account": "acct-8"}
        )
    assert not ApprovalGiven.objects.exists()


# -- who may decide ----------------------------------------------------------------------------


def test_group_rule_refuses_others_on_the_service_and_allows_members():
    finance = Group.objects.create(name="Finance")
    two_person_rule(effect=Rule.Effect.REQUIRE_GROUP, approvals_needed=1, approver_group=finance)
    run = start_and_halt()
    row = run.requests.get()
    outsider, member = make_user(), make_user()
    member.groups.add(finance)
    message = "only members of the group 'Finance' may decide this request"
    with pytest.raises(NotAllowed, match=message):
        services.request_approve(request_id=row.request_id, user=outsider)
    with pytest.raises(NotAllowed, match=message):
        services.request_decline(request_id=row.request_id, user=outsider)
    services.request_approve(request_id=row.request_id, user=member)
    row.refresh_from_db()
    assert row.state == State.APPROVED and row.decided_by == member


def test_the_starter_may_not_approve_but_may_decline():
    two_person_rule(starter_may_not_approve=True)
    starter = make_user()
    run = start_and_halt(user=starter)
    row = run.requests.get()
    with pytest.raises(NotAllowed, match="whoever started this run may not approve"):
        services.request_approve(request_id=row.request_id, user=starter)
    assert not ApprovalGiven.objects.exists()
    services.request_decline(request_id=row.request_id, user=starter, reason="changed my mind")
    row.refresh_from_db()
    assert row.state == State.DECLINED


# -- every surface: API, bulk, card ----------------------------------------------------------


def test_api_approve_answers_202_until_complete(client):
    two_person_rule()
    run = start_and_halt()
    row = run.requests.get()
    ann, bob = make_user(username="ann"), make_user(username="bob")
    path = f"/api/requests/{row.request_id}/approve"
    first = post_json(client, path, {}, headers=bearer(ann))
    assert first.status_code == 202, first.content
    assert first.json() == {
        "id": row.request_id,
        "state": "pending",
        "message": "1 of 2 approved: ann",
        "given": 1,
        "needed": 2,
        "approvers": ["ann"],
    }
    again = post_json(client, path, {}, headers=bearer(ann))
    assert again.status_code == 409 and "already approved" in again.json()["detail"]
    second = post_json(client, path, {}, headers=bearer(bob))
    assert second.status_code == 200 and second.json()["state"] == "approved"


def test_api_reads_what_a_request_still_needs(client):
    """GET /api/requests/{id} says what the rule requires and who approved so far: a host
    can tell "waits for a second approver" from "waits for anyone"."""
    two_person_rule(starter_may_not_approve=True)
    row = start_and_halt(user=make_user()).requests.get()
    plain = start_and_halt(prompt="Delete account acct-7").requests.get()
    reader = make_user(username="reader")

    def requirement(request_id: str):
        answer = client.get(f"/api/requests/{request_id}", headers=bearer(reader))
        assert answer.status_code == 200, answer.content
        return answer.json()["requirement"]

    expected = {
        "approvals_needed": 2,
        "approved_by": [],
        "group": None,
        "starter_may_not_approve": True,
        "routed_to": None,
        "escalated": False,
    }
    assert requirement(row.request_id) == expected
    assert requirement(plain.request_id) is None
    services.request_approve(request_id=row.request_id, user=make_user(username="ann"))
    assert requirement(row.request_id) == {**expected, "approved_by": ["ann"]}
    schema = client.get("/api/openapi.json").json()["components"]["schemas"]
    assert "approved_by" in schema["RequirementOut"]["properties"]


def test_api_refuses_forbidden_approvers(client):
    finance = Group.objects.create(name="Finance")
    two_person_rule(approver_group=finance, starter_may_not_approve=True)
    starter = make_user()
    starter.groups.add(finance)
    row = start_and_halt(user=starter).requests.get()
    path = f"/api/requests/{row.request_id}/approve"
    outsider = post_json(client, path, {}, headers=bearer(make_user()))
    assert outsider.status_code == 403
    assert outsider.json()["detail"] == (
        "only members of the group 'Finance' may decide this request"
    )
    own = post_json(client, path, {}, headers=bearer(starter))
    assert own.status_code == 403 and "whoever started this run" in own.json()["detail"]
    declined = post_json(
        client,
        f"/api/requests/{row.request_id}/decline",
        {"reason": "x"},
        headers=bearer(make_user()),
    )
    assert declined.status_code == 403
    row.refresh_from_db()
    assert row.state == State.PENDING and not ApprovalGiven.objects.exists()


def test_bulk_counts_partial_approvals_and_refuses_forbidden_ones(client):
    two_person_rule(starter_may_not_approve=True)
    starter = make_user()
    a = start_and_halt(user=starter).requests.get()
    b = start_and_halt(user=make_user()).requests.get()
    ann = make_user(username="ann")
    results = services.requests_bulk(
        request_ids=[a.request_id, b.request_id], user=ann, action="approve"
    )
    assert [(r.status, r.message) for r in results] == [
        ("partial", "1 of 2 approved: ann"),
        ("partial", "1 of 2 approved: ann"),
    ]
    response = post_json(
        client,
        "/api/requests/bulk",
        {"ids": [a.request_id, b.request_id], "action": "approve"},
        headers=bearer(starter),
    )
    statuses = {r["id"]: r for r in response.json()["results"]}
    assert statuses[a.request_id]["status"] == "forbidden"
    assert "whoever started this run" in statuses[a.request_id]["message"]
    assert statuses[b.request_id]["status"] == "done"
    a.refresh_from_db()
    assert a.state == State.PENDING


def test_card_approve_keeps_the_card_with_the_count_and_refuses_the_starter():
    two_person_rule(starter_may_not_approve=True)
    starter = make_user()
    row = start_and_halt(user=starter).requests.get()
    path = f"/requests/{row.request_id}/approve/"
    refused = session_client(starter).post(path, {"confirmed": "1"}, headers={"HX-Request": "true"})
    assert refused.status_code == 403
    assert "whoever started this run may not approve" in refused.content.decode()
    ann = make_user(username="ann")
    counted = session_client(ann).post(path, {"confirmed": "1"}, headers={"HX-Request": "true"})
    assert counted.status_code == 200
    assert counted["X-Toolnexus-Outcome"] == "info"
    assert "Your approval counts: 1 of 2 approved: ann." in counted.content.decode()
    row.refresh_from_db()
    assert row.state == State.PENDING


def test_the_inbox_row_says_how_many_approvals_a_request_has_of_how_many():
    """The list tells apart a request that needs a second approver from one that needs a
    first: "1 of 2 approved" in its row; a request without the requirement says nothing."""
    two_person_rule()
    row = start_and_halt(user=make_user(), prompt="Refund order A-1001, $120").requests.get()
    plain = start_and_halt(user=make_user(), prompt="Delete account acct-7").requests.get()
    viewer = session_client(make_user(username="viewer"))

    def progress_in_rows() -> dict[str, list[str]]:
        html = viewer.get("/").content.decode()
        found = {}
        for request in (row, plain):
            item = html.split(f'id="row-{request.pk}"', 1)[1].split("</li>", 1)[0]
            found[request.request_id] = re.findall(r'class="approval-progress">([^<]*)<', item)
        return found

    assert progress_in_rows() == {row.request_id: ["0 of 2 approved"], plain.request_id: []}
    services.request_approve(request_id=row.request_id, user=make_user(username="ann"))
    assert progress_in_rows() == {row.request_id: ["1 of 2 approved"], plain.request_id: []}


# -- the Rules page ------------------------------------------------------------------------


def test_the_rules_page_creates_a_two_person_rule_and_says_what_is_missing():
    from django.contrib.auth.models import Permission

    user = make_user()
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    client = session_client(type(user).objects.get(pk=user.pk))
    oncall = Group.objects.create(name="On call")
    form = {
        "new-name": "big refunds",
        "new-position": "10",
        "new-enabled": "on",
        "new-tool": "refund",
        "new-effect": "require_approvers",
        "new-approvals_needed": "1",
    }
    refused = client.post("/rules/", form)
    assert refused.status_code == 400
    assert "require_approvers needs 2 or more approvers" in refused.content.decode()
    assert not Rule.objects.exists()
    form.update(
        {
            "new-approvals_needed": "2",
            "new-escalate_after_minutes": "30",
            "new-escalate_action": "notify",
            "new-escalate_group": str(oncall.pk),
        }
    )
    made = client.post("/rules/", form)
    assert made.status_code == 302, made.content.decode()[:3000]
    rule = Rule.objects.get()
    assert (rule.effect, rule.approvals_needed, rule.escalate_group) == (
        "require_approvers",
        2,
        oncall,
    )


def test_the_admin_lists_requirements_and_approvals_given():
    two_person_rule()
    row = start_and_halt().requests.get()
    services.request_approve(request_id=row.request_id, user=make_user(username="ann"))
    client = session_client(make_user(role="superuser"))
    given = client.get("/admin/approvals/approvalgiven/")
    assert given.status_code == 200 and "ann" in given.content.decode()
    required = client.get("/admin/approvals/requestrequirement/")
    assert required.status_code == 200 and row.request_id in required.content.decode()
