"""Per-agent access (AgentPolicy / AgentAccess, managed in the admin) and the starter rule,
through the pages, the API and the admin. With no rule for an agent, the global permissions
apply as before (the rest of the suite runs that way)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import permissions, services
from approvals.models import AgentAccess, AgentPolicy, ApprovalRequest, Run

from .factories import bearer, make_user, post_json, session_client, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}


def grant(agent: str, group: Group, *, can_decide: bool) -> AgentPolicy:
    policy, _ = AgentPolicy.objects.get_or_create(agent=agent)
    AgentAccess.objects.create(policy=policy, group=group, can_decide=can_decide)
    return policy


def member_of(user, *groups: Group):
    user.groups.add(*groups)
    return type(user).objects.get(pk=user.pk)  # fresh: no cached permissions


@pytest.fixture
def world(second_demo_agent):
    """`demo` is restricted: the Refunds group sees and decides it, Auditors only see it.
    `demo2` has no rule. Every user below is a global reviewer (view and decide)."""
    refunds = Group.objects.create(name="Refunds")
    auditors = Group.objects.create(name="Auditors")
    grant("demo", refunds, can_decide=True)
    grant("demo", auditors, can_decide=False)
    w = type("World", (), {})()
    w.owner = member_of(make_user(role="reviewer"), refunds)
    w.auditor = member_of(make_user(role="reviewer"), auditors)
    w.outsider = make_user(role="reviewer")
    w.restricted = start_and_halt(user=w.owner)  # agent demo
    w.open = start_and_halt(user=w.owner, agent="demo2")
    w.restricted_row = w.restricted.requests.get()
    w.open_row = w.open.requests.get()
    return w


# -- seeing ----------------------------------------------------------------------------------


def test_the_inbox_shows_only_agents_the_viewer_may_see(world):
    page = session_client(world.outsider).get("/").content.decode()
    assert f'id="row-{world.open_row.pk}"' in page  # the inbox's rows (issue 14)
    assert f'id="row-{world.restricted_row.pk}"' not in page
    assert "1 request pending" in page
    assert 'value="demo2"' in page and 'value="demo"' not in page  # the agent filter
    for user in (world.owner, world.auditor):
        page = session_client(user).get("/").content.decode()
        assert f'id="row-{world.restricted_row.pk}"' in page
        assert "2 requests pending" in page


def test_pages_of_a_hidden_agent_are_404(world):
    client = session_client(world.outsider)
    row, run = world.restricted_row, world.restricted
    for path in (
        f"/requests/{row.request_id}/",
        f"/requests/{row.request_id}/card/",
        f"/runs/{run.pk}/",
    ):
        assert client.get(path).status_code == 404, path
    runs = client.get("/runs/").content.decode()
    assert f"/runs/{world.open.pk}/" in runs and f"/runs/{run.pk}/" not in runs
    for action in ("decline", "approve", "output", "calls", "respond"):
        response = client.post(f"/requests/{row.request_id}/{action}/", {"confirmed": "1"})
        assert response.status_code == 404, action
    assert client.post(f"/runs/{run.pk}/cancel/", {"confirmed": "1"}).status_code == 404
    assert client.post(f"/runs/{run.pk}/retry/").status_code == 404
    assert ApprovalRequest.objects.get(pk=row.pk).state == "pending"


def test_the_api_leaves_hidden_agents_out_and_404s_them(world):
    headers = bearer(world.outsider)
    client = Client()
    requests = client.get("/api/requests", headers=headers).json()
    assert [r["agent"] for r in requests["items"]] == ["demo2"] and requests["count"] == 1
    assert client.get("/api/requests?agent=demo", headers=headers).json()["count"] == 0
    runs = client.get("/api/runs", headers=headers).json()
    assert {r["agent"] for r in runs["items"]} == {"demo2"}
    row, run = world.restricted_row, world.restricted
    for path in (
        f"/api/requests/{row.request_id}",
        f"/api/runs/{run.pk}",
        f"/api/runs/{run.pk}/messages",
    ):
        assert client.get(path, headers=headers).status_code == 404, path
    for path, body in (
        (f"/api/requests/{row.request_id}/decline", {"reason": "no"}),
        (f"/api/requests/{row.request_id}/approve", {}),
        (f"/api/runs/{run.pk}/cancel", {}),
    ):
        response = post_json(client, path, body, headers=headers)
        assert response.status_code == 404, (path, response.content)
    # Starting a run of an agent one may not see is refused as for an agent that does not
    # exist: the answer does not tell that it does.
    response = post_json(client, "/api/runs", {"agent": "demo", "prompt": "x"}, headers=headers)
    unknown = post_json(client, "/api/runs", {"agent": "nope", "prompt": "x"}, headers=headers)
    assert response.status_code == unknown.status_code == 400
    assert response.json()["detail"] == "agent: no agent named 'demo' is registered"
    assert unknown.json()["detail"] == "agent: no agent named 'nope' is registered"
    form = Client()
    form.force_login(world.outsider)
    page = form.post("/runs/new/", {"agent": "demo", "prompt": "x"})
    assert page.status_code == 400 and b"no agent named" in page.content
    assert ApprovalRequest.objects.get(pk=row.pk).state == "pending"


def test_an_already_decided_request_does_not_tell_outsiders_who_decided(world):
    services.request_decline(request_id=world.restricted_row.request_id, user=world.owner)
    response = post_json(
        Client(),
        f"/api/requests/{world.restricted_row.request_id}/decline",
        {},
        headers=bearer(world.outsider),
    )
    assert response.status_code == 404


def test_agents_without_a_rule_follow_the_global_permissions(world):
    headers = bearer(world.outsider)
    response = post_json(
        Client(), f"/api/requests/{world.open_row.request_id}/decline", {}, headers=headers
    )
    assert response.status_code == 200
    watcher = make_user(role="watcher")
    assert (
        Client().get("/api/requests?agent=demo2&state=", headers=bearer(watcher)).json()["count"]
        == 1
    )


def test_a_superuser_sees_and_decides_every_agent(world):
    root = make_user(role="superuser")
    client = session_client(root)
    assert "2 requests pending" in client.get("/").content.decode()
    response = post_json(
        client, f"/api/requests/{world.restricted_row.request_id}/decline", {"reason": "root"}
    )
    assert response.status_code == 200


# -- deciding --------------------------------------------------------------------------------


def test_a_view_only_group_sees_the_card_without_buttons_and_may_not_decide(world):
    row = world.restricted_row
    client = session_client(world.auditor)
    page = client.get(f"/requests/{row.request_id}/").content.decode()
    assert "You can watch but not decide" in page
    assert f'action="/requests/{row.request_id}/decline/"' not in page
    response = client.post(f"/requests/{row.request_id}/decline/", {"reason": "x"})
    assert response.status_code == 403
    assert (
        "Your groups may not decide requests of agent &#x27;demo&#x27;" in response.content.decode()
    )
    api = post_json(
        Client(), f"/api/requests/{row.request_id}/decline", {}, headers=bearer(world.auditor)
    )
    assert api.status_code == 403
    assert api.json()["detail"] == "your groups may not decide requests of agent 'demo'"
    cancel = post_json(
        Client(), f"/api/runs/{world.restricted.pk}/cancel", {}, headers=bearer(world.auditor)
    )
    assert cancel.status_code == 403
    assert ApprovalRequest.objects.get(pk=row.pk).state == "pending"
    assert Run.objects.get(pk=world.restricted.pk).status == "pending"


def test_a_deciding_group_decides(world):
    row = world.restricted_row
    page = session_client(world.owner).get(f"/requests/{row.request_id}/").content.decode()
    assert f'action="/requests/{row.request_id}/decline/"' in page
    response = post_json(
        Client(), f"/api/requests/{row.request_id}/decline", {}, headers=bearer(world.owner)
    )
    assert response.status_code == 200


def test_a_group_grant_does_not_replace_the_decide_permission(world):
    watcher = member_of(make_user(role="watcher"), Group.objects.get(name="Refunds"))
    response = post_json(
        Client(),
        f"/api/requests/{world.restricted_row.request_id}/decline",
        {},
        headers=bearer(watcher),
    )
    assert response.status_code == 403


def test_the_admin_hides_rows_of_hidden_agents_from_staff():
    refunds = Group.objects.create(name="Refunds")
    grant("demo", refunds, can_decide=True)
    owner = member_of(make_user(role="reviewer"), refunds)
    run = start_and_halt(user=owner)
    row = run.requests.get()
    staff = make_user(role="reviewer", is_staff=True)
    client = session_client(staff)
    listing = client.get("/admin/approvals/approvalrequest/").content.decode()
    assert row.request_id not in listing
    assert client.get(f"/admin/approvals/approvalrequest/{row.pk}/change/").status_code == 302
    assert (
        f"/admin/approvals/run/{run.pk}/"
        not in client.get("/admin/approvals/run/").content.decode()
    )
    insider = session_client(member_of(make_user(role="reviewer", is_staff=True), refunds))
    assert row.request_id in insider.get("/admin/approvals/approvalrequest/").content.decode()


# -- the starter rule ------------------------------------------------------------------------


def test_with_the_setting_whoever_started_a_run_cannot_approve_it(settings):
    settings.TOOLNEXUS_STARTER_CANNOT_APPROVE = True
    starter = make_user(role="reviewer")
    other = make_user(role="reviewer")
    run = start_and_halt(user=starter)
    row = run.requests.get()
    response = post_json(
        Client(), f"/api/requests/{row.request_id}/approve", {}, headers=bearer(starter)
    )
    assert response.status_code == 403
    assert response.json()["detail"].startswith("You need a second reviewer")
    answer = {"id": row.request_id, "ok": True, "data": {"output": "done"}}
    response = post_json(
        Client(), f"/api/requests/{row.request_id}/answer", answer, headers=bearer(starter)
    )
    assert response.status_code == 403
    # The page: no buttons for the starter, and a posted approval is refused saying why.
    client = session_client(starter)
    page = client.get(f"/requests/{row.request_id}/").content.decode()
    assert "You can watch but not decide" in page
    denied = client.post(f"/requests/{row.request_id}/approve/", {"confirmed": "1"})
    assert denied.status_code == 403 and "You need a second reviewer" in denied.content.decode()
    assert ApprovalRequest.objects.get(pk=row.pk).state == "pending"
    # Somebody else approves.
    response = post_json(
        Client(), f"/api/requests/{row.request_id}/approve", {}, headers=bearer(other)
    )
    assert response.status_code == 200 and response.json()["state"] == "approved"


def test_the_starter_may_still_decline_or_cancel(settings):
    settings.TOOLNEXUS_STARTER_CANNOT_APPROVE = True
    starter = make_user(role="reviewer")
    run = start_and_halt(user=starter)
    row = run.requests.get()
    response = post_json(
        Client(),
        f"/api/requests/{row.request_id}/decline",
        {"reason": "mine"},
        headers=bearer(starter),
    )
    assert response.status_code == 200
    second = start_and_halt(user=starter)
    response = post_json(Client(), f"/api/runs/{second.pk}/cancel", {}, headers=bearer(starter))
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


def test_the_starter_rule_per_agent(second_demo_agent):
    AgentPolicy.objects.create(agent="demo", starter_cannot_approve=True)
    starter = make_user(role="reviewer")
    restricted = start_and_halt(user=starter).requests.get()
    free = start_and_halt(user=starter, agent="demo2").requests.get()
    headers = bearer(starter)
    blocked = post_json(
        Client(), f"/api/requests/{restricted.request_id}/approve", {}, headers=headers
    )
    assert blocked.status_code == 403
    allowed = post_json(Client(), f"/api/requests/{free.request_id}/approve", {}, headers=headers)
    assert allowed.status_code == 200
    # A policy without groups restricts nobody's view: a reviewer sees and decides demo.
    other = make_user(role="reviewer")
    response = post_json(
        Client(), f"/api/requests/{restricted.request_id}/approve", {}, headers=bearer(other)
    )
    assert response.status_code == 200


# -- what the websocket consumers call -------------------------------------------------------


def test_agent_rights_are_one_query_and_then_free(world):
    user = type(world.auditor).objects.get(pk=world.auditor.pk)
    with CaptureQueriesContext(connection) as ctx:
        rights = permissions.agent_rights(user)
        assert user.has_perm("approvals.view_run")  # the permissions came with it
    assert len(ctx.captured_queries) == 1
    with CaptureQueriesContext(connection) as ctx:
        assert rights.can_view("demo") and rights.can_view("demo2")
        assert not rights.can_decide("demo") and rights.can_decide("demo2")
        assert permissions.can_view_agent(user, "demo")
    assert ctx.captured_queries == []
    outsider = type(world.outsider).objects.get(pk=world.outsider.pk)
    assert not permissions.agent_rights(outsider).can_view("demo")


def test_fresh_rights_see_a_changed_rule(world):
    user = type(world.outsider).objects.get(pk=world.outsider.pk)
    assert not permissions.agent_rights(user).can_view("demo")
    user.groups.add(Group.objects.get(name="Refunds"))
    assert not permissions.agent_rights(user).can_view("demo")  # cached on the object
    rights = permissions.agent_rights(user, fresh=True)
    assert rights.can_view("demo") and rights.can_decide("demo")


def test_may_decide_for_a_pushed_request_applies_the_starter_rule(settings):
    settings.TOOLNEXUS_STARTER_CANNOT_APPROVE = True
    starter = make_user(role="reviewer")
    row = start_and_halt(user=starter).requests.select_related("run").get()
    rights = permissions.agent_rights(starter)
    assert not rights.can_decide(row.agent, started_by_id=row.run.started_by_id)
    assert rights.can_decide(row.agent)  # cancel / decline
    assert not permissions.can_decide_request(starter, row)
    assert permissions.can_decide_request(starter, row, approving=False)
    assert permissions.can_decide_request(make_user(role="reviewer"), row)


def test_the_access_read_compiled_once_gives_each_user_the_orms_rows(world):
    """The access query is compiled once per database with a stand-in user id and run with
    each user's: the rows are the ORM's own for that user (flags compared as truth values:
    SQLite gives 0 and 1)."""
    from django.contrib.auth.models import Permission

    direct = make_user(role="watcher")
    direct.user_permissions.add(Permission.objects.get(codename="decide_request"))
    world.owner.user_permissions.add(Permission.objects.get(codename="decide_request"))

    def normal(rows):
        return sorted(
            tuple(bool(v) if isinstance(v, (bool, int)) and i >= 5 else v for i, v in enumerate(r))
            for r in rows
        )

    for user in (world.owner, world.auditor, world.outsider, direct):
        for with_permissions in (True, False):
            orm = permissions._access_query(user.pk, with_permissions=with_permissions)
            rows = permissions._access_rows(user, with_permissions=with_permissions)
            assert normal(rows) == normal(orm), (user.username, with_permissions)
    assert any(r[0] == "p" for r in permissions._access_rows(direct, with_permissions=True))
    owner_rules = {r[4]: r for r in permissions._access_rows(world.owner, with_permissions=False)}
    assert sorted(bool(r[6]) for r in owner_rules.values()) == [False, True]  # one group of two
