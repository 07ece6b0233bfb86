"""A rule's counters: its match count and its last matches (links to the requests and runs it
decided) on the Rules page, the rule's page and in GET /api/rules; none of a hidden agent."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from approvals import testing
from approvals.models import AgentAccess, AgentPolicy, ApprovalRequest, Rule

from .factories import make_request, make_user, session_client

pytestmark = pytest.mark.django_db


def rule_manager():
    user = make_user()
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


def decided_by(rule: Rule, *, agent: str = "demo") -> ApprovalRequest:
    """A request the rule decided (as the worker records it), made directly."""
    row = make_request(agent=agent)
    ApprovalRequest.objects.filter(pk=row.pk).update(
        state="approved",
        decided_at=timezone.now(),
        decided_by_rule=rule,
        rule_version=rule.version,
    )
    Rule.objects.filter(pk=rule.pk).update(match_count=rule.match_count + 1)
    rule.refresh_from_db()
    return row


def test_the_worker_counts_and_every_surface_lists_the_last_matches():
    rule = Rule.objects.create(name="small", effect="approve", tool="refund")
    runs = [testing.start(agent="demo", prompt=f"Refund $5 on order A-{n}") for n in (1, 2)]
    assert all(r.status == "done" for r in runs)
    requests = [r.requests.get().request_id for r in runs]
    client = session_client(rule_manager())

    (listed,) = client.get("/api/rules").json()
    assert listed["match_count"] == 2 and listed["last_matched_at"]
    assert [m["request_id"] for m in listed["last_matches"]] == requests[::-1]
    assert listed["last_matches"][0] == {
        **listed["last_matches"][0],
        "run_id": runs[1].pk,
        "state": "approved",
        "version": 1,
    }
    assert client.get(f"/api/rules/{rule.pk}").json()["last_matches"] == listed["last_matches"]

    page = client.get(f"/rules/{rule.pk}/").content.decode()
    assert "Decided <strong>2</strong> calls" in page
    for run, request_id in zip(runs, requests, strict=True):
        assert f'href="/requests/{request_id}/"' in page
        assert f'href="/runs/{run.pk}/"' in page
    listing = client.get("/rules/").content.decode()
    assert all(f'href="/requests/{r}/"' in listing for r in requests)


def test_matches_of_an_agent_hidden_from_the_viewer_are_counted_but_not_listed():
    rule = Rule.objects.create(name="any", effect="approve")
    secret = decided_by(rule, agent="secret")
    shown = decided_by(rule)
    policy = AgentPolicy.objects.create(agent="secret")
    AgentAccess.objects.create(policy=policy, group=Group.objects.create(name="insiders"))
    client = session_client(rule_manager())

    (listed,) = client.get("/api/rules").json()
    assert listed["match_count"] == 2
    assert [m["request_id"] for m in listed["last_matches"]] == [shown.request_id]
    for path in (f"/rules/{rule.pk}/", "/rules/"):
        page = client.get(path).content.decode()
        assert shown.request_id in page and secret.request_id not in page


@pytest.mark.parametrize("role", ["reviewer", "watcher"])
def test_without_manage_rules_no_surface_shows_the_counters(role):
    rule = Rule.objects.create(name="any", effect="approve")
    decided_by(rule)
    client = session_client(make_user(role=role))
    assert client.get("/api/rules").status_code == 403
    assert client.get(f"/api/rules/{rule.pk}").status_code == 403
    assert client.get("/rules/").status_code == 403
    assert client.get(f"/rules/{rule.pk}/").status_code == 403
