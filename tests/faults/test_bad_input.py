"""Bad input at every public entry: a clear 4xx (or a clear message on a form) and nothing
changed.

Entries: the JSON API (`/api/...`), the HTML forms (`/requests/<id>/...`, `/runs/...`) and the
websockets (`/ws/...`). After each bad request the database must be exactly as before: the
same runs, requests, calls, decisions, audit events, tool executions and queued tasks.
"""

from __future__ import annotations

import inspect
import json
from functools import cached_property
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client
from django.utils.html import escape

from approvals import services
from approvals.domain.jsonvalues import MAX_DEPTH, TOO_DEEP
from approvals.models import ApprovalRequest, Run
from tests.approvals.factories import (
    bearer,
    drain,
    fresh,
    make_user,
    registered_mock_agent,
    session_client,
    start_and_halt,
)
from tests.faults.rows import snapshot
from toolnexus_web.asgi import application

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

HOSTILE_SCRIPT = "<script>window.__xss=1</script>"
HOSTILE_IMG = '<img src=x onerror="window.__xss=1">'
HOSTILE_ATTR = '"><svg onload=alert(1)>'
TIMEOUT = 5
CSRF_SECRET = "k" * 32


class Raw(str):
    """A request body sent exactly as written (not JSON-encoded)."""


# -- the world every test starts from --------------------------------------------------------


class World:
    """Users and tokens, and (made on first use) runs halted on each kind of request and a
    failed run."""

    def __init__(self):
        self.reviewer = make_user(role="reviewer")
        self.watcher = make_user(role="watcher")
        self.nobody = make_user(role="nobody")
        self.headers = {
            "reviewer": bearer(self.reviewer),
            "watcher": bearer(self.watcher),
            "nobody": bearer(self.nobody),
        }

    @cached_property
    def relay(self) -> Run:
        return start_and_halt(user=self.reviewer, prompt="Refund order A-1001, $250")

    @cached_property
    def rid(self) -> str:
        return self.relay.requests.get().request_id

    @cached_property
    def two_rid(self) -> str:
        run = start_and_halt(user=self.reviewer, prompt="Refund A-1002 $20 and email both")
        return run.requests.get().request_id

    @cached_property
    def qid(self) -> str:
        run = start_and_halt(user=self.reviewer, prompt="ask a question about plans")
        return run.requests.get().request_id

    @cached_property
    def failed(self) -> Run:
        run = services.run_start(agent="broken", prompt="refund B-1 $1", started_by=self.reviewer)
        drain()
        run = fresh(run)
        assert run.status == "failed"
        return run


# What a test uses (in its code or its parameters) -> the World attribute that makes it.
USES = {
    "{rid}": "rid",
    "w.rid": "rid",
    "{run}": "relay",
    "w.relay": "relay",
    "{two}": "two_rid",
    "{qid}": "qid",
    "w.qid": "qid",
    "{failed}": "failed",
}


@pytest.fixture
def w(request):
    """The world, with the runs this test uses made up front, so that a test's "before"
    snapshot is taken after they exist."""
    with registered_mock_agent("broken", fail=True):
        world = World()
        callspec = getattr(request.node, "callspec", None)
        uses = inspect.getsource(request.function) + repr(callspec.params if callspec else {})
        for marker, attribute in USES.items():
            if marker in uses:
                getattr(world, attribute)
        yield world


def fill(template: str, w) -> str:
    """`{rid}`, `{two}`, `{qid}` (request ids) and `{run}`, `{failed}`, `{missing}` (run ids)."""
    values = {
        "rid": lambda: w.rid,
        "two": lambda: w.two_rid,
        "qid": lambda: w.qid,
        "run": lambda: w.relay.pk,
        "failed": lambda: w.failed.pk,
        "missing": lambda: 999999,
    }
    for key, value in values.items():
        if "{" + key + "}" in template:
            template = template.replace("{" + key + "}", str(value()))
    return template


def send(client: Client, path: str, body: Any = None, *, headers=None):
    raw = body if isinstance(body, Raw) else json.dumps({} if body is None else body)
    return client.post(path, data=raw, content_type="application/json", headers=headers or {})


def api(w, path: str, body: Any = None, *, who: str = "reviewer"):
    return send(Client(raise_request_exception=False), path, body, headers=w.headers[who])


def assert_error(response, status: int, fragment: str | None = None) -> str:
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    detail = response.json().get("detail")
    assert isinstance(detail, str) and detail, response.content
    if fragment is not None:
        assert fragment in detail, detail
    return detail


# -- the JSON API: malformed, wrong types, missing, extra, unknown ---------------------------

BIG_PROMPT = "x" * (services.MAX_PROMPT_CHARS + 1)
BIG_REASON = "r" * (services.MAX_REASON_CHARS + 1)
BIG_OUTPUT = "o" * (services.MAX_OUTPUT_CHARS + 1)

