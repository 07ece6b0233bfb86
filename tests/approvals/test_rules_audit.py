"""The rules' audit trail: creating, editing, switching and deleting a rule each write an
Event about no run (who, what changed), shown on the rule's page, on every surface."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission

from approvals import services, testing
from approvals.domain.exceptions import NotAllowed
from approvals.models import Event, Rule
from approvals.services import rules as rule_services

from .factories import make_user, post_json, session_client

pytestmark = pytest.mark.django_db


def rule_manager():
    user = make_user()
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


def trail(rule_id: int) -> list[tuple[str, dict]]:
    rows = Event.objects.filter(detail__rule__id=rule_id).order_by("id")
    return [(e.action, e.detail) for e in rows]


def test_each_write_of_the_service_is_one_entry_with_who_and_what():
    user = rule_manager()
    rule = rule_services.rule_create(user=user, name="small", effect="approve", tool="refund")
    rule_services.rule_update(user=user, rule_id=rule.pk, condition="args.amount <= 5")
    rule_services.rule_update(user=user, rule_id=rule.pk, condition="args.amount <= 5")  # no-op
    rule_services.rule_update(user=user, rule_id=rule.pk, enabled=False)
    rule_services.rule_update(user=user, rule_id=rule.pk, enabled=True)
    expires = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
    rule_services.rule_update(user=user, rule_id=rule.pk, expires_at=expires, position=3)
    rule_services.rule_delete(user=user, rule_id=rule.pk)

    entries = trail(rule.pk)
    assert [a for a, _ in entries] == [
        "rule_created",
        "rule_edited",
        "rule_switched_off",
        "rule_switched_on",
        "rule_edited",
        "rule_deleted",
    ]
    created = entries[0][1]
    assert created["fields"]["tool"] == "refund" and created["rule"]["version"] == 1
    assert entries[1][1]["changes"] == {"condition": ["", "args.amount <= 5"]}
    assert entries[1][1]["rule"]["version"] == 2
    assert entries[4][1]["changes"] == {
        "expires_at": [None, "2030-01-02T03:04:00+00:00"],
        "position": [100, 3],
    }
    assert entries[5][1]["rule"] == {"id": rule.pk, "name": "small", "version": 5}
    events = Event.objects.filter(detail__rule__id=rule.pk)
    assert all(e.actor == user and e.run_id is None for e in events)
    assert all(e.rule_id is None for e in events)  # the rule is gone; its name stays


def test_a_refused_write_leaves_no_entry():
    user = rule_manager()
    with pytest.raises(rule_services.RuleInvalid):
        rule_services.rule_create(user=user, name="bad", effect="approve", condition="1 <= <= 2")
    with pytest.raises(NotAllowed):
        rule_services.rule_create(user=make_user(), name="x", effect="approve")
    assert not Event.objects.filter(action__startswith="rule_").exists()


def test_always_allow_records_its_source_request():
    user = rule_manager()
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    row = run.requests.get()
    services.request_approve(request_id=row.request_id, user=user, always_allow="run")
    rule = Rule.objects.get()
    ((action, detail),) = trail(rule.pk)
    assert action == "rule_created"
    assert detail["source_request"] == row.request_id and detail["run_id"] == run.pk


def test_the_api_and_the_pages_write_the_trail_and_the_rule_page_shows_it():
    user = rule_manager()
    client = session_client(user)
    created = post_json(client, "/api/rules", {"name": "r", "effect": "approve"})
    rule_id = created.json()["id"]
    client.patch(
        f"/api/rules/{rule_id}",
        data=json.dumps({"reason": "why not"}),
        content_type="application/json",
    )
    assert client.post(f"/rules/{rule_id}/switch/", {"enabled": "off"}).status_code == 302
    assert [a for a, _ in trail(rule_id)] == ["rule_created", "rule_edited", "rule_switched_off"]

    page = client.get(f"/rules/{rule_id}/").content.decode()
    assert "History" in page
    assert f"<strong>{user.username}</strong> switched it off (version 3)" in page
    assert "<del></del> → <ins>why not</ins>" in page
    assert f"<strong>{user.username}</strong> created it (version 1)" in page


@pytest.mark.parametrize("role", ["reviewer", "watcher"])
def test_without_manage_rules_the_rule_page_and_its_history_are_refused(role):
    rule = rule_services.rule_create(user=rule_manager(), name="r", effect="approve")
    client = session_client(make_user(role=role))
    assert client.get(f"/rules/{rule.pk}/").status_code == 403
    assert client.post(f"/rules/{rule.pk}/switch/", {"enabled": "off"}).status_code == 403
    assert client.post(f"/rules/{rule.pk}/delete/").status_code == 403
    assert [a for a, _ in trail(rule.pk)] == ["rule_created"]


def test_the_admin_s_bulk_delete_goes_through_the_service_one_entry_per_rule(client):
    admin_user = make_user(role="superuser")
    admin_user.is_staff = True
    admin_user.save()
    client.force_login(admin_user)
    a = Rule.objects.create(name="a", effect="approve")
    b = Rule.objects.create(name="b", effect="decline")
    kept = Rule.objects.create(name="kept", effect="approve")
    response = client.post(
        "/admin/approvals/rule/",
        {"action": "delete_selected", "_selected_action": [a.pk, b.pk], "post": "yes"},
    )
    assert response.status_code == 302
    assert list(Rule.objects.values_list("pk", flat=True)) == [kept.pk]
    for rule in (a, b):
        ((action, detail),) = trail(rule.pk)
        assert action == "rule_deleted" and detail["rule"]["name"] == rule.name
    deleted = Event.objects.filter(action="rule_deleted")
    assert {e.actor for e in deleted} == {admin_user}
