"""/api/rules: permission-checked CRUD, refused conditions, versions, the OpenAPI schema."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission

from approvals.models import Rule

from .factories import bearer, make_user, post_json, session_client

pytestmark = pytest.mark.django_db


def rule_manager(**options):
    user = make_user(**options)
    user.user_permissions.add(Permission.objects.get(codename="manage_rules"))
    return type(user).objects.get(pk=user.pk)


SMALL_REFUNDS = {
    "name": "small refunds",
    "tool": "refund",
    "condition": 'args.amount <= 50 && args.currency == "USD"',
    "effect": "approve",
}


def patch_json(client, path, data, headers=None):
    return client.patch(
        path, data=json.dumps(data), content_type="application/json", headers=headers or {}
    )


def test_a_rule_manager_creates_reads_edits_and_deletes_a_rule():
    user = rule_manager()
    client = session_client(user)
    created = post_json(client, "/api/rules", SMALL_REFUNDS)
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["version"] == 1 and body["enabled"] is True and body["created_by"] == user.username
    rule_id = body["id"]
    assert [r["id"] for r in client.get("/api/rules").json()] == [rule_id]
    assert client.get(f"/api/rules/{rule_id}").json()["name"] == "small refunds"

    edited = patch_json(client, f"/api/rules/{rule_id}", {"enabled": False, "position": 5})
    assert edited.status_code == 200, edited.content
    assert edited.json()["version"] == 2 and edited.json()["enabled"] is False
    unchanged = patch_json(client, f"/api/rules/{rule_id}", {"enabled": False})
    assert unchanged.json()["version"] == 2

    assert client.delete(f"/api/rules/{rule_id}").status_code == 204
    assert client.get(f"/api/rules/{rule_id}").status_code == 404


def test_a_bearer_token_works_too():
    headers = bearer(rule_manager())
    response = post_json(session_client(), "/api/rules", SMALL_REFUNDS, headers=headers)
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("role", ["reviewer", "watcher", "nobody"])
def test_without_manage_rules_every_endpoint_is_403(role):
    rule = Rule.objects.create(name="r", effect="approve")
    client = session_client(make_user(role=role))
    assert client.get("/api/rules").status_code == 403
    assert client.get(f"/api/rules/{rule.pk}").status_code == 403
    assert post_json(client, "/api/rules", SMALL_REFUNDS).status_code == 403
    assert patch_json(client, f"/api/rules/{rule.pk}", {"enabled": False}).status_code == 403
    assert client.delete(f"/api/rules/{rule.pk}").status_code == 403
    rule.refresh_from_db()
    assert rule.enabled and rule.version == 1
    assert Rule.objects.count() == 1


def test_anonymous_is_401():
    assert session_client().get("/api/rules").status_code == 401


def test_a_condition_that_does_not_compile_is_refused_with_where_and_nothing_is_stored():
    client = session_client(rule_manager())
    response = post_json(client, "/api/rules", {**SMALL_REFUNDS, "condition": "args.amount <="})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("condition: the condition does not compile")
    assert "line 1, column" in detail
    assert not Rule.objects.exists()


def test_an_edit_with_a_bad_condition_keeps_the_rule_as_it_was():
    rule = Rule.objects.create(name="r", effect="approve", condition="args.amount < 5")
    client = session_client(rule_manager())
    response = patch_json(client, f"/api/rules/{rule.pk}", {"condition": "((", "enabled": False})
    assert response.status_code == 400
    rule.refresh_from_db()
    assert rule.condition == "args.amount < 5" and rule.enabled and rule.version == 1


@pytest.mark.parametrize(
    "change, field",
    [
        ({"effect": "maybe"}, "effect"),
        ({"kind": "question"}, "kind"),
        ({"name": "  "}, "name"),
        ({"position": -1}, "position"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_bad_fields_are_400_naming_the_field(change, field):
    client = session_client(rule_manager())
    response = post_json(client, "/api/rules", {**SMALL_REFUNDS, **change})
    assert response.status_code == 400
    assert response.json()["detail"].startswith(field)
    assert not Rule.objects.exists()


def test_the_rules_endpoints_are_in_the_openapi_schema():
    schema = session_client().get("/api/openapi.json").json()
    assert {"get", "post"} <= set(schema["paths"]["/api/rules"])
    assert {"get", "patch", "delete"} <= set(schema["paths"]["/api/rules/{rule_id}"])