API_CASES = [
    # POST /api/runs
    ("runs/invalid-json", "/api/runs", Raw("{"), 400, None),
    ("runs/empty-body", "/api/runs", Raw(""), 400, None),
    ("runs/array-body", "/api/runs", [], 400, "body"),
    ("runs/string-body", "/api/runs", "refund", 400, "body"),
    ("runs/agent-int", "/api/runs", {"agent": 1, "prompt": "x"}, 400, "agent"),
    ("runs/prompt-list", "/api/runs", {"agent": "demo", "prompt": ["x"]}, 400, "prompt"),
    ("runs/prompt-null", "/api/runs", {"agent": "demo", "prompt": None}, 400, "prompt"),
    ("runs/prompt-missing", "/api/runs", {"agent": "demo"}, 400, "prompt"),
    ("runs/agent-missing", "/api/runs", {"prompt": "x"}, 400, "agent"),
    ("runs/extra", "/api/runs", {"agent": "demo", "prompt": "x", "priority": 1}, 400, "priority"),
    ("runs/unknown-agent", "/api/runs", {"agent": "nope", "prompt": "x"}, 400, "agent"),
    ("runs/agent-too-long", "/api/runs", {"agent": "a" * 101, "prompt": "x"}, 400, "agent"),
    ("runs/blank-prompt", "/api/runs", {"agent": "demo", "prompt": "  \n "}, 400, "prompt"),
    ("runs/huge-prompt", "/api/runs", {"agent": "demo", "prompt": BIG_PROMPT}, 400, "prompt"),
    # POST /api/requests/{id}/answer
    ("answer/unknown-id", "/api/requests/nope/answer", {"id": "nope", "ok": False}, 404, None),
    (
        "answer/not-echoing",
        "/api/requests/{rid}/answer",
        {"id": "x", "ok": False},
        400,
        "does not echo",
    ),
    ("answer/invalid-json", "/api/requests/{rid}/answer", Raw('{"id": '), 400, None),
    ("answer/ok-string", "/api/requests/{rid}/answer", {"id": "{rid}", "ok": "no"}, 400, "ok"),
    ("answer/id-int", "/api/requests/{rid}/answer", {"id": 7, "ok": False}, 400, "id"),
    ("answer/ok-missing", "/api/requests/{rid}/answer", {"id": "{rid}"}, 400, "ok"),
    (
        "answer/data-list",
        "/api/requests/{rid}/answer",
        {"id": "{rid}", "ok": True, "data": [1]},
        400,
        "data",
    ),
    (
        "answer/extra",
        "/api/requests/{rid}/answer",
        {"id": "{rid}", "ok": False, "by": "me"},
        400,
        "by",
    ),
    (
        "answer/reason-int",
        "/api/requests/{rid}/answer",
        {"id": "{rid}", "ok": False, "reason": 5},
        400,
        "reason",
    ),
    (
        "answer/reason-too-long",
        "/api/requests/{rid}/answer",
        {"id": "{rid}", "ok": False, "reason": BIG_REASON},
        400,
        "reason",
    ),
    # POST /api/requests/{id}/approve
    ("approve/unknown-id", "/api/requests/nope/approve", {}, 404, None),
    ("approve/invalid-json", "/api/requests/{rid}/approve", Raw("{]"), 400, None),
    ("approve/input-string", "/api/requests/{rid}/approve", {"input": "x"}, 400, "input"),
    ("approve/output-int", "/api/requests/{rid}/approve", {"output": 5}, 400, "output"),
    ("approve/calls-list", "/api/requests/{rid}/approve", {"calls": []}, 400, "calls"),
    ("approve/extra", "/api/requests/{rid}/approve", {"force": True}, 400, "force"),
    (
        "approve/input-against-schema",
        "/api/requests/{rid}/approve",
        {"input": {"order": "A-1001", "amount": -5}},
        400,
        "amount",
    ),
    (
        "approve/input-extra-property",
        "/api/requests/{rid}/approve",
        {"input": {"order": "A-1001", "amount": 5, "to": "me"}},
        400,
        "to",
    ),
    (
        "approve/input-and-output",
        "/api/requests/{rid}/approve",
        {"input": {"order": "A-1001", "amount": 5}, "output": "done"},
        400,
        "either",
    ),
    ("approve/huge-output", "/api/requests/{rid}/approve", {"output": BIG_OUTPUT}, 400, "output"),
    (
        "approve/unknown-call",
        "/api/requests/{two}/approve",
        {"calls": {"nope": {"decision": "approve"}}},
        400,
        "nope",
    ),
    (
        "approve/bad-decision",
        "/api/requests/{two}/approve",
        {"calls": {"call_refund": {"decision": "maybe"}}},
        400,
        "decision",
    ),
    (
        "approve/call-extra-field",
        "/api/requests/{two}/approve",
        {"calls": {"call_refund": {"decision": "approve", "sudo": True}}},
        400,
        "sudo",
    ),
    (
        "approve/call-reason-too-long",
        "/api/requests/{two}/approve",
        {"calls": {"call_refund": {"decision": "decline", "reason": BIG_REASON}}},
        400,
        "reason",
    ),
    (
        "approve/two-calls-shorthand",
        "/api/requests/{two}/approve",
        {"output": "done"},
        400,
        "calls",
    ),
    # POST /api/requests/{id}/decline
    ("decline/unknown-id", "/api/requests/nope/decline", {"reason": "no"}, 404, None),
    ("decline/invalid-json", "/api/requests/{rid}/decline", Raw("reason=no"), 400, None),
    ("decline/not-object", "/api/requests/{rid}/decline", ["no"], 400, "body"),
    ("decline/reason-int", "/api/requests/{rid}/decline", {"reason": 5}, 400, "reason"),
    ("decline/reason-too-long", "/api/requests/{rid}/decline", {"reason": BIG_REASON}, 400, None),
    ("decline/extra", "/api/requests/{rid}/decline", {"reason": "no", "x": 1}, 400, "x"),
    # POST /api/runs/{id}/retry
    ("retry/unknown-run", "/api/runs/{missing}/retry", None, 404, None),
    ("retry/not-an-int", "/api/runs/abc/retry", None, 400, "run_id"),
    ("retry/not-failed", "/api/runs/{run}/retry", None, 409, "only a failed run"),
    # POST /api/runs/{id}/cancel
    ("cancel/unknown-run", "/api/runs/{missing}/cancel", {}, 404, None),
    ("cancel/not-an-int", "/api/runs/1.5/cancel", {}, 400, "run_id"),
    ("cancel/invalid-json", "/api/runs/{run}/cancel", Raw("{"), 400, None),
    ("cancel/reason-int", "/api/runs/{run}/cancel", {"reason": 5}, 400, "reason"),
    ("cancel/reason-too-long", "/api/runs/{run}/cancel", {"reason": BIG_REASON}, 400, "reason"),
    ("cancel/extra", "/api/runs/{run}/cancel", {"why": "x"}, 400, "why"),
]


