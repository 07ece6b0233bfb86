"""A rule's dry run: what it (saved, or as typed) would have decided over the newest requests
people decided, and where that differs; the edit page and POST /api/rules/dry-run."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from approvals import selectors, services
from approvals.models import AgentAccess, AgentPolicy, Rule

from .factories import make_request, make_user, post_json, session_client

pytestmark = pytest.mark.django_db


def rule_manager(**options):
    user = make_user(**options)
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


def decided(amount: int, decision: str, *, agent: str = "demo", kind: str = "approval"):
    """A request people decided: an approval of refund for `amount`."""
    row = make_request(agent=agent, kind=kind, tool="refund", input={"amount": amount})
    reviewer = make_user()
    if decision == "approve":
        services.request_approve(request_id=row.request_id, user=reviewer)
    else:
        services.request_decline(request_id=row.request_id, user=reviewer, reason="no")
    return row


@pytest.fixture
def history():
    """Five decisions, newest last: 10 approved, 20 approved, 80 declined, 30 declined,
    and a request still pending (never considered)."""
    rows = [
        decided(10, "approve"),
        decided(20, "approve"),
        decided(80, "decline"),
        decided(30, "decline"),
    ]
    make_request(kind="approval", tool="refund", input={"amount": 5})
    return rows


def test_a_rule_is_tried_on_decided_requests_and_differences_are_counted(history):
    rule = Rule(name="small", effect="approve", tool="refund", condition="args.amount <= 50")
    result = selectors.rule_dry_run(rule)
    assert result.considered == 4
    assert (result.matched, result.would_approve, result.would_decline) == (3, 3, 0)
    assert result.differs == 1  # 30 was declined by a person
    by_id = {i.row.request_id: i for i in result.items}
    assert by_id[history[3].request_id].differs and by_id[history[3].request_id].people == "decline"
    assert not by_id[history[0].request_id].differs
    assert history[2].request_id not in by_id  # 80: no match, not listed


def test_the_limit_takes_the_newest_and_a_disabled_or_expired_rule_is_tried_as_if_on(history):
    rule = Rule.objects.create(name="r", effect="decline", enabled=False, tool="refund")
    result = selectors.rule_dry_run(rule, limit=2)
    assert result.considered == 2
    assert [i.row.request_id for i in result.items] == [
        history[3].request_id,
        history[2].request_id,
    ]
    assert result.differs == 0  # both were declined


def test_a_condition_that_fails_is_counted_not_matched(history):
    rule = Rule(name="r", effect="approve", condition="args.missing > 1")
    result = selectors.rule_dry_run(rule)
    assert result.failed == 4 and result.matched == 0
    assert "missing" in result.items[0].error


def test_the_api_tries_a_saved_rule_or_one_as_typed_and_stores_nothing(history):
    client = session_client(rule_manager())
    saved = Rule.objects.create(name="s", effect="decline", condition="args.amount >= 20")
    response = post_json(client, "/api/rules/dry-run", {"rule_id": saved.pk})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["considered"], body["matched"], body["differs"]) == (4, 3, 1)
    differing = [i for i in body["items"] if i["differs"]]
    assert differing[0]["request_id"] == history[1].request_id
    assert differing[0]["state"] == "approved" and differing[0]["would"] == "decline"

    typed = {"name": "t", "effect": "approve", "condition": "args.amount < 15"}
    response = post_json(client, "/api/rules/dry-run", {"rule": typed, "limit": 3})
    assert response.status_code == 200, response.content
    assert response.json()["considered"] == 3 and response.json()["matched"] == 0
    assert Rule.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "rule_id"),
        ({"rule_id": 1, "rule": {"name": "x", "effect": "approve"}}, "rule_id"),
        ({"rule": {"name": "x", "effect": "approve"}, "limit": 2001}, "limit"),
        ({"rule": {"name": "x", "effect": "approve", "condition": "1 <= <= 2"}}, "condition"),
    ],
)
def test_the_api_names_what_is_wrong(body, field):
    response = post_json(session_client(rule_manager()), "/api/rules/dry-run", body)
    assert response.status_code == 400
    assert field in response.json()["detail"]


@pytest.mark.parametrize("role", ["reviewer", "watcher"])
def test_without_manage_rules_the_dry_run_is_refused_on_every_surface(role, history):
    rule = Rule.objects.create(name="r", effect="approve")
    client = session_client(make_user(role=role))
    assert post_json(client, "/api/rules/dry-run", {"rule_id": rule.pk}).status_code == 403
    assert client.post(f"/rules/{rule.pk}/dry-run/", {"name": "r"}).status_code == 403


def test_requests_of_an_agent_hidden_from_the_viewer_are_not_read():
    decided(10, "approve", agent="secret")
    decided(10, "approve")
    policy = AgentPolicy.objects.create(agent="secret")
    AgentAccess.objects.create(policy=policy, group=Group.objects.create(name="insiders"))
    client = session_client(rule_manager())
    body = post_json(
        client, "/api/rules/dry-run", {"rule": {"name": "x", "effect": "approve"}}
    ).json()
    assert body["considered"] == 1 and {i["agent"] for i in body["items"]} == {"demo"}


def test_the_edit_page_dry_runs_the_rule_as_typed_without_saving_it(history):
    rule = Rule.objects.create(name="small", effect="approve", tool="refund")
    client = session_client(rule_manager())
    assert (
        f'formaction="/rules/{rule.pk}/dry-run/"'
        in client.get(f"/rules/{rule.pk}/").content.decode()
    )
    form = {
        "name": "small",
        "position": "100",
        "enabled": "on",
        "agent": "",
        "tool": "refund",
        "kind": "",
        "condition": "args.amount <= 25",
        "effect": "approve",
        "reason": "",
        "expires_at": "",
        "limit": "200",
    }
    response = client.post(f"/rules/{rule.pk}/dry-run/", form)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Of the last 4 requests people decided" in page
    assert "would have decided <strong>2</strong>" in page
    assert "<strong>0</strong> differ" in page
    assert history[0].request_id in page and history[3].request_id not in page
    assert 'value="args.amount &lt;= 25"' in page or "args.amount &lt;= 25" in page  # kept
    rule.refresh_from_db()
    assert rule.condition == "" and rule.version == 1

    bad = client.post(f"/rules/{rule.pk}/dry-run/", {**form, "condition": "1 <= <= 2"})
    assert bad.status_code == 400 and "does not compile" in bad.content.decode()


def test_the_dry_run_is_in_the_openapi_schema():
    schema = session_client(rule_manager()).get("/api/openapi.json").json()
    operation = schema["paths"]["/api/rules/dry-run"]["post"]
    assert "rules" in operation["tags"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/DryRunIn")
    assert "limit" in schema["components"]["schemas"]["DryRunIn"]["properties"]
