"""A rule that routes: a matching call waits in the inbox as usual, routed from the start to
the rule's person or group, exactly as a reassign escalation routes it ("routed to me",
`claim=routed`, the card, the API's `requirement.routed_to`); it may still escalate."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from approvals import selectors, services
from approvals.execution import escalation
from approvals.models import ApprovalRequest, Event, RequestRequirement, Rule
from approvals.services.rules import RuleInvalid, rule_create, rule_update

from .factories import (
    bearer,
    drain,
    fresh,
    inbox,
    make_request,
    make_user,
    post_json,
    session_client,
    start_and_halt,
)

pytestmark = pytest.mark.django_db

State = ApprovalRequest.State


def route_rule(**fields) -> Rule:
    fields.setdefault("name", "refunds to the desk")
    fields.setdefault("tool", "refund")
    return Rule.objects.create(effect=Rule.Effect.ROUTE, **fields)


def rule_manager(**options):
    user = make_user(**options)
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


# -- at the halt ---------------------------------------------------------------------------


def test_a_route_rule_routes_the_halt_to_a_person_and_decides_nothing(client):
    rita, other = make_user(username="rita"), make_user()
    rule = route_rule(route_user=rita)
    run = start_and_halt()
    row = run.requests.get()
    assert run.status == "pending" and row.state == State.PENDING
    assert row.decided_by_rule is None  # a route decides nothing
    requirement = RequestRequirement.objects.get(request=row)
    assert (requirement.rule, requirement.rule_version) == (rule, 1)
    assert requirement.routed_user == rita and requirement.routed_group is None
    assert requirement.escalated_at is None and requirement.escalate_at is None
    # waits in the inbox as usual, and under "routed to me" for rita only
    assert row.request_id in inbox(other)
    assert inbox(rita, claim="routed") == [row.request_id]
    assert inbox(other, claim="routed") == []
    listed = client.get("/api/requests?claim=routed", headers=bearer(rita)).json()
    assert [r["request"]["id"] for r in listed["items"]] == [row.request_id]
    assert client.get("/api/requests?claim=routed", headers=bearer(other)).json()["items"] == []
    read = client.get(f"/api/requests/{row.request_id}", headers=bearer(other)).json()
    assert read["requirement"]["routed_to"] == "rita"
    assert read["requirement"]["escalated"] is False
    client.force_login(other)
    card = client.get(f"/requests/{row.request_id}/").content.decode()
    assert "routed to rita" in card
    # anyone who may decide still decides it; the run resumes as usual
    services.request_approve(request_id=row.request_id, user=other)
    drain()
    assert fresh(run).status == "done"
    assert Rule.objects.get(pk=rule.pk).match_count == 1


def test_a_route_rule_to_a_group_routes_to_its_members():
    desk = Group.objects.create(name="Refund desk")
    member, outsider = make_user(), make_user()
    member.groups.add(desk)
    route_rule(route_group=desk)
    row = start_and_halt().requests.get()
    assert inbox(member, claim="routed") == [row.request_id]
    assert inbox(outsider, claim="routed") == []
    view = selectors.requirement_view(row)
    assert view.routed_to == "the group Refund desk" and view.needed == 1


def test_a_call_outside_the_route_rule_is_not_routed():
    rita = make_user(username="rita")
    route_rule(route_user=rita, tool="delete_account")
    row = start_and_halt().requests.get()
    assert not RequestRequirement.objects.filter(request=row).exists()
    assert inbox(rita, claim="routed") == []


def test_a_routed_request_still_escalates():
    rita, sam = make_user(username="rita"), make_user(username="sam")
    route_rule(
        route_user=rita,
        escalate_after_minutes=15,
        escalate_action=Rule.Escalation.REASSIGN,
        escalate_user=sam,
    )
    row = start_and_halt().requests.get()
    assert inbox(rita, claim="routed") == [row.request_id]
    later = timezone.now() + timedelta(minutes=16)
    assert escalation.requests_escalate_due(now=later) == 1
    event = Event.objects.get(request=row, action="request_escalated")
    assert event.detail == {"escalation": "reassign", "routed_to": "sam"}
    assert inbox(sam, claim="routed") == [row.request_id]
    assert inbox(rita, claim="routed") == []


def test_a_route_rule_decline_escalation_declines_the_routed_request():
    route_rule(
        route_user=make_user(username="rita"),
        escalate_after_minutes=15,
        escalate_action=Rule.Escalation.DECLINE,
        escalate_reason="nobody on the desk took it",
    )
    run = start_and_halt()
    escalation.requests_escalate_due(now=timezone.now() + timedelta(minutes=16))
    row = run.requests.get()
    assert row.state == State.DECLINED and row.reason == "nobody on the desk took it"


# -- rules as people write them ------------------------------------------------------------


def test_a_route_rule_needs_exactly_one_person_or_group():
    admin = make_user(role="superuser")
    make_user(username="rita")
    Group.objects.create(name="Refund desk")
    with pytest.raises(RuleInvalid, match="route_user: route needs the person or the group"):
        rule_create(user=admin, name="x", effect="route")
    with pytest.raises(RuleInvalid, match="route_group: route to one person or one group, not"):
        rule_create(
            user=admin, name="x", effect="route", route_user="rita", route_group="Refund desk"
        )
    with pytest.raises(RuleInvalid, match="route_user: there is no user named 'nobody'"):
        rule_create(user=admin, name="x", effect="route", route_user="nobody")
    with pytest.raises(RuleInvalid, match="route_user: only a route rule routes"):
        rule_create(user=admin, name="x", effect="approve", route_user="rita")
    with pytest.raises(RuleInvalid, match="effect: approvers, a group or the starter flag"):
        rule_create(user=admin, name="x", effect="route", route_user="rita", approvals_needed=2)
    assert not Rule.objects.exists()
    rule = rule_create(
        user=admin,
        name="x",
        effect="route",
        route_group="Refund desk",
        escalate_after_minutes=30,
        escalate_action="notify",
        escalate_group="Refund desk",
    )
    assert rule.route_group.name == "Refund desk" and rule.route_user is None


def test_an_edit_away_from_route_must_clear_its_person():
    admin = make_user(role="superuser")
    rule = route_rule(route_user=make_user(username="rita"))
    with pytest.raises(RuleInvalid, match="route_user: only a route rule routes"):
        rule_update(user=admin, rule_id=rule.pk, effect="approve")
    changed = rule_update(user=admin, rule_id=rule.pk, effect="approve", route_user=None)
    assert changed.effect == "approve" and changed.route_user is None and changed.version == 2


def test_the_api_creates_reads_and_refuses_route_rules(client):
    make_user(username="rita")
    Group.objects.create(name="Refund desk")
    headers = bearer(rule_manager())
    made = post_json(
        client,
        "/api/rules",
        {"name": "refunds to rita", "tool": "refund", "effect": "route", "route_user": "rita"},
        headers=headers,
    )
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["effect"], body["route_user"], body["route_group"]) == ("route", "rita", None)
    listed = client.get("/api/rules", headers=headers).json()
    assert [r["route_user"] for r in listed] == ["rita"]
    missing = post_json(client, "/api/rules", {"name": "x", "effect": "route"}, headers=headers)
    assert missing.status_code == 400
    assert missing.json()["detail"].startswith("route_user: route needs the person or the group")
    both = post_json(
        client,
        "/api/rules",
        {"name": "x", "effect": "route", "route_user": "rita", "route_group": "Refund desk"},
        headers=headers,
    )
    assert both.status_code == 400 and both.json()["detail"].startswith("route_group:")
    rule_id = body["id"]
    regrouped = client.patch(
        f"/api/rules/{rule_id}",
        data={"route_user": None, "route_group": "Refund desk"},
        content_type="application/json",
        headers=headers,
    )
    assert regrouped.status_code == 200, regrouped.content
    assert (regrouped.json()["route_user"], regrouped.json()["route_group"]) == (
        None,
        "Refund desk",
    )
    assert Rule.objects.count() == 1


def test_route_is_in_the_openapi_schema(client):
    schemas = client.get("/api/openapi.json").json()["components"]["schemas"]
    rule_in = schemas["RuleIn"]["properties"]
    assert {"route_user", "route_group"} <= set(rule_in)
    assert '"route"' in rule_in["effect"]["description"]
    assert {"route_user", "route_group"} <= set(schemas["RuleOut"]["properties"])


def test_the_rules_page_refuses_a_route_without_a_target_at_the_field_and_creates_one():
    client = session_client(rule_manager())
    desk = Group.objects.create(name="Refund desk")
    form = {
        "new-name": "refunds to the desk",
        "new-position": "10",
        "new-enabled": "on",
        "new-tool": "refund",
        "new-effect": "route",
    }
    refused = client.post("/rules/", form)
    assert refused.status_code == 400
    body = refused.content.decode()
    assert 'id="id_new-route_user-error"' in body
    assert "route needs the person or the group to route to" in body
    assert not Rule.objects.exists()
    made = client.post("/rules/", {**form, "new-route_group": str(desk.pk)})
    assert made.status_code == 302, made.content.decode()[:3000]
    rule = Rule.objects.get()
    assert (rule.effect, rule.route_group, rule.route_user) == ("route", desk, None)
    assert "route to the group Refund desk" in client.get("/rules/").content.decode()


def test_the_admin_saves_a_route_rule_through_the_service(client):
    admin_user = make_user(role="superuser")
    admin_user.is_staff = True
    admin_user.save()
    rita = make_user(username="rita")
    client.force_login(admin_user)
    data = {
        "name": "to rita",
        "position": "10",
        "enabled": "on",
        "effect": "route",
        "expires_at": "",
    }
    refused = client.post("/admin/approvals/rule/add/", data)
    assert refused.status_code == 200
    assert "route needs the person or the group" in refused.content.decode()
    made = client.post("/admin/approvals/rule/add/", {**data, "route_user": str(rita.pk)})
    assert made.status_code == 302
    rule = Rule.objects.get()
    assert rule.route_user == rita and rule.created_by == admin_user


def test_a_dry_run_of_a_route_rule_decides_nothing():
    row = make_request(kind="approval", tool="refund", input={"amount": 5})
    services.request_approve(request_id=row.request_id, user=make_user())
    rule = Rule(name="x", effect="route", tool="refund", route_user=make_user())
    result = selectors.rule_dry_run(rule)
    assert (result.considered, result.matched) == (1, 1)
    assert (result.would_approve, result.would_decline, result.differs) == (0, 0, 0)
    assert result.items[0].would == "route" and not result.items[0].differs