def _fill_body(body: Any, w) -> Any:
    if isinstance(body, Raw):
        return body
    return json.loads(fill(json.dumps(body), w))


@pytest.mark.parametrize(
    "path, body, status, fragment", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES]
)
def test_api_bad_input_is_a_clear_4xx_and_changes_nothing(w, path, body, status, fragment):
    before = snapshot()
    response = api(w, fill(path, w), _fill_body(body, w))
    assert_error(response, status, fragment)
    assert snapshot() == before


def test_api_wrong_type_names_the_field_as_sent(w):
    detail = assert_error(api(w, f"/api/requests/{w.rid}/answer", {"id": w.rid, "ok": "yes"}), 400)
    assert detail.startswith("ok:"), detail
    detail = assert_error(api(w, "/api/runs", {"agent": "demo", "prompt": 3}), 400)
    assert detail.startswith("prompt:"), detail


POST_ENDPOINTS = [
    ("runs", "/api/runs", {"agent": "demo", "prompt": "refund A-1 $1"}),
    ("answer", "/api/requests/{rid}/answer", {"id": "{rid}", "ok": False, "reason": "no"}),
    ("approve", "/api/requests/{rid}/approve", {}),
    ("decline", "/api/requests/{rid}/decline", {"reason": "no"}),
    ("retry", "/api/runs/{failed}/retry", {}),
    ("cancel", "/api/runs/{run}/cancel", {"reason": "no"}),
]
ENDPOINT_IDS = [e[0] for e in POST_ENDPOINTS]


@pytest.mark.parametrize("path, body", [e[1:] for e in POST_ENDPOINTS], ids=ENDPOINT_IDS)
def test_api_oversized_body_is_413_and_changes_nothing(w, path, body):
    padded = dict(_fill_body(body, w))
    padded["padding"] = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    before = snapshot()
    for client, headers in [
        (Client(raise_request_exception=False), w.headers["reviewer"]),
        (session_client(w.reviewer, raise_request_exception=False), {}),
    ]:
        response = send(client, fill(path, w), Raw(json.dumps(padded)), headers=headers)
        assert_error(response, 413)
    assert snapshot() == before


@pytest.mark.parametrize("path, body", [e[1:] for e in POST_ENDPOINTS], ids=ENDPOINT_IDS)
def test_api_session_post_without_csrf_token_is_403_and_changes_nothing(w, path, body):
    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    client.force_login(w.reviewer)
    before = snapshot()
    assert_error(send(client, fill(path, w), _fill_body(body, w)), 403, "CSRF")
    assert snapshot() == before


@pytest.mark.parametrize("who", ["watcher", "nobody"])
@pytest.mark.parametrize("path, body", [e[1:] for e in POST_ENDPOINTS], ids=ENDPOINT_IDS)
def test_api_post_without_permission_is_403_and_changes_nothing(w, path, body, who):
    before = snapshot()
    assert_error(api(w, fill(path, w), _fill_body(body, w), who=who), 403, "permission")
    session = session_client(getattr(w, who), raise_request_exception=False)
    assert_error(send(session, fill(path, w), _fill_body(body, w)), 403, "permission")
    assert snapshot() == before


