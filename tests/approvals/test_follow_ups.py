"""Follow-ups: a finished run continued with a new user message (API and run page)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from approvals.models import AgentAccess, AgentPolicy, Event, Run

from .factories import bearer, drain, fresh, make_user, post_json, session_client

pytestmark = pytest.mark.django_db(transaction=True)


def finished_run(user) -> Run:
    """A demo refund, declined, and its run done."""
    client = session_client(user)
    run_id = post_json(client, "/api/runs", {"agent": "demo", "prompt": "Refund A-9, $3"}).json()[
        "id"
    ]
    drain()
    run = Run.objects.get(pk=run_id)
    request_id = run.requests.get().request_id
    assert post_json(client, f"/api/requests/{request_id}/decline", {}).status_code == 200
    drain()
    run.refresh_from_db()
    assert run.status == "done", run.status
    return run


def test_a_follow_up_continues_the_same_run_and_may_halt_again():
    reviewer = make_user()
    run = finished_run(reviewer)
    before = len(run.messages)
    client = session_client(reviewer)
    response = post_json(
        client, f"/api/runs/{run.pk}/messages", {"message": "Refund order A-1001, $250"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued"
    drain()
    run = fresh(run)
    assert run.status == "pending"  # the demo's refund asks for a decision again
    assert run.messages[before] == {"role": "user", "content": "Refund order A-1001, $250"}
    asked = Event.objects.get(run=run, action="run_followed_up")
    assert asked.actor == reviewer and asked.detail["message"] == "Refund order A-1001, $250"
    request_id = run.requests.get(state="pending").request_id
    assert post_json(client, f"/api/requests/{request_id}/decline", {}).status_code == 200
    drain()
    assert fresh(run).status == "done"
    assert run.requests.count() == 2  # the first refund's and the follow-up's


def test_only_a_finished_run_takes_a_follow_up_and_bad_input_changes_nothing():
    reviewer = make_user()
    client = session_client(reviewer)
    run_id = post_json(client, "/api/runs", {"agent": "demo", "prompt": "Refund A-1, $5"}).json()[
        "id"
    ]
    drain()  # pending on the refund
    busy = post_json(client, f"/api/runs/{run_id}/messages", {"message": "and more"})
    assert busy.status_code == 409 and "only a finished run" in busy.json()["detail"]
    run = finished_run(reviewer)
    for body in ({"message": ""}, {"message": "   "}, {}, {"message": 5}):
        assert post_json(client, f"/api/runs/{run.pk}/messages", body).status_code in (400, 422)
    assert fresh(run).status == "done"
    assert not Event.objects.filter(action="run_followed_up").exists()


def test_a_follow_up_needs_the_start_permission_and_a_visible_agent(second_demo_agent):
    owner = make_user()
    run = finished_run(owner)
    watcher = make_user(role="watcher")
    refused = post_json(
        Client(), f"/api/runs/{run.pk}/messages", {"message": "x"}, headers=bearer(watcher)
    )
    assert refused.status_code == 403
    AgentPolicy.objects.create(agent="demo")  # listed with no group: hidden from reviewers
    AgentAccess.objects.create(
        policy=AgentPolicy.objects.get(agent="demo"),
        group=Group.objects.create(name="insiders"),
        can_decide=True,
    )
    outsider = make_user()
    hidden = post_json(
        Client(), f"/api/runs/{run.pk}/messages", {"message": "x"}, headers=bearer(outsider)
    )
    assert hidden.status_code == 404
    page = session_client(outsider).post(f"/runs/{run.pk}/follow-up/", {"message": "x"})
    assert page.status_code == 404
    assert fresh(run).status == "done"


def test_the_run_page_box_sends_a_follow_up_and_keeps_the_text_when_refused():
    reviewer = make_user()
    run = finished_run(reviewer)
    client = session_client(reviewer)
    page = client.get(f"/runs/{run.pk}/")
    assert b'name="message"' in page.content
    sent = client.post(
        f"/runs/{run.pk}/follow-up/", {"message": "Refund order A-7, $9"}, follow=True
    )
    assert sent.status_code == 200 and b"Sent: the run carries on" in sent.content
    assert fresh(run).status == "queued"
    refused = client.post(f"/runs/{run.pk}/follow-up/", {"message": "too soon"}, follow=True)
    assert b"only a finished run" in refused.content
    assert b"too soon</textarea>" in refused.content  # what was typed is kept
    watcher_page = session_client(make_user(role="watcher")).get(f"/runs/{run.pk}/")
    assert b'name="message"' not in watcher_page.content


def test_a_team_run_takes_a_follow_up_its_coordinator_continues_and_may_halt_again():
    reviewer = make_user()
    client = session_client(reviewer)
    created = post_json(
        client, "/api/runs", {"agent": "demo-team", "prompt": "Plan a refund for order A-1, $5"}
    )
    run_id = created.json()["id"]
    drain()
    first = Run.objects.get(pk=run_id).requests.get(state="pending")
    post_json(client, f"/api/requests/{first.request_id}/decline", {"reason": "not this one"})
    drain()
    run = Run.objects.get(pk=run_id)
    assert run.status == "done", run.error
    turns, tokens = run.turns, run.usage.get("total_tokens", 0)
    sent = post_json(
        client, f"/api/runs/{run_id}/messages", {"message": "Refund order A-2, $7 instead"}
    )
    assert sent.status_code == 200, sent.content
    drain()
    run = fresh(run)
    assert run.status == "pending", run.error  # the refunds agent asks again
    again = run.requests.get(state="pending")
    assert again.data["path"] == ["root", "coordinator.1", "refunds.2"]
    assert "A-2" in str(again.call_list()[0].input)
    handles = [h["id"] for h in run.team_state["handles"]]
    assert handles == [
        "root",
        "root/coordinator.1",
        "root/coordinator.1/refunds.1",
        "root/coordinator.1/refunds.2",
    ]  # the same coordinator, a new child for the new ask
    post_json(client, f"/api/requests/{again.request_id}/approve", {})
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert "A-2" in run.text and run.turns > turns
    assert run.usage.get("total_tokens", 0) > tokens
    users = [m["content"] for m in run.messages if m.get("role") == "user"]
    assert users == ["Plan a refund for order A-1, $5", "Refund order A-2, $7 instead"]
    asked = Event.objects.get(run=run, action="run_followed_up")
    assert asked.actor == reviewer
