""" "Always allow" from the card and the API: approving a request also makes an approve rule
(in the decision's transaction), for people who may manage rules only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from approvals import services, testing
from approvals.domain.conditions import equals_condition, evaluate
from approvals.models import ApprovalRequest, Rule

from .factories import make_request, make_user, post_json, session_client

pytestmark = pytest.mark.django_db

State = ApprovalRequest.State
SMALL = "Refund $20 on order A-1"


def rule_manager():
    user = make_user()
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


def approve_always(run, user, scope, **options):
    row = run.requests.get(state=State.PENDING)
    services.request_approve(request_id=row.request_id, user=user, always_allow=scope, **options)
    return row


# -- the condition for exact arguments -------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"order": "A-1", "amount": 20},
        {"amount": 20.5, "note": None, "ok": True, "tags": ["a", "b"], "n": {"x": -3}},
        {"text": 'quote " back \\ slash\nline\ttab é 😀'},
        {"order": '"} || true || {"'},  # a value cannot close the literal
        {"weird key \"'": 1e-7},
    ],
)
def test_an_exact_arguments_condition_holds_for_those_arguments_only(args):
    condition = equals_condition(args)
    assert evaluate(condition, args=args, run={}) is True
    other = {**args, "extra": 1}
    assert evaluate(condition, args=other, run={}) is False


def test_an_injected_value_is_text_in_the_condition():
    condition = equals_condition({"order": '"} || true || {"'})
    assert evaluate(condition, args={"order": "A-2"}, run={}) is False


def test_a_value_cel_cannot_state_is_refused():
    with pytest.raises(ValueError):
        equals_condition({"amount": float("nan")})


# -- the service -----------------------------------------------------------------------------


def test_exact_arguments_approves_the_next_identical_call_and_no_other():
    user = rule_manager()
    run = testing.start(agent="demo", prompt=SMALL)
    row = approve_always(run, user, "args")
    rule = Rule.objects.get()
    assert (rule.effect, rule.agent, rule.tool, rule.kind) == (
        "approve",
        "demo",
        "refund",
        "tool_call",
    )
    assert rule.created_by == user and rule.source_request_id == row.pk
    assert rule.run_id is None and rule.expires_at is None
    assert rule.condition.startswith("args == {")
    row.refresh_from_db()
    assert row.state == State.APPROVED and row.decided_by == user

    again = testing.start(agent="demo", prompt=SMALL)
    assert again.status == "done", again.error
    assert again.requests.get().decided_by_rule == rule
    other = testing.start(agent="demo", prompt="Refund $30 on order A-1")
    assert other.status == "pending"


def test_this_run_only_matches_calls_of_that_run():
    user = rule_manager()
    run = testing.start(agent="demo", prompt=SMALL)
    approve_always(run, user, "run")
    rule = Rule.objects.get()
    assert rule.run_id == run.pk and rule.condition == ""
    assert testing.start(agent="demo", prompt=SMALL).status == "pending"


def test_for_24_hours_expires_a_day_later_and_always_has_no_limit():
    user = rule_manager()
    approve_always(testing.start(agent="demo", prompt=SMALL), user, "day")
    day = Rule.objects.get()
    left = day.expires_at - timezone.now()
    assert timedelta(hours=23, minutes=59) < left <= timedelta(hours=24)
    assert testing.start(agent="demo", prompt="Refund $99 on order B-2").status == "done"
    day.delete()
    approve_always(testing.start(agent="demo", prompt=SMALL), user, "always")
    always = Rule.objects.get()
    assert always.expires_at is None and always.condition == "" and always.run_id is None
    assert always.name == "Always allow refund always"


def test_an_approval_gated_tool_is_always_allowed_with_its_kind():
    user = rule_manager()
    run = testing.start(agent="demo", prompt="delete account acct-7")
    approve_always(run, user, "args")
    rule = Rule.objects.get()
    assert (rule.kind, rule.tool) == ("approval", "delete_account")
    assert testing.start(agent="demo", prompt="delete account acct-7").status == "done"


def test_without_manage_rules_nothing_is_decided_or_made():
    reviewer = make_user()
    run = testing.start(agent="demo", prompt=SMALL)
    with pytest.raises(services.NotAllowed, match="manage rules"):
        approve_always(run, reviewer, "always")
    assert run.requests.get().state == State.PENDING
    assert not Rule.objects.exists()


def test_an_edited_approval_or_an_unknown_scope_is_refused_and_nothing_is_stored():
    user = rule_manager()
    run = testing.start(agent="demo", prompt=SMALL)
    with pytest.raises(services.InvalidInput, match="as the model asked"):
        approve_always(run, user, "always", input={"order": "A-1", "amount": 5})
    with pytest.raises(services.InvalidInput, match="always_allow: must be one of"):
        approve_always(run, user, "forever")
    row = run.requests.get()
    assert row.state == State.PENDING and not Rule.objects.exists()
    assert row.calls.get().decision == ""


def test_a_glob_character_in_a_tool_name_is_matched_literally():
    user = rule_manager()
    approval = make_request(kind="approval", tool="refund*", input={"amount": 1})
    services.request_approve(request_id=approval.request_id, user=user, always_allow="always")
    assert Rule.objects.get().tool == "refund[*]"


# -- the API ---------------------------------------------------------------------------------


def test_the_api_makes_the_rule_with_the_decision():
    user = rule_manager()
    run = testing.start(agent="demo", prompt=SMALL)
    row = run.requests.get()
    client = session_client(user)
    response = post_json(
        client, f"/api/requests/{row.request_id}/approve", {"always_allow": "args"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "approved"
    rule = Rule.objects.get()
    listed = client.get(f"/api/rules/{rule.pk}").json()
    assert listed["source_request"] == row.request_id and listed["created_by"] == user.username


def test_the_api_refuses_always_allow_without_manage_rules_with_403():
    run = testing.start(agent="demo", prompt=SMALL)
    row = run.requests.get()
    client = session_client(make_user())
    response = post_json(
        client, f"/api/requests/{row.request_id}/approve", {"always_allow": "always"}
    )
    assert response.status_code == 403
    assert "manage rules" in response.json()["detail"]
    assert run.requests.get().state == State.PENDING and not Rule.objects.exists()


def test_the_api_names_an_unknown_scope():
    run = testing.start(agent="demo", prompt=SMALL)
    row = run.requests.get()
    client = session_client(rule_manager())
    response = post_json(
        client, f"/api/requests/{row.request_id}/approve", {"always_allow": "forever"}
    )
    assert response.status_code == 400
    assert "always_allow" in response.json()["detail"]
    assert run.requests.get().state == State.PENDING


def test_the_schema_lists_the_field():
    schema = session_client(rule_manager()).get("/api/openapi.json").json()
    props = schema["components"]["schemas"]["ApproveIn"]["properties"]
    assert "always_allow" in props


# -- the card --------------------------------------------------------------------------------


def test_the_card_offers_always_allow_to_rule_managers_only():
    run = testing.start(agent="demo", prompt=SMALL)
    row = run.requests.get()
    manager = session_client(rule_manager()).get(f"/requests/{row.request_id}/").content.decode()
    assert 'name="always_allow"' in manager and 'value="run">for this run only' in manager
    reviewer = session_client(make_user()).get(f"/requests/{row.request_id}/").content.decode()
    assert 'name="always_allow"' not in reviewer
    assert "Approve" in reviewer


def test_posting_always_allow_from_the_card_makes_the_rule_shown_on_the_rules_page():
    user = rule_manager()
    run = testing.start(agent="demo", prompt=SMALL)
    row = run.requests.get()
    client = session_client(user)
    response = client.post(
        f"/requests/{row.request_id}/approve/",
        {"always_allow": "on", "always_allow_scope": "day"},
    )
    assert response.status_code == 302
    rule = Rule.objects.get()
    assert rule.expires_at is not None and rule.source_request_id == row.pk
    page = client.get("/rules/").content.decode()
    assert f"request {row.request_id}" in page and f"by {user.username}" in page


def test_the_card_refuses_always_allow_without_manage_rules_and_decides_nothing():
    run = testing.start(agent="demo", prompt=SMALL)
    row = run.requests.get()
    client = session_client(make_user())
    response = client.post(
        f"/requests/{row.request_id}/approve/",
        {"always_allow": "on", "always_allow_scope": "always"},
    )
    assert response.status_code == 403
    assert run.requests.get().state == State.PENDING and not Rule.objects.exists()