@pytest.mark.parametrize("path, body", [e[1:] for e in POST_ENDPOINTS], ids=ENDPOINT_IDS)
def test_api_anonymous_post_is_401_and_changes_nothing(w, path, body):
    before = snapshot()
    for headers in [{}, {"Authorization": "Bearer tnx_forged"}, {"Authorization": "Basic eDp5"}]:
        response = send(
            Client(enforce_csrf_checks=True), fill(path, w), _fill_body(body, w), headers=headers
        )
        assert_error(response, 401, "authentication")
    assert snapshot() == before


GET_CASES = [
    ("run-unknown", "/api/runs/{missing}", 404, None),
    ("run-not-int", "/api/runs/x", 400, "run_id"),
    ("messages-unknown", "/api/runs/{missing}/messages", 404, None),
    ("request-unknown", "/api/requests/nope", 404, None),
    ("requests-bad-state", "/api/requests?state=maybe", 400, "state"),
    ("requests-limit-zero", "/api/requests?limit=0", 400, "limit"),
    ("requests-limit-huge", "/api/requests?limit=100000", 400, "limit"),
    ("requests-limit-text", "/api/requests?limit=ten", 400, "limit"),
    ("requests-offset-negative", "/api/requests?offset=-1", 400, "offset"),
    ("requests-offset-huge", "/api/requests?offset=100000000000000000000", 400, "offset"),
    ("runs-offset-huge", "/api/runs?offset=9223372036854775808", 400, "offset"),
]


@pytest.mark.parametrize(
    "path, status, fragment", [c[1:] for c in GET_CASES], ids=[c[0] for c in GET_CASES]
)
def test_api_bad_reads_are_a_clear_4xx(w, path, status, fragment):
    response = Client(raise_request_exception=False).get(
        fill(path, w), headers=w.headers["reviewer"]
    )
    assert_error(response, status, fragment)


# -- values no database should choke on: NUL characters and non-finite numbers ---------------


def _stored_or_refused(response, before: dict[str, Any]) -> bool:
    """True when accepted (2xx); a refusal must be a clear 4xx that changed nothing."""
    assert response.status_code < 500, (response.status_code, response.content[:200])
    if response.status_code >= 400:
        assert_error(response, response.status_code)
        assert snapshot() == before
        return False
    return True


def test_api_prompt_with_a_nul_character_is_stored_verbatim_or_refused(w):
    prompt = "refund A-1 $1\x00 then stop"
    before = snapshot()
    response = api(w, "/api/runs", {"agent": "demo", "prompt": prompt})
    if _stored_or_refused(response, before):
        assert Run.objects.get(pk=response.json()["id"]).prompt == prompt


def test_api_reason_with_a_nul_character_is_stored_verbatim_or_refused(w):
    before = snapshot()
    response = api(w, f"/api/requests/{w.rid}/decline", {"reason": "no\x00pe"})
    if _stored_or_refused(response, before):
        assert ApprovalRequest.objects.get(request_id=w.rid).reason == "no\x00pe"


@pytest.mark.parametrize(
    "path", ["/api/requests/a%00b", "/api/requests?agent=%00", "/api/requests?kind=x%00"]
)
def test_api_reads_with_a_nul_character_do_not_fail(w, path):
    response = Client(raise_request_exception=False).get(path, headers=w.headers["reviewer"])
    assert response.status_code in (200, 400, 404), (response.status_code, response.content[:200])
    assert response["Content-Type"].startswith("application/json")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_api_non_finite_numbers_in_edited_input_are_400(w, number):
    before = snapshot()
    body = Raw('{"input": {"order": "A-1001", "amount": ' + number + "}}")
    assert_error(api(w, f"/api/requests/{w.rid}/approve", body), 400, "amount")
    assert snapshot() == before


def test_api_non_finite_number_in_answer_data_is_400(w):
    before = snapshot()
    body = Raw('{"id": "' + w.qid + '", "ok": true, "data": {"answers": {"Plan": NaN}}}')
    assert_error(api(w, f"/api/requests/{w.qid}/answer", body), 400)
    assert snapshot() == before


# -- HTML forms: CSRF, permissions, unknown ids, anonymous ------------------------------------

FORMS = [
    ("decline", "/requests/{rid}/decline/", {"reason": "no"}),
    ("approve", "/requests/{rid}/approve/", {}),
    ("output", "/requests/{rid}/output/", {"output": "done by hand"}),
    ("edit", "/requests/{rid}/edit/", {"field.order": "A-1001", "field.amount": "10"}),
    ("respond", "/requests/{qid}/respond/", {"q.0": "pro"}),
    (
        "calls",
        "/requests/{two}/calls/",
        {"decision.call_refund": "decline", "decision.call_email": "decline"},
    ),
    ("run-new", "/runs/new/", {"agent": "demo", "prompt": "refund A-9 $9"}),
    ("run-retry", "/runs/{failed}/retry/", {}),
    ("run-cancel", "/runs/{run}/cancel/", {}),
]
FORM_IDS = [f[0] for f in FORMS]


def _form_client(user=None, **kwargs) -> Client:
    client = Client(raise_request_exception=False, **kwargs)
    if user is not None:
        client.force_login(user)
    return client


