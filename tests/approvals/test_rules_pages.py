"""The Rules page (manage rules only) and how a rule's decision shows on the request and
run pages, in the admin, and in the API."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from approvals import testing
from approvals.models import Rule

from .factories import make_user, session_client

pytestmark = pytest.mark.django_db


def rule_manager():
    user = make_user()
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


NEW = {
    "new-name": "small refunds",
    "new-position": "10",
    "new-enabled": "on",
    "new-agent": "demo",
    "new-tool": "refund",
    "new-kind": "tool_call",
    "new-condition": "args.amount <= 50",
    "new-effect": "approve",
    "new-reason": "",
    "new-expires_at": "",
}


def test_a_rule_manager_sees_the_link_and_creates_a_rule():
    client = session_client(rule_manager())
    page = client.get("/runs/")
    assert 'href="/rules/"' in page.content.decode()
    response = client.post("/rules/", NEW)
    assert response.status_code == 302, response.content.decode()[:2000]
    rule = Rule.objects.get()
    assert (rule.name, rule.tool, rule.kind, rule.condition) == (
        "small refunds",
        "refund",
        "tool_call",
        "args.amount <= 50",
    )
    listed = client.get("/rules/").content.decode()
    assert "small refunds" in listed and "args.amount &lt;= 50" in listed


def test_a_condition_that_does_not_compile_is_an_error_at_the_field_and_keeps_what_was_typed():
    client = session_client(rule_manager())
    response = client.post("/rules/", {**NEW, "new-condition": "args.amount <= <= 3"})
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_new-condition-error"' in body
    assert "does not compile" in body and "line 1, column" in body
    assert "args.amount &lt;= &lt;= 3" in body  # what the person typed is still there
    assert not Rule.objects.exists()


@pytest.mark.parametrize("role", ["reviewer", "watcher"])
def test_without_manage_rules_the_pages_are_403_and_there_is_no_link(role):
    rule = Rule.objects.create(name="r", effect="approve")
    client = session_client(make_user(role=role))
    assert 'href="/rules/"' not in client.get("/runs/").content.decode()
    assert client.get("/rules/").status_code == 403
    assert client.post("/rules/", NEW).status_code == 403
    assert client.get(f"/rules/{rule.pk}/").status_code == 403
    assert client.post(f"/rules/{rule.pk}/", {"name": "x"}).status_code == 403
    assert client.post(f"/rules/{rule.pk}/switch/", {"enabled": "off"}).status_code == 403
    assert client.post(f"/rules/{rule.pk}/delete/").status_code == 403
    rule.refresh_from_db()
    assert rule.enabled and rule.name == "r" and rule.version == 1


def test_edit_switch_and_delete():
    rule = Rule.objects.create(name="r", effect="approve", tool="refund")
    client = session_client(rule_manager())
    form = client.get(f"/rules/{rule.pk}/")
    assert form.status_code == 200
    edited = {
        "name": "refunds",
        "position": "3",
        "enabled": "on",
        "agent": "",
        "tool": "refund",
        "kind": "",
        "condition": "",
        "effect": "decline",
        "reason": "billing does refunds",
        "expires_at": "",
    }
    assert client.post(f"/rules/{rule.pk}/", edited).status_code == 302
    rule.refresh_from_db()
    assert (rule.name, rule.effect, rule.version) == ("refunds", "decline", 2)
    assert client.post(f"/rules/{rule.pk}/switch/", {"enabled": "off"}).status_code == 302
    rule.refresh_from_db()
    assert not rule.enabled and rule.version == 3
    assert client.post(f"/rules/{rule.pk}/delete/").status_code == 302
    assert not Rule.objects.exists()


def test_a_rule_decision_is_named_on_the_request_and_run_pages_in_the_api_and_counted():
    rule = Rule.objects.create(name="small refunds", effect="approve", tool="refund")
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    row = run.requests.get()
    manager = rule_manager()
    client = session_client(manager)
    named = f"rule {rule.pk}, small refunds, version 1"
    assert named in client.get(f"/requests/{row.request_id}/").content.decode()
    assert named in client.get(f"/runs/{run.pk}/").content.decode()
    decision = client.get(f"/api/requests/{row.request_id}").json()["decision"]
    assert decision["decided_by"] is None
    assert decision["decided_by_rule"] == {"id": rule.pk, "name": "small refunds", "version": 1}
    listed = client.get("/rules/").content.decode()
    assert f"/requests/{row.request_id}/" in listed  # its last matches
    inbox = client.get("/?state=all").content.decode()
    assert '<span class="tag state">approved by rule</span>' in inbox  # the row says so
    # A person's decision is not named as a rule's.
    Rule.objects.all().delete()
    halted = testing.start(agent="demo", prompt="Refund $20 on order A-2")
    testing.approve(halted, user=manager)
    other = halted.requests.get()
    page = client.get(f"/requests/{other.request_id}/").content.decode()
    assert "version 1" not in page and manager.username in page
    inbox = client.get("/?state=all").content.decode()
    assert '<span class="tag state">approved</span>' in inbox  # the person's
    assert inbox.count("approved by rule") == 1  # the deleted rule's decision still says so
    assert (
        client.get(f"/api/requests/{other.request_id}").json()["decision"]["decided_by_rule"]
        is None
    )


def test_a_deleted_rule_s_decisions_keep_their_version():
    rule = Rule.objects.create(name="small refunds", effect="approve", tool="refund")
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    rule.delete()
    row = run.requests.get()
    page = session_client(rule_manager()).get(f"/requests/{row.request_id}/").content.decode()
    assert "a rule since deleted (version 1)" in page


def test_the_admin_refuses_a_bad_condition_and_saves_through_the_service(client):
    admin_user = make_user(role="superuser")
    admin_user.is_staff = True
    admin_user.save()
    client.force_login(admin_user)
    data = {k.removeprefix("new-"): v for k, v in NEW.items()}
    bad = client.post("/admin/approvals/rule/add/", {**data, "condition": "(("})
    assert bad.status_code == 200 and "does not compile" in bad.content.decode()
    assert not Rule.objects.exists()
    good = client.post("/admin/approvals/rule/add/", data)
    assert good.status_code == 302
    rule = Rule.objects.get()
    assert rule.created_by == admin_user
    client.post(f"/admin/approvals/rule/{rule.pk}/change/", {**data, "name": "renamed"})
    rule.refresh_from_db()
    assert rule.name == "renamed" and rule.version == 2
