"""The HTTP JSON API (api.md): session and bearer auth, decisions, errors, reads."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.models import ApprovalRequest, Event, Run

from .factories import (
    bearer,
    drain,
    fresh,
    make_user,
    post_json,
    session_client,
    start_and_halt,
    tasks_for,
    tool_output,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _pending_request(run: Run) -> ApprovalRequest:
    return run.requests.get(state="pending")


def _answer_url(request_id: str) -> str:
    return f"/api/requests/{request_id}/answer"


# -- the whole flow ------------------------------------------------------------------------


def test_flow_through_the_api_with_a_session():
    user = make_user()
    client = session_client(user)
    response = post_json(client, "/api/runs", {"agent": "demo", "prompt": "Refund A-1001 $80"})
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    assert response.json()["status"] == "queued"
    drain()

    run = client.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "pending"
    request_id = run["pending"]["request"]["id"]
    assert run["pending"]["request"]["kind"] == "tool_call"
    assert run["pending"]["calls"][0]["input"] == {"order": "A-1001", "amount": 80}

    listed = client.get("/api/requests").json()
    assert [i["request"]["id"] for i in listed["items"]] == [request_id]

    response = post_json(
        client, f"/api/requests/{request_id}/decline", {"reason": "over the limit"}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "declined"
    assert body["decision"]["reason"] == "over the limit"
    assert body["decision"]["decided_by"] == user.username
    assert body["decision"]["answer"] == {"id": request_id, "ok": False, "reason": "over the limit"}
    assert client.get(f"/api/runs/{run_id}").json()["status"] == "queued"

    drain()
    run = client.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done" and run["pending"] is None
    assert "over the limit" in run["text"]
    messages = client.get(f"/api/runs/{run_id}/messages").json()
    tool = [m for m in messages if m["role"] == "tool"]
    assert tool[-1]["content"] == "relay declined for refund: over the limit"


def test_flow_through_the_api_with_a_bearer_token_from_the_command():
    user = make_user()
    out = io.StringIO()
    call_command("api_token", user.username, stdout=out)
    headers = {"Authorization": f"Bearer {out.getvalue().strip()}"}
    client = Client(enforce_csrf_checks=True)  # a bearer token needs no CSRF token
    response = post_json(
        client, "/api/runs", {"agent": "demo", "prompt": "refund A-3003 $12"}, headers=headers
    )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    assert response.json()["agent"] == "demo"
    drain()
    request_id = client.get(f"/api/runs/{run_id}", headers=headers).json()["pending"]["request"][
        "id"
    ]
    response = post_json(
        client,
        _answer_url(request_id),
        {"id": request_id, "ok": False, "reason": "duplicate refund"},
        headers=headers,
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "declined"
    assert response.json()["decision"]["decided_by"] == user.username
    drain()
    run = Run.objects.get(pk=run_id)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: duplicate refund"


def test_decline_without_a_reason_reads_declined():
    user = make_user()
    client = session_client(user)
    runs = [start_and_halt(user=user) for _ in range(3)]
    for body, run in zip([{}, {"reason": ""}, {"reason": None}], runs, strict=True):
        request_id = _pending_request(run).request_id
        response = post_json(client, f"/api/requests/{request_id}/decline", body)
        assert response.status_code == 200, response.content
        assert response.json()["decision"]["reason"] == "declined", body
    drain()
    for run in runs:
        assert tool_output(fresh(run), "call_refund") == "relay declined for refund: declined"


def test_approve_relay_with_executor_through_the_api():
    user = make_user()
    run = start_and_halt(prompt="Refund A-1001 $70", user=user)
    request_id = _pending_request(run).request_id
    response = post_json(
        session_client(user),
        f"/api/requests/{request_id}/approve",
        {"input": {"order": "A-1001", "amount": 60}},
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "approved"
    assert response.json()["calls"][0]["edited_input"] == {"order": "A-1001", "amount": 60}
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "refund issued: $60 to order A-1001"
    assert run.executions.count() == 1


def test_approve_with_invalid_edit_is_400_naming_the_field_and_changes_nothing():
    user = make_user()
    client = session_client(user)
    run = start_and_halt(user=user)
    request = _pending_request(run)
    events = Event.objects.count()
    for edited, field in [
        ({"order": "A-1001", "amount": 20000}, "amount"),
        ({"order": 7, "amount": 1}, "order"),
        ({"order": "A-1001"}, "amount"),
        ({"order": "A-1001", "amount": 1, "extra": True}, "extra"),
    ]:
        response = post_json(
            client, f"/api/requests/{request.request_id}/approve", {"input": edited}
        )
        assert response.status_code == 400, edited
        assert field in response.json()["detail"], (edited, response.json())
    request.refresh_from_db()
    assert request.state == "pending"
    assert request.calls.get().edited_input is None
    assert Event.objects.count() == events
    assert len(tasks_for(run)) == 1


def test_approve_relay_with_both_input_and_output_is_refused():
    # An edit must never be dropped silently: either the executor runs the edited input or
    # the reviewer types the output, not both at once.
    user = make_user()
    run = start_and_halt(user=user)
    request = _pending_request(run)
    response = post_json(
        session_client(user),
        f"/api/requests/{request.request_id}/approve",
        {"input": {"order": "A-1001", "amount": 1}, "output": "done by hand"},
    )
    assert response.status_code == 400, response.content
    request.refresh_from_db()
    assert request.state == "pending"


def test_decline_reason_too_long_is_400():
    user = make_user()
    run = start_and_halt(user=user)
    request = _pending_request(run)
    response = post_json(
        session_client(user),
        f"/api/requests/{request.request_id}/decline",
        {"reason": "x" * (services.MAX_REASON_CHARS + 1)},
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("reason")
    request.refresh_from_db()
    assert request.state == "pending"


def test_retry_through_the_api(mock_model):
    user = make_user()
    client = session_client(user)
    mock_model.fail = True
    run_id = post_json(client, "/api/runs", {"agent": "remote", "prompt": "refund"}).json()["id"]
    drain()
    body = client.get(f"/api/runs/{run_id}").json()
    assert body["status"] == "failed" and "500" in body["error"]
    mock_model.fail = False
    response = post_json(client, f"/api/runs/{run_id}/retry")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued" and response.json()["error"] == ""
    drain()
    assert client.get(f"/api/runs/{run_id}").json()["status"] == "pending"
    watcher = session_client(make_user(role="watcher"))
    assert post_json(watcher, f"/api/runs/{run_id}/retry").status_code == 403
    # retrying a run that did not fail (here: pending on a human) is a conflict
    assert post_json(client, f"/api/runs/{run_id}/retry").status_code == 409


def test_demo_delete_account_approved_with_edit_through_the_api():
    user = make_user()
    run = start_and_halt(prompt="delete this account", user=user)
    request_id = _pending_request(run).request_id
    client = session_client(user)
    bad = post_json(client, f"/api/requests/{request_id}/approve", {"input": {"acct": "x"}})
    assert bad.status_code == 400 and "account" in bad.json()["detail"]
    response = post_json(
        client, f"/api/requests/{request_id}/approve", {"input": {"account": "acct-9"}}
    )
    assert response.status_code == 200, response.content
    drain()
    assert tool_output(fresh(run), "call_delete") == "account acct-9 scheduled for deletion"


def test_two_call_turn_mixed_decision_through_the_api():
    user = make_user()
    run = start_and_halt(prompt="refund A-5005 $15 and email them", user=user)
    request_id = _pending_request(run).request_id
    response = post_json(
        session_client(user),
        f"/api/requests/{request_id}/approve",
        {
            "calls": {
                "call_refund": {"decision": "decline", "reason": "refund already sent"},
                "call_email": {"decision": "output", "output": "email sent"},
            }
        },
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "answered"
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "relay declined for refund: refund already sent"
    assert tool_output(run, "call_email") == "email sent"
    assert run.executions.count() == 0


def test_question_answered_through_the_api():
    user = make_user()
    run = start_and_halt(prompt="ask them a question", user=user)
    request = _pending_request(run)
    assert request.kind == "question"
    response = post_json(
        session_client(user),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": True, "data": {"plan": "basic"}},
    )
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "answered"
    drain()
    assert tool_output(fresh(run), "call_question") == '{"plan":"basic"}'


# -- POST /answer: errors ------------------------------------------------------------------


@pytest.fixture
def halted():
    user = make_user(username="carol")
    run = start_and_halt(user=user)
    return user, run, _pending_request(run)


def _assert_unchanged(run: Run, request: ApprovalRequest, events: int) -> None:
    request.refresh_from_db()
    assert request.state == "pending" and request.decided_at is None
    assert fresh(run).status == "pending"
    assert Event.objects.count() == events
    assert len(tasks_for(run)) == 1


def test_answer_ok_false_declines_with_its_reason(halted):
    user, run, request = halted
    response = post_json(
        session_client(user),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": False, "reason": "not authorised"},
    )
    assert response.status_code == 200
    assert response.json()["state"] == "declined"
    drain()
    assert tool_output(fresh(run), "call_refund") == "relay declined for refund: not authorised"


def test_answer_ok_false_without_reason_reads_declined(halted):
    user, run, request = halted
    response = post_json(
        session_client(user),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": False},
    )
    assert response.status_code == 200
    assert response.json()["decision"]["reason"] == "declined"
    drain()
    assert tool_output(fresh(run), "call_refund") == "relay declined for refund: declined"


def test_answer_with_an_output_for_a_call_that_has_an_executor_is_refused(halted):
    """refund runs on the host once approved: a typed result would replace what runs, so
    only an agent that allows it takes one (tests/approvals/test_record.py)."""
    user, run, request = halted
    events = Event.objects.count()
    response = post_json(
        session_client(user),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": True, "data": {"output": "refunded in the shop"}},
    )
    assert response.status_code == 400
    assert "data.output: refund runs on the host once approved" in response.json()["detail"]
    _assert_unchanged(run, request, events)


def test_answer_id_not_echoing_is_400(halted):
    user, run, request = halted
    events = Event.objects.count()
    response = post_json(
        session_client(user), _answer_url(request.request_id), {"id": "someone-else", "ok": True}
    )
    assert response.status_code == 400
    assert "does not echo" in response.json()["detail"]
    _assert_unchanged(run, request, events)


def test_answer_malformed_json_is_400(halted):
    user, run, request = halted
    events = Event.objects.count()
    client = session_client(user)
    for raw in ("{not json", "", "[1, 2]", '"just a string"', "{'id': 'single quotes'}"):
        response = post_json(client, _answer_url(request.request_id), raw=raw)
        assert response.status_code == 400, raw
        assert isinstance(response.json()["detail"], str)
    _assert_unchanged(run, request, events)


def test_answer_wrong_types_are_400_naming_the_field(halted):
    user, run, request = halted
    rid = request.request_id
    events = Event.objects.count()
    client = session_client(user)
    for body, field in [
        ({"ok": True}, "id"),
        ({"id": rid}, "ok"),
        ({"id": rid, "ok": "yes"}, "ok"),
        ({"id": rid, "ok": 1}, "ok"),
        ({"id": 12, "ok": True}, "id"),
        ({"id": rid, "ok": True, "data": [1]}, "data"),
        ({"id": rid, "ok": False, "reason": 3}, "reason"),
    ]:
        response = post_json(client, _answer_url(rid), body)
        assert response.status_code == 400, (body, response.content)
        detail = response.json()["detail"]
        assert detail.split(":")[0] == field, (body, detail)
    _assert_unchanged(run, request, events)


def test_answer_unknown_fields_are_400(halted):
    user, run, request = halted
    events = Event.objects.count()
    response = post_json(
        session_client(user),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": True, "approved_by": "me"},
    )
    assert response.status_code == 400
    assert "approved_by" in response.json()["detail"]
    _assert_unchanged(run, request, events)


def test_unknown_request_id_is_404():
    user = make_user()
    client = session_client(user)
    response = post_json(client, _answer_url("nope"), {"id": "nope", "ok": True})
    assert response.status_code == 404
    assert response.json() == {"detail": "not found"}
    assert post_json(client, "/api/requests/nope/decline", {}).status_code == 404
    assert post_json(client, "/api/requests/nope/approve", {}).status_code == 404
    assert client.get("/api/requests/nope").status_code == 404
    assert client.get("/api/runs/999999").status_code == 404
    assert client.get("/api/runs/999999/messages").status_code == 404


def test_second_decision_is_409_naming_who_and_when(halted):
    user, run, request = halted
    other = make_user()
    first = post_json(
        session_client(user),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": False},
    )
    assert first.status_code == 200
    decided_at = first.json()["decision"]["decided_at"]
    for path, body in [
        (_answer_url(request.request_id), {"id": request.request_id, "ok": True}),
        (f"/api/requests/{request.request_id}/approve", {}),
        (f"/api/requests/{request.request_id}/decline", {"reason": "me too"}),
    ]:
        response = post_json(session_client(other), path, body)
        assert response.status_code == 409, response.content
        detail = response.json()["detail"]
        assert "carol" in detail
        assert decided_at[:19] in detail  # the second-precision timestamp of the decision
    assert len(tasks_for(run)) == 2
    request.refresh_from_db()
    assert request.decided_by == user


def test_body_over_the_upload_limit_is_413(halted, settings):
    user, run, request = halted
    events = Event.objects.count()
    padding = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    body = json.dumps({"id": request.request_id, "ok": False, "reason": padding})
    response = post_json(Client(), _answer_url(request.request_id), raw=body, headers=bearer(user))
    assert response.status_code == 413
    assert "detail" in response.json()
    response = post_json(session_client(user), _answer_url(request.request_id), raw=body)
    assert response.status_code == 413
    _assert_unchanged(run, request, events)


def test_unauthenticated_is_401(halted):
    _, run, request = halted
    events = Event.objects.count()
    anonymous = Client()
    response = post_json(
        anonymous, _answer_url(request.request_id), {"id": request.request_id, "ok": False}
    )
    assert response.status_code == 401
    assert "detail" in response.json()
    assert anonymous.get("/api/requests").status_code == 401
    assert anonymous.get(f"/api/runs/{run.pk}").status_code == 401
    assert post_json(anonymous, "/api/runs", {"agent": "demo", "prompt": "x"}).status_code == 401
    bad_token = {"Authorization": "Bearer tnx_not-a-real-token"}
    assert anonymous.get("/api/requests", headers=bad_token).status_code == 401
    _assert_unchanged(run, request, events)


def test_anonymous_session_post_with_csrf_enforced_is_401_not_403(halted):
    _, _run, request = halted
    response = post_json(
        Client(enforce_csrf_checks=True),
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": False},
    )
    assert response.status_code == 401


def test_watcher_can_read_but_not_decide(halted):
    _, run, request = halted
    watcher = make_user(role="watcher")
    events = Event.objects.count()
    for client, headers in [(session_client(watcher), {}), (Client(), bearer(watcher))]:
        assert client.get("/api/requests", headers=headers).status_code == 200
        assert client.get(f"/api/runs/{run.pk}", headers=headers).status_code == 200
        assert client.get(f"/api/requests/{request.request_id}", headers=headers).status_code == 200
        for path, body in [
            (_answer_url(request.request_id), {"id": request.request_id, "ok": False}),
            (f"/api/requests/{request.request_id}/approve", {}),
            (f"/api/requests/{request.request_id}/decline", {"reason": "no"}),
            ("/api/runs", {"agent": "demo", "prompt": "refund"}),
        ]:
            response = post_json(client, path, body, headers=headers)
            assert response.status_code == 403, (path, response.content)
            assert "permission" in response.json()["detail"]
    _assert_unchanged(run, request, events)
    assert Run.objects.count() == 1


def test_user_without_view_permission_can_not_read(halted):
    _, run, request = halted
    nobody = session_client(make_user(role="nobody"))
    assert nobody.get("/api/requests").status_code == 403
    assert nobody.get(f"/api/runs/{run.pk}").status_code == 403
    assert nobody.get(f"/api/runs/{run.pk}/messages").status_code == 403
    assert nobody.get(f"/api/requests/{request.request_id}").status_code == 403


def test_session_post_without_csrf_token_is_403(halted):
    user, run, request = halted
    events = Event.objects.count()
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = post_json(
        client, _answer_url(request.request_id), {"id": request.request_id, "ok": False}
    )
    assert response.status_code == 403
    _assert_unchanged(run, request, events)
    # with the token, the same session POST goes through
    secret = "a" * 32
    client.cookies["csrftoken"] = secret
    response = post_json(
        client,
        _answer_url(request.request_id),
        {"id": request.request_id, "ok": False},
        headers={"X-CSRFToken": secret},
    )
    assert response.status_code == 200, response.content


def test_bearer_post_needs_no_csrf_token(halted):
    user, _run, request = halted
    response = post_json(
        Client(enforce_csrf_checks=True),
        f"/api/requests/{request.request_id}/decline",
        {"reason": "by script"},
        headers=bearer(user),
    )
    assert response.status_code == 200, response.content
    assert response.json()["decision"]["reason"] == "by script"


# -- POST /runs ----------------------------------------------------------------------------


def test_start_run_validation():
    client = session_client(make_user())
    for body, field in [
        ({"agent": "nope", "prompt": "hi"}, "agent"),
        ({"agent": "demo"}, "prompt"),
        ({"agent": "demo", "prompt": 5}, "prompt"),
        ({"agent": "demo", "prompt": ""}, "prompt"),
        ({"agent": "demo", "prompt": "hi", "model": "gpt"}, "model"),
    ]:
        response = post_json(client, "/api/runs", body)
        assert response.status_code == 400, (body, response.content)
        assert field in response.json()["detail"], body
    assert Run.objects.count() == 0


def test_start_run_needs_add_run_permission():
    client = session_client(make_user(role="nobody"))
    response = post_json(client, "/api/runs", {"agent": "demo", "prompt": "refund"})
    assert response.status_code == 403
    assert Run.objects.count() == 0


# -- reads ---------------------------------------------------------------------------------


def test_run_shape():
    user = make_user()
    run = start_and_halt(user=user)
    request = _pending_request(run)
    body = session_client(user).get(f"/api/runs/{run.pk}").json()
    for key in ("id", "agent", "prompt", "status", "text", "error", "created_at", "updated_at"):
        assert key in body
    assert body["id"] == run.pk
    assert body["agent"] == "demo"
    assert body["prompt"] == run.prompt
    assert body["status"] == "pending"
    assert body["error"] == ""
    assert body["pending"]["request"] == request.wire
    assert body["pending"]["state"] == "pending"
    assert [c["id"] for c in body["pending"]["calls"]] == ["call_refund"]


def test_request_shape():
    user = make_user()
    run = start_and_halt(user=user)
    request = _pending_request(run)
    body = session_client(user).get(f"/api/requests/{request.request_id}").json()
    assert body["request"] == request.wire
    assert body["request"]["id"] == request.request_id
    assert body["run"] == run.pk
    assert body["state"] == "pending"
    assert body["decision"] is None
    (call,) = body["calls"]
    assert call["id"] == "call_refund" and call["name"] == "refund"
    assert call["arguments"] == '{"order":"A-1001","amount":120}'


def test_messages_are_the_stored_transcript():
    user = make_user()
    run = start_and_halt(user=user)
    body = session_client(user).get(f"/api/runs/{run.pk}/messages").json()
    assert body == run.messages
    assert body[0]["role"] == "system" and body[1] == {"role": "user", "content": run.prompt}


def test_openapi_schema_is_served():
    response = Client().get("/api/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/api/runs",
        "/api/runs/{run_id}",
        "/api/runs/{run_id}/messages",
        "/api/requests",
        "/api/requests/{request_id}",
        "/api/requests/{request_id}/answer",
        "/api/requests/{request_id}/approve",
        "/api/requests/{request_id}/decline",
    ):
        assert path in paths, path


@pytest.fixture
def inbox(second_demo_agent):
    """Five requests, oldest first: refund, question, approval (demo), refund (demo2), and a
    declined refund (demo)."""
    user = make_user()
    runs = [
        start_and_halt(prompt="refund A-1 $1", user=user),
        start_and_halt(prompt="a question", user=user),
        start_and_halt(prompt="delete it", user=user),
        start_and_halt(prompt="refund A-2 $2", agent="demo2", user=user),
        start_and_halt(prompt="refund A-3 $3", user=user),
    ]
    ids = [_pending_request(r).request_id for r in runs]
    services.request_decline(request_id=ids[4], user=user, reason="no")
    return user, ids


def _ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [item["request"]["id"] for item in response.json()["items"]]


def test_request_list_filters_and_order(inbox):
    user, ids = inbox
    client = session_client(user)
    # default: pending only, newest first
    assert _ids(client.get("/api/requests")) == [ids[3], ids[2], ids[1], ids[0]]
    assert _ids(client.get("/api/requests?state=pending")) == [ids[3], ids[2], ids[1], ids[0]]
    assert _ids(client.get("/api/requests?state=declined")) == [ids[4]]
    assert _ids(client.get("/api/requests?state=")) == [ids[4], ids[3], ids[2], ids[1], ids[0]]
    assert _ids(client.get("/api/requests?agent=demo2")) == [ids[3]]
    assert _ids(client.get("/api/requests?agent=demo")) == [ids[2], ids[1], ids[0]]
    assert _ids(client.get("/api/requests?kind=question")) == [ids[1]]
    assert _ids(client.get("/api/requests?kind=approval")) == [ids[2]]
    assert _ids(client.get("/api/requests?kind=tool_call&state=")) == [ids[4], ids[3], ids[0]]
    assert _ids(client.get("/api/requests?kind=tool_call&agent=demo")) == [ids[0]]
    assert client.get("/api/requests?state=bogus").status_code == 400


def test_request_list_pagination(inbox, settings):
    settings.TOOLNEXUS_INBOX_COUNT_CAP = 2  # the pages' counts stop there; the API's never
    user, ids = inbox
    client = session_client(user)
    page = client.get("/api/requests?state=&limit=2").json()
    assert page["count"] == 5
    assert [i["request"]["id"] for i in page["items"]] == [ids[4], ids[3]]
    page = client.get("/api/requests?state=&limit=2&offset=2").json()
    assert page["count"] == 5
    assert [i["request"]["id"] for i in page["items"]] == [ids[2], ids[1]]
    page = client.get("/api/requests?state=&limit=2&offset=4").json()
    assert [i["request"]["id"] for i in page["items"]] == [ids[0]]
    page = client.get("/api/requests?state=&offset=50").json()
    assert page == {"items": [], "count": 5}
    assert client.get("/api/requests?limit=0").status_code == 400
    assert client.get("/api/requests?limit=100000").status_code == 400
    assert client.get("/api/requests?offset=-1").status_code == 400


def test_decided_request_in_the_list_carries_its_decision(inbox):
    user, _ = inbox
    (item,) = session_client(user).get("/api/requests?state=declined").json()["items"]
    assert item["decision"]["reason"] == "no"
    assert item["decision"]["decided_by"] == user.username
    assert item["calls"][0]["decision"] == "decline"


# -- constant query counts -----------------------------------------------------------------


def _make_rows(user, count: int) -> None:
    """`count` halted runs mixing one-call and two-call requests, some decided."""
    runs = [
        services.run_start(
            agent="demo",
            prompt="refund and email" if i % 2 else f"refund A-{i} $1",
            started_by=user,
        )
        for i in range(count)
    ]
    drain()
    for run in runs[::3]:
        services.request_decline(request_id=_pending_request(run).request_id, user=user)


def _queries(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200
    return len(ctx.captured_queries)


LIST_PATHS = ["/api/requests?state=", "/api/requests", "/api/runs", "/api/runs?status=pending"]


def test_list_query_counts_are_constant():
    user = make_user()
    client = session_client(user)
    _make_rows(user, 3)
    small = {path: _queries(client, path) for path in LIST_PATHS}
    _make_rows(user, 27)
    large = {path: _queries(client, path) for path in LIST_PATHS}
    for path in LIST_PATHS:
        assert client.get(path).json()["count"] >= 10, path
    assert small == large


def test_urls_no_endpoint_matches_get_json_404_under_api_and_html_elsewhere():
    user = make_user()
    headers = bearer(user)
    client = Client()
    for path in ("/api/requests/a/b/decline", "/api/nothing-here", "/api/runs/1/2"):
        response = post_json(client, path, {}, headers=headers)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/json", path
        assert response.json() == {"detail": "Not Found: no endpoint at this URL"}
    page = Client().get("/no-such-page/")
    assert page.status_code == 404
    assert page["Content-Type"].startswith("text/html")


def test_an_unexpected_error_in_the_api_is_a_json_500(monkeypatch):
    user = make_user()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("approvals.selectors.inbox_page", broken)
    client = Client(raise_request_exception=False)
    response = client.get("/api/requests", headers=bearer(user))
    assert response.status_code == 500
    assert response.json() == {"detail": "Internal server error"}
    assert "boom" not in response.content.decode()


# -- tokens and throttles in the schema ----------------------------------------------------


def test_the_openapi_schema_documents_own_token_endpoints_and_limits():
    schema = Client().get("/api/openapi.json").json()
    assert "get" in schema["paths"]["/api/tokens"]
    assert "post" in schema["paths"]["/api/tokens/{token_id}/revoke"]
    token_out = schema["components"]["schemas"]["TokenOut"]["properties"]
    assert "key_hash" not in token_out and "token" not in token_out
    assert {"prefix", "state", "expires_at", "last_used_at", "revoked_at"} <= set(token_out)
    description = schema["info"]["description"]
    for words in ("429", "Retry-After", "expired", "revoked", "/api/tokens"):
        assert words in description, words


def test_a_bad_bearer_token_is_401_even_with_a_signed_in_session():
    client = session_client(make_user())
    assert client.get("/api/requests").status_code == 200
    response = client.get("/api/requests", headers={"Authorization": "Bearer tnx_stale"})
    assert response.status_code == 401
    assert response.json()["detail"] == "authentication failed: this bearer token is not valid"