@pytest.mark.parametrize("path, data", [f[1:] for f in FORMS], ids=FORM_IDS)
def test_form_without_csrf_token_is_403_and_changes_nothing(w, path, data):
    before = snapshot()
    response = _form_client(w.reviewer, enforce_csrf_checks=True).post(fill(path, w), data)
    assert response.status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("path, data", [f[1:] for f in FORMS], ids=FORM_IDS)
def test_form_without_permission_is_403_and_changes_nothing(w, path, data):
    before = snapshot()
    for user in (w.watcher, w.nobody):
        response = _form_client(user).post(fill(path, w), data)
        assert response.status_code == 403, (user, response.status_code)
    assert snapshot() == before


@pytest.mark.parametrize(
    "path, data",
    [
        (f[1].replace("{rid}", "nope").replace("{qid}", "nope").replace("{two}", "nope"), f[2])
        for f in FORMS[:6]
    ]
    + [("/runs/{missing}/retry/", {}), ("/runs/{missing}/cancel/", {})],
    ids=[*FORM_IDS[:6], "run-retry", "run-cancel"],
)
def test_form_with_an_unknown_id_is_404_and_changes_nothing(w, path, data):
    before = snapshot()
    response = _form_client(w.reviewer).post(fill(path, w), data)
    assert response.status_code == 404
    assert snapshot() == before


@pytest.mark.parametrize("path, data", [f[1:] for f in FORMS], ids=FORM_IDS)
def test_anonymous_form_post_goes_to_login_and_changes_nothing(w, path, data):
    before = snapshot()
    response = _form_client().post(fill(path, w), data)
    assert response.status_code == 302
    assert response["Location"].startswith(settings.LOGIN_URL)
    assert snapshot() == before


@pytest.mark.parametrize("path, data", [f[1:] for f in FORMS], ids=FORM_IDS)
def test_oversized_form_post_is_a_4xx_and_changes_nothing(w, path, data):
    # CSRF checks on, with a valid token: as in a browser, the body is read before the view
    client = _form_client(w.reviewer, enforce_csrf_checks=True)
    client.cookies["csrftoken"] = CSRF_SECRET
    padded = {
        **data,
        "csrfmiddlewaretoken": CSRF_SECRET,
        "padding": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1),
    }
    before = snapshot()
    response = client.post(fill(path, w), padded)
    assert response.status_code in (400, 413), response.status_code  # not 403: the token is good
    assert snapshot() == before


# -- HTML forms: garbage values get a clear message ------------------------------------------

GARBAGE = [
    ("approve-not-json", "/requests/{rid}/approve/", {"input": "{not json"}, "not valid JSON"),
    ("approve-json-array", "/requests/{rid}/approve/", {"input": "[1, 2]"}, "must be an object"),
    (
        "approve-wrong-type",
        "/requests/{rid}/approve/",
        {"input": '{"order": "A-1001", "amount": "lots"}'},
        "expected number",
    ),
    (
        "approve-extra-argument",
        "/requests/{rid}/approve/",
        {"input": '{"order": "A-1001", "amount": 1, "to": "me"}'},
        "not an allowed property",
    ),
    (
        "approve-nan",
        "/requests/{rid}/approve/",
        {"input": '{"order": "A-1001", "amount": NaN}'},
        "amount",
    ),
    (
        "decline-reason-too-long",
        "/requests/{rid}/decline/",
        {"reason": "r" * (services.MAX_REASON_CHARS + 1)},
        f"at most {services.MAX_REASON_CHARS} characters",
    ),
    (
        "output-too-long",
        "/requests/{rid}/output/",
        {"output": "o" * (services.MAX_OUTPUT_CHARS + 1)},
        f"at most {services.MAX_OUTPUT_CHARS} characters",
    ),
    (
        "edit-not-a-number",
        "/requests/{rid}/edit/",
        {"field.order": "A-1001", "field.amount": "lots"},
        "amount: not a valid number",
    ),
    (
        "edit-out-of-range",
        "/requests/{rid}/edit/",
        {"field.order": "A-1001", "field.amount": "-5"},
        "must be at least 0",
    ),
    (
        "edit-bad-json-field",
        "/requests/{rid}/edit/",
        {"field.order": "A-1001", "field.amount": "5", "field.extra": "{oops"},
        "extra: not a valid JSON value",
    ),
    (
        "calls-unknown-decision",
        "/requests/{two}/calls/",
        {"decision.call_refund": "maybe", "decision.call_email": "decline"},
        "decision: must be approve, output or decline",
    ),
    (
        "calls-reason-too-long",
        "/requests/{two}/calls/",
        {
            "decision.call_refund": "decline",
            "reason.call_refund": "r" * (services.MAX_REASON_CHARS + 1),
            "decision.call_email": "decline",
        },
        f"at most {services.MAX_REASON_CHARS} characters",
    ),
    (
        "calls-approve-without-executor",
        "/requests/{two}/calls/",
        {"decision.call_refund": "approve", "decision.call_email": "approve"},
        "has no executor",
    ),
    ("respond-missing-answer", "/requests/{qid}/respond/", {}, "Answer every question"),
    ("respond-to-a-relay-call", "/requests/{rid}/respond/", {"field.bogus": "1"}, None),
]


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
@pytest.mark.parametrize(
    "path, data, message", [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE]
)
def test_form_garbage_gets_a_clear_message_and_changes_nothing(w, path, data, message, htmx):
    before = snapshot()
    client = _form_client(w.reviewer)
    headers = {"HX-Request": "true"} if htmx else {}
    response = client.post(fill(path, w), data, headers=headers, follow=not htmx)
    if not htmx and "/edit/" in path:
        # The editor's errors come back on the request's page, with what was typed kept.
        assert response.status_code == 400, response.status_code
        assert not response.redirect_chain
        assert 'class="edit" open' in response.content.decode()
    else:
        assert response.status_code == 200, response.status_code
    if not htmx and "/edit/" not in path:
        assert response.redirect_chain and response.redirect_chain[0][1] == 302
    page = response.content.decode()
    if message is not None:
        assert escape(message) in page, page[:2000]
    assert snapshot() == before


