"""approvals.api, the triage endpoints (issue 14): list with search, sorts and filters; claim,
release, snooze, ignore, un-hide; bulk decisions; a query count that does not grow with rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import RequestHide

from .factories import claim, make_request, make_user, post_json, session_client
from .factories import halted_request as _halted

pytestmark = pytest.mark.django_db


def test_api_list_search_sort_and_filters(settings):
    settings.TOOLNEXUS_CLAIM_MINUTES = 30
    user = make_user()
    client = session_client(user)
    old = make_request(
        prompt="refund old", age=timedelta(hours=2), expires_in=timedelta(minutes=-1)
    )
    new = make_request(prompt="Refund new", expires_in=timedelta(hours=1))
    make_request(prompt="question", kind="question")
    claim(new, user)

    def listed(query: str) -> list[str]:
        response = client.get(f"/api/requests?{query}")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["count"] == len(body["items"])
        return [i["request"]["id"] for i in body["items"]]

    assert listed("q=REFUND") == [new.request_id, old.request_id]
    assert listed("q=refund&sort=oldest") == [old.request_id, new.request_id]
    assert listed("sort=deadline")[:2] == [old.request_id, new.request_id]  # overdue first
    assert listed("claim=mine") == [new.request_id]
    assert listed("overdue=true") == [old.request_id]
    claimed = client.get(f"/api/requests/{new.request_id}").json()["claim"]
    assert claimed["by"] == user.get_username() and claimed["at"]
    assert client.get(f"/api/requests/{old.request_id}").json()["claim"] is None
    client.post(f"/api/requests/{old.request_id}/ignore")
    assert old.request_id not in listed("")
    assert listed("hidden=only") == [old.request_id]

    for bad, field in (
        ("sort=random", "sort"),
        ("claim=theirs", "claim"),
        ("hidden=all", "hidden"),
    ):
        response = client.get(f"/api/requests?{bad}")
        assert response.status_code == 400 and response.json()["detail"].startswith(f"{field}:")


def test_api_claim_release_and_409_naming_the_holder():
    ann, bob = make_user(username="ann3"), make_user(username="bob3")
    row = make_request()
    a, b = session_client(ann), session_client(bob)
    response = post_json(a, f"/api/requests/{row.request_id}/claim")
    assert response.status_code == 200 and response.json()["claim"]["by"] == "ann3"
    response = post_json(b, f"/api/requests/{row.request_id}/claim", {"takeover": False})
    assert response.status_code == 409 and "claimed by ann3" in response.json()["detail"]
    response = post_json(b, f"/api/requests/{row.request_id}/release")
    assert response.status_code == 409
    response = post_json(b, f"/api/requests/{row.request_id}/claim", {"takeover": True})
    assert response.status_code == 200 and response.json()["claim"]["by"] == "bob3"
    response = post_json(b, f"/api/requests/{row.request_id}/release")
    assert response.status_code == 200 and response.json()["claim"] is None
    assert post_json(b, "/api/requests/nope/claim").status_code == 404
    watcher = session_client(make_user(role="watcher"))
    assert post_json(watcher, f"/api/requests/{row.request_id}/claim").status_code == 403
    response = post_json(a, f"/api/requests/{row.request_id}/claim", {"takeover": "yes"})
    assert response.status_code == 400 and response.json()["detail"].startswith("takeover")


def test_api_snooze_ignore_unhide():
    user = make_user()
    client = session_client(user)
    row = make_request()
    url = f"/api/requests/{row.request_id}"
    response = post_json(client, f"{url}/snooze", {"minutes": 30})
    body = response.json()
    assert response.status_code == 200 and body["hidden"] is True and body["until"]
    assert RequestHide.objects.get(request=row, user=user).until > timezone.now()
    until = (timezone.now() + timedelta(days=1)).isoformat()
    assert post_json(client, f"{url}/snooze", {"until": until}).status_code == 200
    for bad in ({}, {"minutes": 5, "until": until}, {"minutes": 0}):
        response = post_json(client, f"{url}/snooze", bad)
        assert response.status_code == 400, bad
    past = (timezone.now() - timedelta(days=1)).isoformat()
    response = post_json(client, f"{url}/snooze", {"until": past})
    assert response.status_code == 400 and "future" in response.json()["detail"]
    response = post_json(client, f"{url}/ignore")
    assert response.json() == {"id": row.request_id, "hidden": True, "until": None}
    response = post_json(client, f"{url}/unhide")
    assert response.json() == {"id": row.request_id, "hidden": False, "until": None}
    assert not RequestHide.objects.exists()
    assert post_json(client, "/api/requests/nope/ignore").status_code == 404


def test_api_bulk():
    starter, user = make_user(), make_user()
    client = session_client(user)
    refund = _halted("Refund order A-11", starter)
    question = _halted("question", starter)
    response = post_json(
        client,
        "/api/requests/bulk",
        {"ids": [refund.request_id, question.request_id, "nope"], "action": "approve"},
    )
    assert response.status_code == 200, response.content
    assert [(r["id"], r["status"]) for r in response.json()["results"]] == [
        (refund.request_id, "done"),
        (question.request_id, "invalid"),
        ("nope", "missing"),
    ]
    response = post_json(
        client,
        "/api/requests/bulk",
        {"ids": [question.request_id], "action": "decline", "reason": "x"},
    )
    assert response.json()["results"][0]["status"] == "done"
    response = post_json(client, "/api/requests/bulk", {"ids": ["a"], "action": "maybe"})
    assert response.status_code == 400 and response.json()["detail"].startswith("action")
    response = post_json(
        client, "/api/requests/bulk", {"ids": [f"r{i}" for i in range(501)], "action": "decline"}
    )
    assert response.status_code == 400 and response.json()["detail"].startswith("ids")
    watcher = session_client(make_user(role="watcher"))
    response = post_json(watcher, "/api/requests/bulk", {"ids": ["a"], "action": "decline"})
    assert response.status_code == 403


def test_api_list_query_count_does_not_grow_with_rows():
    user = make_user()
    client = session_client(user)
    for _ in range(3):
        make_request()
    client.get("/api/requests?q=refund&sort=deadline")  # warm: session, permissions
    with CaptureQueriesContext(connection) as few:
        assert client.get("/api/requests?q=refund&sort=deadline").status_code == 200
    for _ in range(12):
        claim(make_request(), make_user())
    with CaptureQueriesContext(connection) as many:
        body = client.get("/api/requests?q=refund&sort=deadline").json()
    assert body["count"] == 15 and len(body["items"]) == 15
    assert len(many) == len(few)


def test_api_bulk_tells_nothing_of_a_hidden_agents_requests(second_demo_agent):
    """Ids of another agent's requests answer as an unknown id does, whatever they are (a
    question, a claimed one, an irreversible one, one already decided), and stay undecided."""
    from django.contrib.auth.models import Group

    from approvals import services
    from approvals.models import AgentAccess, AgentPolicy

    from .factories import start_and_halt

    insider, outsider = make_user(), make_user()
    group = Group.objects.create(name="demo2 people")
    insider.groups.add(group)
    policy = AgentPolicy.objects.create(agent="demo2")
    AgentAccess.objects.create(policy=policy, group=group, can_decide=True)

    def hidden(prompt: str):
        return start_and_halt(agent="demo2", prompt=prompt, user=insider).requests.get()

    question = hidden("question")
    claimed = hidden("Refund order A-12")
    claim(claimed, insider)
    irreversible = hidden("Delete account acct-9")
    decided = hidden("Refund order A-13")
    services.request_decline(request_id=decided.request_id, user=insider, reason="no")
    ids = [r.request_id for r in (question, claimed, irreversible, decided)]
    client = session_client(outsider)
    for action in ("approve", "decline"):
        response = post_json(
            client, "/api/requests/bulk", {"ids": [*ids, "nope"], "action": action}
        )
        assert response.status_code == 200, response.content
        results = response.json()["results"]
        assert [(r["status"], r["message"]) for r in results] == [
            ("missing", "no such request")
        ] * 5
    states = {r.request_id: r.state for r in type(question).objects.filter(request_id__in=ids)}
    assert states == {
        question.request_id: "pending",
        claimed.request_id: "pending",
        irreversible.request_id: "pending",
        decided.request_id: "declined",
    }
    # the page's bulk form answers the same
    page = session_client(outsider).post(
        "/requests/bulk/",
        {"ids": ids, "action": "approve"},
        headers={"HX-Request": "true"},
    )
    html = page.content.decode()
    assert "claimed by" not in html and "needs an answer" not in html
    assert "undone" not in html and "already" not in html
    assert html.count("no such request") == 4
