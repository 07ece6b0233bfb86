"""The Django admin: everything visible, decisions only through services."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

from approvals import services
from approvals.models import ApiToken, ApprovalRequest, Event, Run, ToolExecution

from .factories import drain, fresh, make_user, start_and_halt, tool_output

pytestmark = pytest.mark.django_db(transaction=True)

REQUESTS = "/admin/approvals/approvalrequest/"


@pytest.fixture
def superuser_client(client):
    admin = make_user(role="superuser", username="root")
    client.force_login(admin)
    client.user = admin
    return client


@pytest.fixture
def finished_run():
    """A run with an approved refund (so it has an execution), and a pending one."""
    user = make_user()
    done = start_and_halt(user=user)
    services.request_approve(request_id=done.requests.get().request_id, user=user)
    drain()
    services.api_token_create(user=user, name="ci")
    pending = start_and_halt(prompt="refund and email", user=user)
    return fresh(done), pending


def test_changelists_render_for_a_superuser(superuser_client, finished_run):
    for path in [
        "/admin/approvals/run/",
        REQUESTS,
        "/admin/approvals/event/",
        "/admin/approvals/toolexecution/",
        "/admin/approvals/apitoken/",
        f"{REQUESTS}?state__exact=pending",
        "/admin/approvals/run/?status__exact=done",
        f"{REQUESTS}?q=refund",
    ]:
        response = superuser_client.get(path)
        assert response.status_code == 200, path


def test_change_pages_render_for_a_superuser(superuser_client, finished_run):
    done, pending = finished_run
    request = pending.requests.get()
    event = Event.objects.filter(run=done).first()
    pages = {
        f"/admin/approvals/run/{done.pk}/change/": "refund issued",
        f"/admin/approvals/run/{pending.pk}/change/": "call_email",
        f"{REQUESTS}{request.pk}/change/": request.request_id,
        f"{REQUESTS}{done.requests.get().pk}/change/": "approved",
        f"/admin/approvals/event/{event.pk}/change/": event.action,
        f"/admin/approvals/toolexecution/{ToolExecution.objects.get().pk}/change/": "refund",
        f"/admin/approvals/apitoken/{ApiToken.objects.get().pk}/change/": "ci",
    }
    for path, needle in pages.items():
        response = superuser_client.get(path)
        assert response.status_code == 200, path
        body = response.content.decode()
        assert needle in body, (path, needle)
        # JSON blocks are styled by a stylesheet: the CSP (style-src 'self') refuses inline
        # style attributes, which left them unwrapped and reported violations.
        assert "<pre style=" not in body, path
        assert "approvals/admin.css" in body, path
    assert (
        '<pre class="tn-json">'
        in superuser_client.get(f"{REQUESTS}{request.pk}/change/").content.decode()
    )
    token_page = superuser_client.get(
        f"/admin/approvals/apitoken/{ApiToken.objects.get().pk}/change/"
    )
    assert ApiToken.objects.get().key_hash not in token_page.content.decode()


def test_bulk_decline_asks_for_a_reason_then_goes_through_services(superuser_client):
    user = make_user()
    first = start_and_halt(user=user)
    second = start_and_halt(prompt="refund A-77 $7", user=user)
    rows = [first.requests.get(), second.requests.get()]
    selected = [str(r.pk) for r in rows]

    # step 1: the intermediate page asks for the reason; nothing is decided yet
    response = superuser_client.post(
        REQUESTS, {"action": "decline_selected", ACTION_CHECKBOX_NAME: selected}
    )
    assert response.status_code == 200
    assert "reason" in response.content.decode()
    assert set(ApprovalRequest.objects.values_list("state", flat=True)) == {"pending"}

    # step 2: apply
    response = superuser_client.post(
        REQUESTS,
        {
            "action": "decline_selected",
            ACTION_CHECKBOX_NAME: selected,
            "apply": "Decline",
            "reason": "duplicate tickets",
        },
    )
    assert response.status_code == 302
    for row in rows:
        row.refresh_from_db()
        assert row.state == "declined" and row.reason == "duplicate tickets"
        assert row.decided_by == superuser_client.user
    assert Event.objects.filter(action="request_declined", actor=superuser_client.user).count() == 2
    assert Event.objects.filter(action="run_resumed").count() == 2
    assert drain() == 2
    for run in (first, second):
        run = fresh(run)
        assert run.status == "done"
        assert tool_output(run, "call_refund") == "relay declined for refund: duplicate tickets"


def test_bulk_decline_with_empty_reason_reads_declined(superuser_client):
    run = start_and_halt()
    row = run.requests.get()
    response = superuser_client.post(
        REQUESTS,
        {"action": "decline_selected", ACTION_CHECKBOX_NAME: [row.pk], "apply": "1", "reason": ""},
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.reason == "declined"


def test_bulk_decline_skips_already_decided_requests_with_a_warning(superuser_client):
    user = make_user(username="dora")
    run = start_and_halt(user=user)
    row = run.requests.get()
    services.request_decline(request_id=row.request_id, user=user, reason="first")
    response = superuser_client.post(
        REQUESTS,
        {"action": "decline_selected", ACTION_CHECKBOX_NAME: [row.pk], "apply": "1", "reason": "x"},
        follow=True,
    )
    assert response.status_code == 200
    assert "dora" in response.content.decode()  # the warning says who decided
    row.refresh_from_db()
    assert row.reason == "first" and row.decided_by == user


def test_expire_action_expires_and_resumes(superuser_client):
    run = start_and_halt()
    row = run.requests.get()
    response = superuser_client.post(
        REQUESTS, {"action": "expire_selected", ACTION_CHECKBOX_NAME: [row.pk]}
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.state == "expired" and row.reason == "expired"
    assert fresh(run).status == "queued"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: expired"


def test_retry_action_requeues_a_failed_run(superuser_client):
    run = start_and_halt()
    Run.objects.filter(pk=run.pk).update(agent="gone")
    services.request_decline(request_id=run.requests.get().request_id, user=superuser_client.user)
    drain()
    assert fresh(run).status == "failed"
    Run.objects.filter(pk=run.pk).update(agent="demo")
    response = superuser_client.post(
        "/admin/approvals/run/", {"action": "retry_selected", ACTION_CHECKBOX_NAME: [run.pk]}
    )
    assert response.status_code == 302
    assert fresh(run).status == "queued"
    drain()
    assert fresh(run).status == "done"


def test_nobody_adds_or_changes_rows_through_admin_forms(client, finished_run):
    _done, pending = finished_run
    request = pending.requests.get()
    staff_reviewer = make_user(is_staff=True)
    superuser = make_user(role="superuser")
    for user in (staff_reviewer, superuser):
        client.force_login(user)
        for model in ("run", "approvalrequest", "event", "toolexecution", "apitoken"):
            assert client.get(f"/admin/approvals/{model}/add/").status_code == 403, model
        response = client.post(
            f"{REQUESTS}{request.pk}/change/", {"state": "approved", "reason": "sneaky"}
        )
        assert response.status_code == 403
        response = client.post(
            f"/admin/approvals/run/{pending.pk}/change/", {"status": "done", "text": "sneaky"}
        )
        assert response.status_code == 403
    request.refresh_from_db()
    assert request.state == "pending" and request.reason == ""
    assert fresh(pending).status == "pending"


def test_staff_without_superuser_can_view_but_not_delete(client, finished_run):
    done, _pending = finished_run
    client.force_login(make_user(is_staff=True))
    assert client.get("/admin/approvals/run/").status_code == 200
    assert client.get(f"/admin/approvals/run/{done.pk}/change/").status_code == 200
    assert client.get(f"/admin/approvals/run/{done.pk}/delete/").status_code == 403
    event = Event.objects.first()
    assert client.get(f"/admin/approvals/event/{event.pk}/delete/").status_code == 403
    assert Run.objects.filter(pk=done.pk).exists()


def test_audit_events_can_not_be_deleted_even_by_a_superuser(superuser_client, finished_run):
    event = Event.objects.first()
    assert superuser_client.get(f"/admin/approvals/event/{event.pk}/delete/").status_code == 403
    assert Event.objects.filter(pk=event.pk).exists()


def test_watcher_staff_can_not_use_the_decide_actions(client):
    run = start_and_halt()
    row = run.requests.get()
    client.force_login(make_user(role="watcher", is_staff=True))
    page = client.get(REQUESTS)
    assert page.status_code == 200
    assert "decline_selected" not in page.content.decode()
    for action in ("decline_selected", "expire_selected"):
        client.post(
            REQUESTS,
            {"action": action, ACTION_CHECKBOX_NAME: [row.pk], "apply": "1", "reason": "x"},
        )
    row.refresh_from_db()
    assert row.state == "pending"
    assert fresh(run).status == "pending"


# -- API tokens and agent access -------------------------------------------------------------


def test_the_revoke_action_revokes_selected_tokens(superuser_client):
    from django.test import Client

    user = make_user()
    keep, _ = services.api_token_create(user=user, name="keep")
    drop, drop_row = services.api_token_create(user=user, name="drop")
    listing = superuser_client.get("/admin/approvals/apitoken/").content.decode()
    assert "revoke_selected" in listing and "active" in listing
    assert drop not in listing and drop_row.key_hash not in listing  # never the secret
    response = superuser_client.post(
        "/admin/approvals/apitoken/",
        {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [drop_row.pk]},
        follow=True,
    )
    assert "1 token(s) revoked." in response.content.decode()
    drop_row.refresh_from_db()
    assert drop_row.revoked_at is not None
    assert drop_row.revoked_reason == f"revoked in the admin by {superuser_client.user.username}"
    auth = {"Authorization": f"Bearer {drop}"}
    assert Client().get("/api/requests", headers=auth).status_code == 401
    assert (
        Client().get("/api/requests", headers={"Authorization": f"Bearer {keep}"}).status_code
        == 200
    )


def test_staff_without_the_change_permission_can_not_revoke_tokens(client):
    user = make_user()
    _, row = services.api_token_create(user=user)
    from django.contrib.auth.models import Permission

    staff = make_user(is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    client.force_login(staff)
    page = client.get("/admin/approvals/apitoken/")
    assert page.status_code == 200 and "revoke_selected" not in page.content.decode()
    client.post(
        "/admin/approvals/apitoken/", {"action": "revoke_selected", ACTION_CHECKBOX_NAME: [row.pk]}
    )
    row.refresh_from_db()
    assert row.revoked_at is None


def test_agent_access_is_managed_in_the_admin(superuser_client):
    from django.contrib.auth.models import Group

    from approvals.models import AgentAccess, AgentPolicy

    group = Group.objects.create(name="Refunds")
    add = superuser_client.get("/admin/approvals/agentpolicy/add/")
    assert add.status_code == 200
    assert '<option value="demo">demo</option>' in add.content.decode()  # registered agents
    response = superuser_client.post(
        "/admin/approvals/agentpolicy/add/",
        {
            "agent": "demo",
            "starter_cannot_approve": "on",
            "grants-TOTAL_FORMS": "1",
            "grants-INITIAL_FORMS": "0",
            "grants-MIN_NUM_FORMS": "0",
            "grants-MAX_NUM_FORMS": "1000",
            "grants-0-group": str(group.pk),
            "grants-0-can_decide": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[-3000:]
    policy = AgentPolicy.objects.get(agent="demo")
    assert policy.starter_cannot_approve
    assert list(AgentAccess.objects.values_list("group__name", "can_decide")) == [("Refunds", True)]
    listing = superuser_client.get("/admin/approvals/agentpolicy/").content.decode()
    assert "Refunds" in listing
    # An agent that is not registered can not be picked.
    response = superuser_client.post(
        "/admin/approvals/agentpolicy/add/",
        {
            "agent": "ghost",
            "grants-TOTAL_FORMS": "0",
            "grants-INITIAL_FORMS": "0",
            "grants-MIN_NUM_FORMS": "0",
            "grants-MAX_NUM_FORMS": "1000",
        },
    )
    assert response.status_code == 200 and not AgentPolicy.objects.filter(agent="ghost").exists()