@pytest.mark.parametrize(
    "data, message",
    [
        ({"agent": "nope", "prompt": "refund"}, "no agent named"),
        ({"prompt": "refund"}, "agent"),
        ({"agent": "demo", "prompt": "   "}, "prompt: must be a non-empty string"),
        ({"agent": "demo"}, "prompt: must be a non-empty string"),
        ({"agent": "demo", "prompt": BIG_PROMPT}, "at most 20000 characters"),
        ({"agent": "demo", "prompt": "refund \x00 now"}, None),
    ],
    ids=["unknown-agent", "no-agent", "blank-prompt", "no-prompt", "huge-prompt", "nul-prompt"],
)
def test_start_form_garbage_is_400_with_a_message_and_starts_nothing(w, data, message):
    before = snapshot()
    response = _form_client(w.reviewer).post("/runs/new/", data)
    if message is None:  # a NUL: stored verbatim or refused, never a server error
        assert response.status_code in (302, 400), response.status_code
        if response.status_code == 302:
            assert Run.objects.order_by("-pk").first().prompt == data["prompt"]
            return
    else:
        assert response.status_code == 400, response.status_code
        assert escape(message) in response.content.decode()
    assert snapshot() == before


def test_retry_form_on_a_run_that_did_not_fail_warns_and_changes_nothing(w):
    before = snapshot()
    response = _form_client(w.reviewer).post(f"/runs/{w.relay.pk}/retry/", follow=True)
    assert response.status_code == 200
    assert "only a failed run can be retried" in response.content.decode()
    assert snapshot() == before


def test_decline_form_reason_with_a_nul_character_is_stored_or_refused(w):
    before = snapshot()
    response = _form_client(w.reviewer).post(f"/requests/{w.rid}/decline/", {"reason": "a\x00b"})
    assert response.status_code < 500, response.status_code
    row = ApprovalRequest.objects.get(request_id=w.rid)
    if row.state == "pending":
        assert snapshot() == before
    else:
        assert row.reason == "a\x00b"


@pytest.mark.parametrize("query", ["?agent=%00", "?kind=%00x", "?state=%00", "?page=%00"])
def test_inbox_filters_with_a_nul_character_do_not_fail(w, query):
    response = _form_client(w.reviewer).get("/" + query)
    assert response.status_code == 200, response.status_code


# -- hostile HTML: stored verbatim, rendered escaped -----------------------------------------


@pytest.fixture
def hostile_agent():
    with registered_mock_agent(
        "hostile", tool_input={"order": HOSTILE_SCRIPT, "amount": 5}
    ) as model:
        yield model


def _assert_escaped(html: str, *raw: str) -> None:
    for value in raw:
        assert value not in html, f"raw {value!r} in the page"
        # Django escapes quotes too; sanitized Markdown text escapes only &, < and > (quotes
        # are harmless in text, outside attributes).
        as_text = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        assert escape(value) in html or as_text in html, f"escaped {value!r} missing"


