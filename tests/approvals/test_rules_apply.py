""" "Apply to pending": a rule decides the pending requests it matches, each in its own
transaction, recorded as the rule's decision; listed as decided / skipped / failed."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from approvals import testing
from approvals.domain.exceptions import InvalidInput, NotAllowed
from approvals.models import AgentAccess, AgentPolicy, ApprovalRequest, Event, Rule
from approvals.services import request_decline
from approvals.services.rule_apply import rule_apply_pending

from .factories import claim, make_request, make_user, session_client

pytestmark = pytest.mark.django_db

State = ApprovalRequest.State


def rule_manager():
    user = make_user()  # a reviewer: may decide requests
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


def test_an_approve_rule_decides_the_matching_pending_requests_and_their_runs_go_on():
    small = [testing.start(agent="demo", prompt=f"Refund $5 on order A-{n}") for n in (1, 2)]
    large = testing.start(agent="demo", prompt="Refund $500 on order A-3")
    assert all(r.status == "pending" for r in [*small, large])
    rule = Rule.objects.create(name="small", effect="approve", condition="args.amount <= 50")
    user = rule_manager()

    outcomes = rule_apply_pending(user=user, rule_id=rule.pk)
    assert [(o.status, o.message) for o in outcomes] == [("done", "approved")] * 2
    for run in small:
        row = run.requests.get()
        assert row.state == State.APPROVED and row.decided_by is None
        assert row.decided_by_rule == rule and row.rule_version == 1
        event = Event.objects.get(request=row, action="request_approved")
        assert event.detail["rule"] == {"id": rule.pk, "name": "small", "version": 1}
        assert event.detail["applied_by"] == user.username and event.actor is None
    assert large.requests.get().state == State.PENDING
    rule.refresh_from_db()
    assert rule.match_count == 2 and rule.last_matched_at is not None

    testing.drain()
    for run in small:
        run.refresh_from_db()
        assert run.status == "done", run.error
        assert "refund issued: $5" in str(run.messages)


def test_a_decline_rule_declines_with_its_reason():
    run = testing.start(agent="demo", prompt="Refund $5 on order A-1")
    rule = Rule.objects.create(name="no", effect="decline", reason="billing does refunds")
    (outcome,) = rule_apply_pending(user=rule_manager(), rule_id=rule.pk)
    assert (outcome.status, outcome.message) == ("done", "declined")
    row = run.requests.get()
    assert row.state == State.DECLINED and row.reason == "billing does refunds"
    testing.drain()
    run.refresh_from_db()
    assert "billing does refunds" in str(run.messages)


def test_claimed_by_another_and_a_call_with_no_executor_fail_and_the_others_are_decided():
    user = rule_manager()
    claimed = make_request(kind="approval", tool="delete_account", input={"account": "a"})
    claim(claimed, make_user())
    no_executor = make_request(tool="no_such_tool", input={})
    fine = make_request(kind="approval", tool="delete_account", input={"account": "b"})
    rule = Rule.objects.create(name="all", effect="approve")
    outcomes = {o.request_id: o for o in rule_apply_pending(user=user, rule_id=rule.pk)}
    assert outcomes[claimed.request_id].status == "invalid"
    assert "claimed by" in outcomes[claimed.request_id].message
    assert outcomes[no_executor.request_id].status == "invalid"
    assert "no executor" in outcomes[no_executor.request_id].message
    assert outcomes[fine.request_id].status == "done"
    assert ApprovalRequest.objects.get(pk=fine.pk).state == State.APPROVED
    assert ApprovalRequest.objects.get(pk=claimed.pk).state == State.PENDING
    assert ApprovalRequest.objects.get(pk=no_executor.pk).state == State.PENDING


def test_a_request_decided_meanwhile_is_skipped_as_already_decided(monkeypatch):
    row = make_request(kind="approval", tool="delete_account", input={"account": "a"})
    rule = Rule.objects.create(name="all", effect="approve")
    from approvals import selectors

    real = selectors.rule_pending_candidates

    def then_someone_declines(**kwargs):
        found = real(**kwargs)
        request_decline(request_id=row.request_id, user=make_user(), reason="first")
        return found

    monkeypatch.setattr(selectors, "rule_pending_candidates", then_someone_declines)
    (outcome,) = rule_apply_pending(user=rule_manager(), rule_id=rule.pk)
    assert outcome.status == "already"
    row.refresh_from_db()
    assert row.state == State.DECLINED and row.decided_by_rule is None


def test_an_agent_hidden_from_the_person_is_not_touched():
    secret = make_request(agent="secret", kind="approval", tool="delete_account")
    policy = AgentPolicy.objects.create(agent="secret")
    AgentAccess.objects.create(policy=policy, group=Group.objects.create(name="insiders"))
    rule = Rule.objects.create(name="all", effect="approve")
    assert rule_apply_pending(user=rule_manager(), rule_id=rule.pk) == []
    assert ApprovalRequest.objects.get(pk=secret.pk).state == State.PENDING


def test_a_rule_that_is_off_is_not_applied_and_permissions_are_needed():
    make_request(kind="approval", tool="delete_account")
    off = Rule.objects.create(name="off", effect="approve", enabled=False)
    with pytest.raises(InvalidInput, match="switch it on"):
        rule_apply_pending(user=rule_manager(), rule_id=off.pk)
    on = Rule.objects.create(name="on", effect="approve")
    with pytest.raises(NotAllowed):
        rule_apply_pending(user=make_user(), rule_id=on.pk)  # a reviewer without manage rules
    watcher = make_user(role="watcher")
    watcher.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    watcher = type(watcher).objects.get(pk=watcher.pk)
    with pytest.raises(NotAllowed):
        rule_apply_pending(user=watcher, rule_id=on.pk)  # manages rules, may not decide
    assert not ApprovalRequest.objects.exclude(state=State.PENDING).exists()


def test_the_page_asks_to_confirm_then_lists_each_outcome():
    row = make_request(kind="approval", tool="delete_account", input={"account": "a"})
    rule = Rule.objects.create(name="all", effect="approve")
    client = session_client(rule_manager())
    page = client.get(f"/rules/{rule.pk}/").content.decode()
    assert f'action="/rules/{rule.pk}/apply/"' in page

    asked = client.post(f"/rules/{rule.pk}/apply/")
    assert asked.status_code == 200 and "Yes, apply it" in asked.content.decode()
    assert ApprovalRequest.objects.get(pk=row.pk).state == State.PENDING

    done = client.post(f"/rules/{rule.pk}/apply/", {"confirmed": "1"})
    body = done.content.decode()
    assert done.status_code == 200
    assert "1 decided, 0 skipped (already decided), 0 failed." in body
    assert f"request {row.request_id}</a> — <strong>decided</strong>" in body
    assert ApprovalRequest.objects.get(pk=row.pk).decided_by_rule == rule


@pytest.mark.parametrize("role", ["reviewer", "watcher"])
def test_without_manage_rules_the_page_refuses_and_decides_nothing(role):
    row = make_request(kind="approval", tool="delete_account")
    rule = Rule.objects.create(name="all", effect="approve")
    client = session_client(make_user(role=role))
    assert client.post(f"/rules/{rule.pk}/apply/", {"confirmed": "1"}).status_code == 403
    assert ApprovalRequest.objects.get(pk=row.pk).state == State.PENDING


def test_a_rule_manager_who_may_not_decide_is_refused_on_the_page():
    row = make_request(kind="approval", tool="delete_account")
    rule = Rule.objects.create(name="all", effect="approve")
    watcher = make_user(role="watcher")
    watcher.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    client = session_client(type(watcher).objects.get(pk=watcher.pk))
    assert client.post(f"/rules/{rule.pk}/apply/", {"confirmed": "1"}).status_code == 403
    assert ApprovalRequest.objects.get(pk=row.pk).state == State.PENDING


def test_the_api_applies_a_rule_and_lists_each_outcome():
    row = make_request(kind="approval", tool="delete_account", input={"account": "a"})
    rule = Rule.objects.create(name="all", effect="approve")
    client = session_client(rule_manager())
    response = client.post(f"/api/rules/{rule.pk}/apply")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "results": [{"id": row.request_id, "status": "done", "message": "approved"}]
    }
    again = client.post(f"/api/rules/{rule.pk}/apply").json()
    assert again == {"results": []}  # nothing pending matches any more


def test_the_api_refuses_an_off_rule_and_a_missing_one():
    off = Rule.objects.create(name="off", effect="approve", enabled=False)
    client = session_client(rule_manager())
    refused = client.post(f"/api/rules/{off.pk}/apply")
    assert refused.status_code == 400 and "switch it on" in refused.json()["detail"]
    assert client.post("/api/rules/999999/apply").status_code == 404


@pytest.mark.parametrize("role", ["reviewer", "watcher"])
def test_without_manage_rules_the_api_refuses_and_decides_nothing(role):
    row = make_request(kind="approval", tool="delete_account")
    rule = Rule.objects.create(name="all", effect="approve")
    response = session_client(make_user(role=role)).post(f"/api/rules/{rule.pk}/apply")
    assert response.status_code == 403
    assert ApprovalRequest.objects.get(pk=row.pk).state == State.PENDING


def test_the_api_refuses_a_rule_manager_who_may_not_decide():
    row = make_request(kind="approval", tool="delete_account")
    rule = Rule.objects.create(name="all", effect="approve")
    watcher = make_user(role="watcher")
    watcher.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    client = session_client(type(watcher).objects.get(pk=watcher.pk))
    response = client.post(f"/api/rules/{rule.pk}/apply")
    assert response.status_code == 403 and "decide" in response.json()["detail"]
    assert ApprovalRequest.objects.get(pk=row.pk).state == State.PENDING
