"""Property-based fuzzing of the JSON API (hypothesis, in-process through Django's client).

For every endpoint, hypothesis generates bodies (well-shaped ones with arbitrary field
values, arbitrary JSON, extra fields, raw bytes), path ids (real targets and arbitrary
text or integers), query parameters and callers (reviewer, watcher, anonymous, a session
without its CSRF token). Each answer must:

- never be a 5xx;
- carry a status the OpenAPI schema documents for that operation;
- when 4xx, be JSON with a non-empty string `detail`, and leave the database exactly as it
  was (runs, requests, calls, audit events, tool executions, queued tasks);
- when 2xx, validate against the operation's response schema.

A target consumed by a successful decision (or a retried or cancelled run) is replaced
before the next example. Examples per endpoint: TOOLNEXUS_FUZZ_EXAMPLES (default 100, at
most 200); TOOLNEXUS_FUZZ_SHRINK=1 shrinks failures. Each test also replays explicit
`@example`s of input classes that once broke the API (NUL characters, non-finite numbers,
offsets past 64 bits), so those stay covered whatever the random draw.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from django.test import Client
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from approvals import services
from approvals.api import api, schemas
from approvals.execution import store
from approvals.models import ApprovalRequest, Run
from tests.approvals.factories import bearer, make_user, registered_mock_agent, start_and_halt
from tests.faults.rows import snapshot

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

EXAMPLES = min(200, int(os.environ.get("TOOLNEXUS_FUZZ_EXAMPLES", "100")))
# Shrinking a failure replays hundreds of requests (each 500 logs a traceback): off unless
# asked for, so a failing run stays well under a minute. Each failure notes its request.
SHRINK = os.environ.get("TOOLNEXUS_FUZZ_SHRINK", "") == "1"
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    + ([Phase.shrink] if SHRINK else []),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# Placeholders hypothesis puts in bodies; replaced by the chosen target's ids when sending.
RID = "@@RID@@"
CALLS = ["call_refund", "call_email", "call_question"]


class RawBody(bytes):
    """A body sent exactly as generated (usually not JSON)."""


# -- strategies ------------------------------------------------------------------------------

# Values that break naive code: non-finite numbers (Python's json reads and writes them),
# integers past 64 bits, NUL and other control characters, markup.
MAGIC = [
    float("nan"),
    float("inf"),
    float("-inf"),
    2**63,
    -(2**63) - 1,
    10**30,
    "",
    " ",
    "\x00",
    "a\x00b",
    "\u2028",
    "<script>x</script>",
]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(MAGIC)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=8,
)


def field(*good: Any) -> st.SearchStrategy[Any]:
    """A known-good value often, anything at all otherwise."""
    return st.sampled_from(good) | JSON if good else JSON


CALL_DECISION = st.fixed_dictionaries(
    {},
    optional={
        "decision": field("approve", "output", "decline", ""),
        "input": field({"order": "A-1", "amount": 5}),
        "output": field("done by hand"),
        "is_error": field(True, False),
        "reason": field("no", "x" * 2001),
    },
)
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "runs": {
        "agent": field("demo", "nope", ""),
        "prompt": field("Refund order A-1001, $5", "  ", "x" * 20_001) | st.text(max_size=60),
    },
    "answer": {
        "id": field(RID, RID + "x"),
        "ok": field(True, False),
        "data": field({"output": "done"}, {"answers": {"Plan": "pro"}}, {"results": []}),
        "reason": field("no", "x" * 2001),
    },
    "approve": {
        "input": field({"order": "A-1", "amount": 5})
        | st.fixed_dictionaries({"order": JSON, "amount": JSON}),
        "output": field("done by hand", "x" * 100_001),
        "calls": st.dictionaries(
            st.sampled_from(CALLS) | st.text(max_size=8), CALL_DECISION, max_size=2
        )
        | JSON,
    },
    "decline": {"reason": field("no", "", "x" * 2001)},
    "cancel": {"reason": field("stop", "x" * 2001)},
    "retry": {},
}


def bodies(endpoint: str) -> st.SearchStrategy[Any]:
    shaped = st.fixed_dictionaries({}, optional=FIELDS[endpoint])
    with_extra = st.builds(
        lambda known, extra: {**extra, **known},
        shaped,
        st.dictionaries(st.text(max_size=8), JSON, min_size=1, max_size=2),
    )
    return st.one_of(shaped, shaped, with_extra, JSON, st.binary(max_size=64).map(RawBody))


CALLERS = st.sampled_from(["reviewer", "reviewer", "reviewer", "watcher", "anonymous", "session"])
# An id hypothesis invents: any text without "/" (a "/" makes another URL, not another id).
TEXT_IDS = st.text(min_size=1, max_size=30).filter(lambda s: "/" not in s)
REQUEST_IDS = st.sampled_from(["relay", "two", "question"]) | TEXT_IDS
RUN_IDS = (
    st.sampled_from(["failed", "pending"])
    | st.integers(min_value=-(2**70), max_value=2**70)
    | TEXT_IDS
)
QUERY_VALUES = (
    st.text(max_size=20)
    | st.integers(min_value=-(2**70), max_value=2**70).map(str)
    | st.sampled_from(["pending", "declined", "all", "", "tool_call", "demo", "0", "200"])
    | st.sampled_from(["9223372036854775807", "9223372036854775808", "1" + "0" * 30, "-1"])
    | st.sampled_from(["1e3", "NaN", "\x00", "a\x00", "true"])
)


def queries(keys: list[str]) -> st.SearchStrategy[dict[str, str]]:
    return st.fixed_dictionaries({}, optional={k: QUERY_VALUES for k in keys})


# -- the world ------------------------------------------------------------------------------


PROMPTS = {
    "relay": "Refund order A-1001, $250",
    "two": "Refund A-1002 $20 and email both",
    "question": "ask a question about plans",
}


class Targets:
    """A pending request of each kind and a failed and a pending run, replaced once used."""

    def __init__(self, user):
        self.user = user
        self.requests: dict[str, ApprovalRequest] = {}
        self.failed: Run | None = None

    def request(self, kind: str) -> ApprovalRequest:
        row = self.requests.get(kind)
        if row is None or not ApprovalRequest.objects.filter(pk=row.pk, state="pending").exists():
            run = start_and_halt(user=self.user, prompt=PROMPTS[kind])
            row = self.requests[kind] = run.requests.get(state="pending")
        return row

    def run(self, kind: str) -> Run:
        if kind == "pending":
            return self.request("relay").run
        if (
            self.failed is None
            or not Run.objects.filter(pk=self.failed.pk, status="failed").exists()
        ):
            run = services.run_start(agent="fuzz-broken", prompt="refund", started_by=self.user)
            store.run_claim(run_id=run.pk, worker_id="fuzz")
            store.run_fail(run_id=run.pk, worker_id="fuzz", error="ModelError: injected")
            self.failed = Run.objects.get(pk=run.pk)
        return self.failed


@pytest.fixture
def world():
    with registered_mock_agent("fuzz-broken", fail=True):
        reviewer = make_user(role="reviewer")
        watcher = make_user(role="watcher")
        session = Client(enforce_csrf_checks=True, raise_request_exception=False)
        session.force_login(reviewer)
        yield {
            "targets": Targets(reviewer),
            "headers": {"reviewer": bearer(reviewer), "watcher": bearer(watcher), "anonymous": {}},
            "session": session,
        }


# -- the properties ------------------------------------------------------------------------


@cache
def documented() -> dict[tuple[str, str], set[int]]:
    schema = api.get_openapi_schema()
    return {
        (method.upper(), path): {int(code) for code in op["responses"]}
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }


RESPONSES = {
    "RunOut": TypeAdapter(schemas.RunOut),
    "RequestOut": TypeAdapter(schemas.RequestOut),
    "RunPage": TypeAdapter(schemas.RunPage),
    "RequestPage": TypeAdapter(schemas.RequestPage),
    "Messages": TypeAdapter(list[dict[str, Any]]),
}


def call(world, caller: str, method: str, url: str, body: bytes | None = None):
    client = world["session"] if caller == "session" else Client(raise_request_exception=False)
    headers = world["headers"].get(caller, {})
    note(f"{caller} {method} {url} {body[:300] if body is not None else ''!r}")
    if method == "GET":
        return client.get(url, headers=headers)
    return client.post(url, data=body, content_type="application/json", headers=headers)


def check(response, operation: tuple[str, str], shape: str, before: dict[str, Any]) -> None:
    status = response.status_code
    note(f"-> {status} {response.content[:300]!r}")
    assert status < 500, f"{operation} answered {status}"
    assert status in documented()[operation], f"{operation}: {status} is not documented"
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    if status >= 400:
        assert isinstance(body, dict) and isinstance(body.get("detail"), str), body
        assert body["detail"], body
        assert snapshot() == before, f"{operation} answered {status} but changed the database"
    else:
        RESPONSES[shape].validate_python(body)


def encode(body: Any, replacements: dict[str, str]) -> bytes:
    if isinstance(body, RawBody):
        return bytes(body)
    text = json.dumps(body)
    for placeholder, value in replacements.items():
        text = text.replace(placeholder, value)
    return text.encode()


# -- POST endpoints ----------------------------------------------------------------------------


NAN = float("nan")


@FUZZ
@given(body=bodies("runs"), caller=CALLERS)
@example(body={"agent": "demo", "prompt": "refund a\x00b"}, caller="reviewer")
def test_fuzz_start_run(world, body, caller):
    before = snapshot()
    response = call(world, caller, "POST", "/api/runs", encode(body, {}))
    check(response, ("POST", "/api/runs"), "RunOut", before)


def decide(world, action: str, body: Any, target: str, caller: str) -> None:
    request_id = world["targets"].request(target).request_id if target in PROMPTS else target
    before = snapshot()
    url = f"/api/requests/{quote(request_id, safe='')}/{action}"
    response = call(world, caller, "POST", url, encode(body, {RID: request_id}))
    check(response, ("POST", f"/api/requests/{{request_id}}/{action}"), "RequestOut", before)


@FUZZ
@given(body=bodies("answer"), target=REQUEST_IDS, caller=CALLERS)
@example(body={"id": RID, "ok": True, "data": {"score": NAN}}, target="question", caller="reviewer")
def test_fuzz_answer(world, body, target, caller):
    decide(world, "answer", body, target, caller)


@FUZZ
@given(body=bodies("approve"), target=REQUEST_IDS, caller=CALLERS)
@example(body={"input": {"order": "A-1", "amount": NAN}}, target="relay", caller="reviewer")
def test_fuzz_approve(world, body, target, caller):
    decide(world, "approve", body, target, caller)


@FUZZ
@given(body=bodies("decline"), target=REQUEST_IDS, caller=CALLERS)
@example(body={"reason": "no\x00pe"}, target="relay", caller="reviewer")
def test_fuzz_decline(world, body, target, caller):
    decide(world, "decline", body, target, caller)


def run_action(world, action: str, body: Any, target: Any, caller: str) -> None:
    run_id = str(world["targets"].run(target).pk) if target in ("failed", "pending") else target
    before = snapshot()
    url = f"/api/runs/{quote(str(run_id), safe='')}/{action}"
    response = call(world, caller, "POST", url, b"" if body is None else encode(body, {}))
    check(response, ("POST", f"/api/runs/{{run_id}}/{action}"), "RunOut", before)


@FUZZ
@given(body=bodies("retry") | st.none(), target=RUN_IDS, caller=CALLERS)
def test_fuzz_retry(world, body, target, caller):
    run_action(world, "retry", body, target, caller)


@FUZZ
@given(body=bodies("cancel") | st.none(), target=RUN_IDS, caller=CALLERS)
def test_fuzz_cancel(world, body, target, caller):
    run_action(world, "cancel", body, target, caller)


# -- GET endpoints -----------------------------------------------------------------------------


@FUZZ
@given(params=queries(["state", "agent", "kind", "limit", "offset"]), caller=CALLERS)
@example(params={"offset": "9223372036854775808"}, caller="reviewer")
@example(params={"agent": "\x00"}, caller="reviewer")
def test_fuzz_list_requests(world, params, caller):
    world["targets"].request("relay")
    before = snapshot()
    response = call(world, caller, "GET", f"/api/requests?{urlencode(params)}")
    check(response, ("GET", "/api/requests"), "RequestPage", before)


@FUZZ
@given(params=queries(["status", "agent", "limit", "offset"]), caller=CALLERS)
@example(params={"offset": "9223372036854775808"}, caller="reviewer")
@example(params={"status": "\x00"}, caller="reviewer")
def test_fuzz_list_runs(world, params, caller):
    world["targets"].request("relay")
    before = snapshot()
    response = call(world, caller, "GET", f"/api/runs?{urlencode(params)}")
    check(response, ("GET", "/api/runs"), "RunPage", before)


@FUZZ
@given(target=REQUEST_IDS, caller=CALLERS)
@example(target="a\x00b", caller="reviewer")
def test_fuzz_read_request(world, target, caller):
    request_id = world["targets"].request(target).request_id if target in PROMPTS else target
    before = snapshot()
    response = call(world, caller, "GET", f"/api/requests/{quote(request_id, safe='')}")
    check(response, ("GET", "/api/requests/{request_id}"), "RequestOut", before)


@pytest.mark.parametrize(
    "suffix, shape", [("", "RunOut"), ("/messages", "Messages")], ids=["run", "messages"]
)
@FUZZ
@given(target=RUN_IDS, caller=CALLERS)
def test_fuzz_read_run(world, suffix, shape, target, caller):
    run_id = str(world["targets"].run(target).pk) if target in ("failed", "pending") else target
    before = snapshot()
    response = call(world, caller, "GET", f"/api/runs/{quote(str(run_id), safe='')}{suffix}")
    check(response, ("GET", f"/api/runs/{{run_id}}{suffix}"), shape, before)