def test_hostile_html_is_stored_verbatim_and_rendered_escaped(w, hostile_agent):
    prompt = f"Refund {HOSTILE_IMG} {HOSTILE_ATTR}"
    reason = f"no {HOSTILE_SCRIPT} {HOSTILE_ATTR}"
    headers = w.headers["reviewer"]
    created = api(w, "/api/runs", {"agent": "hostile", "prompt": prompt})
    assert created.status_code == 201, created.content
    run = Run.objects.get(pk=created.json()["id"])
    drain()
    run = fresh(run)
    row = run.requests.get(state="pending")
    call = row.calls.get()
    assert run.prompt == prompt
    assert call.input["order"] == HOSTILE_SCRIPT
    assert HOSTILE_SCRIPT in call.arguments

    client = _form_client(w.reviewer)
    inbox = client.get("/").content.decode()
    _assert_escaped(inbox, HOSTILE_IMG, HOSTILE_ATTR, HOSTILE_SCRIPT)
    card = client.get(f"/requests/{row.request_id}/").content.decode()
    _assert_escaped(card, HOSTILE_IMG, HOSTILE_SCRIPT)

    declined = api(w, f"/api/requests/{row.request_id}/decline", {"reason": reason})
    assert declined.status_code == 200, declined.content
    row.refresh_from_db()
    assert row.reason == reason
    assert row.answer == {"id": row.request_id, "ok": False, "reason": reason}
    shown = Client().get(f"/api/requests/{row.request_id}", headers=headers).json()
    assert shown["decision"]["reason"] == reason  # JSON carries it as sent

    drain()
    run = fresh(run)
    assert run.status == "done"
    page = client.get(f"/runs/{run.pk}/").content.decode()
    _assert_escaped(page, HOSTILE_IMG, HOSTILE_ATTR, HOSTILE_SCRIPT)
    decided = client.get("/?state=all").content.decode()
    _assert_escaped(decided, HOSTILE_IMG, HOSTILE_SCRIPT)
    runs = client.get("/runs/").content.decode()
    assert HOSTILE_IMG not in runs and HOSTILE_ATTR not in runs


def test_hostile_filter_values_are_rendered_escaped(w):
    client = _form_client(w.reviewer)
    page = client.get("/", {"agent": HOSTILE_ATTR, "kind": HOSTILE_SCRIPT}).content.decode()
    assert HOSTILE_ATTR not in page and HOSTILE_SCRIPT not in page


def test_hostile_reason_through_the_form_is_stored_verbatim_and_escaped(w):
    client = _form_client(w.reviewer)
    response = client.post(
        f"/requests/{w.rid}/decline/", {"reason": HOSTILE_IMG}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    _assert_escaped(response.content.decode(), HOSTILE_IMG)
    assert ApprovalRequest.objects.get(request_id=w.rid).reason == HOSTILE_IMG


# -- websockets: frames from the page change nothing ----------------------------------------


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def _socket(path: str, user) -> tuple[WebsocketCommunicator, str]:
    cookie = await database_sync_to_async(_session_cookie)(user)
    comm = WebsocketCommunicator(
        application,
        path,
        headers=[
            (b"origin", b"http://testserver"),
            (b"host", b"testserver"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ],
    )
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected, path
    return comm, await comm.receive_from(timeout=TIMEOUT)


async def _world():
    reviewer = await database_sync_to_async(make_user)(role="reviewer")

    def halt():
        run = start_and_halt(user=reviewer)
        return run, run.requests.get()

    run, row = await database_sync_to_async(halt)()
    return reviewer, run, row


def _socket_paths(run: Run) -> list[str]:
    return ["/ws/inbox/", f"/ws/runs/{run.pk}/"]


@pytest.mark.parametrize(
    "frame",
    [
        {"text_data": "x" * 4097},
        {"text_data": json.dumps({"decision": "approve", "padding": "y" * 5000})},
        {"bytes_data": b"\x00\x01\x02"},
        {"bytes_data": b'{"decision": "approve"}'},
    ],
    ids=["oversized-text", "oversized-json", "binary", "binary-json"],
)
@pytest.mark.parametrize("where", ["inbox", "run"])
async def test_oversized_or_binary_frame_closes_the_socket_and_changes_nothing(
    in_memory_layer, frame, where
):
    reviewer, run, _row = await _world()
    before = await database_sync_to_async(snapshot)()
    path = _socket_paths(run)[0 if where == "inbox" else 1]
    comm, _ = await _socket(path, reviewer)
    await comm.send_to(**frame)
    output = await comm.receive_output(timeout=TIMEOUT)
    assert output["type"] == "websocket.close"
    assert output["code"] == 4400
    await comm.disconnect()
    assert await database_sync_to_async(snapshot)() == before


GARBAGE_FRAMES = [
    "hello",
    "\x00",
    "{",
    "<div hx-swap-oob='true' id='request-list'>owned</div>",
    json.dumps({"HEADERS": {"HX-Request": "true"}, "reason": "sneaky"}),
    json.dumps({"action": "decline", "request_id": "{rid}", "reason": "ws"}),
    json.dumps({"decision": "approve", "request": "{rid}"}),
    "x" * 4096,  # exactly at the limit: still ignored, not closed
]


async def _send_garbage(comm: WebsocketCommunicator, row: ApprovalRequest) -> None:
    await comm.send_input({"type": "websocket.receive", "text": ""})
    for text in GARBAGE_FRAMES:
        await comm.send_to(text_data=text.replace("{rid}", row.request_id))


@pytest.mark.parametrize("inbox_path", ["/ws/inbox/?state=all", "/ws/inbox/"])
async def test_garbage_text_frames_are_ignored_and_the_socket_stays_live(
    in_memory_layer, inbox_path
):
    reviewer, run, row = await _world()
    before = await database_sync_to_async(snapshot)()
    inbox, _ = await _socket(inbox_path, reviewer)
    page, _ = await _socket(f"/ws/runs/{run.pk}/", reviewer)
    try:
        for comm in (inbox, page):
            await _send_garbage(comm, row)
            assert await comm.receive_nothing(timeout=0.2)
        assert await database_sync_to_async(snapshot)() == before

        # both sockets still carry pushes: a real decision (over HTTP) reaches them
        def decide():
            services.request_decline(request_id=row.request_id, user=reviewer, reason="http")

        await database_sync_to_async(decide)()
        assert f"request-{row.pk}" in await inbox.receive_from(timeout=TIMEOUT)
        assert 'id="run-body"' in await page.receive_from(timeout=TIMEOUT)
    finally:
        await inbox.disconnect()
        await page.disconnect()


async def test_inbox_socket_with_a_nul_filter_connects(in_memory_layer):
    reviewer, _run, _row = await _world()
    comm, snapshot_html = await _socket("/ws/inbox/?agent=%00&kind=%00", reviewer)
    try:
        assert 'id="request-list"' in snapshot_html
    finally:
        await comm.disconnect()


# -- deep model output: stored as received, shown truncated ----------------------------------


def _nested(levels: int, leaf: str = "bottom") -> dict:
    value: object = leaf
    for _ in range(levels):
        value = {"k": value}
    return value  # type: ignore[return-value]


@pytest.fixture
def deep_agent():
    with registered_mock_agent(
        "deep", tool_input={"order": "A-900", "amount": 5, "meta": _nested(900)}
    ) as model:
        yield model


def test_deep_model_arguments_are_stored_whole_and_every_page_shows_them_truncated(w, deep_agent):
    """A model may send arguments nested far deeper than people may type (MAX_DEPTH): the
    request is stored as received, every page shows it cut at the limit with a note, and it
    can still be decided."""
    from django.contrib.auth import get_user_model

    created = api(w, "/api/runs", {"agent": "deep", "prompt": "Refund A-900"})
    assert created.status_code == 201, created.content
    run = Run.objects.get(pk=created.json()["id"])
    drain()
    row = fresh(run).requests.get(state="pending")
    call = row.calls.get()

    def depth_and_leaf(value):
        depth = 0
        while isinstance(value, dict):
            value, depth = value["k"], depth + 1
        return depth, value

    # the raw arguments keep what the model sent; the JSON columns hold it cut at the limit
    assert depth_and_leaf(json.loads(call.arguments)["meta"]) == (900, "bottom")
    assert depth_and_leaf(call.input["meta"]) == (MAX_DEPTH - 1, TOO_DEEP)
    assert call.input["order"] == "A-900"

    client = _form_client(w.reviewer)
    pages = {
        "inbox": f"/?r={row.request_id}",
        "request page": f"/requests/{row.request_id}/",
        "card": f"/requests/{row.request_id}/card/",
        "run page": f"/runs/{run.pk}/",
    }
    for name, path in pages.items():
        response = client.get(path)
        assert response.status_code == 200, (name, response.status_code)
        html = response.content.decode()
        assert "A-900" in html, name
        assert "nested more than 64 levels deep" in html, name  # the note where it was cut
        assert "bottom" not in html, name
    admin = get_user_model().objects.create_superuser("deep-admin", password="x")
    staff = Client()
    staff.force_login(admin)
    for path in (
        f"/admin/approvals/approvalrequest/{row.pk}/change/",
        f"/admin/approvals/run/{run.pk}/change/",
    ):
        response = staff.get(path)
        assert response.status_code == 200, (path, response.status_code)
    api_view = Client().get(f"/api/requests/{row.request_id}", headers=w.headers["reviewer"])
    assert api_view.status_code == 200  # the API carries the value as received

    declined = api(w, f"/api/requests/{row.request_id}/decline", {"reason": "too deep"})
    assert declined.status_code == 200, declined.content
    drain()
    assert fresh(run).status == "done"
    assert client.get(f"/runs/{run.pk}/").status_code == 200


def test_an_approved_call_cut_for_the_page_runs_with_what_the_model_sent(w):
    """The executor gets the model's whole arguments, not the value cut for storage; the
    journal keeps the cut record."""
    from approvals import agents
    from approvals.agents.demo import demo_tools
    from approvals.models import ToolExecution
    from tests.approvals.factories import MockOpenAI

    seen: list[Any] = []

    def refund(args: dict[str, Any]) -> str:
        seen.append(args)
        return "refunded"

    model = MockOpenAI(tool="refund", tool_input={"order": "A-901", "meta": _nested(200)})
    agents.register(
        "deep2", model=model.client, tools=demo_tools, executors={"refund": refund}, replace=True
    )
    try:
        created = api(w, "/api/runs", {"agent": "deep2", "prompt": "Refund A-901"})
        run = Run.objects.get(pk=created.json()["id"])
        drain()
        row = fresh(run).requests.get(state="pending")
        approved = api(w, f"/api/requests/{row.request_id}/approve", {})
        assert approved.status_code == 200, approved.content
        drain()
    finally:
        agents.unregister("deep2")
    assert fresh(run).status == "done"
    assert seen and seen[0]["meta"] == _nested(200)
    assert TOO_DEEP in json.dumps(ToolExecution.objects.get(run=run).input, ensure_ascii=False)
