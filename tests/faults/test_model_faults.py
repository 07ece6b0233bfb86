"""The model endpoint misbehaving, through the real worker path (run_start -> task -> drain).

Each test's agent has a real `create_client` model (OpenAI- or Anthropic-style, retries=2,
retry_base_ms=1) whose HTTP goes to `httpx.MockTransport`: throttling, server errors, read
timeouts, truncated and wrong-shaped replies, unknown tools and broken arguments. Whatever
the endpoint does, the run ends readable (done, or failed with an error naming the cause),
its requests and decisions stay as they were decided, and a retry after the endpoint is
fixed completes the run with each decision applied exactly once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from django.test import Client

from approvals import agents, services
from approvals.agents.demo import demo_tools
from approvals.models import ApprovalRequest, Event, Run, ToolExecution
from tests.approvals.factories import bearer, drain, fresh, make_user, post_json
from toolnexus import create_client

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

AGENT = "faulty"
REFUND_ARGS = {"order": "B-7", "amount": 9}
REFUND_OUTPUT = "refund issued: $9 to order B-7"
RETRIES = 2
ATTEMPTS_PER_CALL = RETRIES + 1
DECISION_ACTIONS = [
    "request_approved",
    "request_answered",
    "request_declined",
    "request_expired",
    "request_cancelled",
]

# What each persistent fault must leave in the run's error, per wire style.
FAULT_TEXT = {
    "500": {"openai": "HTTP 500", "anthropic": "HTTP 500"},
    "timeout": {"openai": "ReadTimeout", "anthropic": "ReadTimeout"},
    "truncated": {"openai": "not valid JSON", "anthropic": "not valid JSON"},
    "shape": {"openai": "no choices[0].message", "anthropic": "no content list"},
}


# -- a model endpoint that misbehaves on demand ---------------------------------------------


def _fault(kind: str, style: str, request: httpx.Request) -> httpx.Response:
    if kind in ("429", "500", "401"):
        headers = {"Retry-After": "0"} if kind == "429" else {}
        return httpx.Response(
            int(kind), headers=headers, json={"error": {"message": f"fault {kind} injected"}}
        )
    if kind == "timeout":
        raise httpx.ReadTimeout("timed out reading the model's reply", request=request)
    if kind == "truncated":
        return httpx.Response(
            200,
            headers={"content-type": "application/json"},
            content=b'{"id": "cut", "choices": [{"index": 0, "message": {"role": "assis',
        )
    if kind == "shape":  # valid JSON, wrong shape
        body = (
            {"id": "x", "object": "chat.completion", "model": "m"}
            if style == "openai"
            else {"id": "x", "type": "message", "role": "assistant", "model": "m"}
        )
        return httpx.Response(200, json=body)
    raise AssertionError(f"unknown fault {kind}")


def results_in(body: dict[str, Any], style: str) -> list[tuple[str, str]]:
    """Every tool result the model was shown in one request body: (call id, text)."""
    found = []
    for m in body.get("messages", []):
        if style == "openai" and m.get("role") == "tool":
            found.append((m["tool_call_id"], m["content"]))
        elif style == "anthropic" and m.get("role") == "user" and isinstance(m["content"], list):
            found.extend(
                (b["tool_use_id"], b["content"])
                for b in m["content"]
                if isinstance(b, dict) and b.get("type") == "tool_result"
            )
    return found


def transcript_results(run: Run, style: str) -> list[tuple[str, str]]:
    return results_in({"messages": run.messages}, style)


class Endpoint:
    """An OpenAI- or Anthropic-style chat endpoint on `httpx.MockTransport`.

    First turn (no assistant message yet): the calls in `first_turn`, each (id, name,
    arguments; a str is sent as the raw argument text). Later turns: a final reply quoting the
    tool results of the last turn. Each HTTP attempt first takes the next entry of `faults`
    (None serves normally), then `always` applies while set.
    """

    def __init__(self, style: str):
        self.style = style
        self.first_turn: list[tuple[str, str, Any]] = [("call_1", "refund", REFUND_ARGS)]
        self.faults: list[str | None] = []
        self.always: str | None = None
        self.attempts = 0
        self.bodies: list[dict[str, Any]] = []
        self.executed: list[dict[str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        body = json.loads(request.content)
        self.bodies.append(body)
        fault = self.faults.pop(0) if self.faults else self.always
        if fault is not None:
            return _fault(fault, self.style, request)
        messages = body["messages"]
        if not any(m.get("role") == "assistant" for m in messages):
            return self._reply(tool_calls=self.first_turn)
        last = max(i for i, m in enumerate(messages) if m.get("role") == "assistant")
        seen = results_in({"messages": messages[last + 1 :]}, self.style)
        return self._reply(text="model read: " + " | ".join(text for _, text in seen))

    def _reply(self, *, text: str = "", tool_calls=()) -> httpx.Response:
        n = self.attempts
        if self.style == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if tool_calls:
                message["tool_calls"] = [
                    {
                        "id": cid,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": args if isinstance(args, str) else json.dumps(args),
                        },
                    }
                    for cid, name, args in tool_calls
                ]
            return httpx.Response(
                200,
                json={
                    "id": f"cmpl-{n}",
                    "object": "chat.completion",
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if tool_calls else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                },
            )
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        content += [
            {"type": "tool_use", "id": cid, "name": name, "input": args}
            for cid, name, args in tool_calls
        ]
        return httpx.Response(
            200,
            json={
                "id": f"msg-{n}",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": content,
                "stop_reason": "tool_use" if tool_calls else "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 2},
            },
        )

    def client(self, **options: Any):
        return create_client(
            base_url="http://model.invalid/v1",
            style=self.style,
            model="m",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handler)),
            retries=RETRIES,
            retry_base_ms=1,
            timeout=options.pop("timeout", 30),
            **options,
        )


def _register(endpoint: Endpoint, **client_options: Any) -> None:
    def refund(args: dict[str, Any]) -> str:
        endpoint.executed.append(dict(args))
        return f"refund issued: ${args['amount']} to order {args['order']}"

    agents.register(
        AGENT,
        model=lambda: endpoint.client(**client_options),
        tools=demo_tools,
        executors={"refund": refund},
        replace=True,
    )


@pytest.fixture(params=["openai", "anthropic"])
def style(request) -> str:
    return request.param


@pytest.fixture
def endpoint(style):
    ep = Endpoint(style)
    _register(ep)
    yield ep
    agents.unregister(AGENT)


@pytest.fixture
def user():
    return make_user(role="reviewer")


# -- helpers -------------------------------------------------------------------------------


def start(user) -> Run:
    run = services.run_start(agent=AGENT, prompt="Refund order B-7, $9", started_by=user)
    drain()
    return fresh(run)


def decision_events(run: Run) -> int:
    return Event.objects.filter(run=run, action__in=DECISION_ACTIONS).count()


def decided_fields(row: ApprovalRequest) -> dict[str, Any]:
    row.refresh_from_db()
    return {
        "state": row.state,
        "reason": row.reason,
        "decided_by": row.decided_by_id,
        "decided_at": row.decided_at,
        "calls": [
            (c.call_id, c.decision, c.edited_input, c.reason)
            for c in row.calls.order_by("position")
        ],
    }


def assert_failed_readably(run: Run, expected: str) -> None:
    assert run.status == "failed", (run.status, run.error)
    assert expected in run.error, run.error
    assert run.error.startswith("ModelError: "), run.error
    assert run.worker_id == "" and run.lease_expires_at is None
    assert run.finished_at is not None
    failed = Event.objects.filter(run=run, action="run_failed").order_by("-id").first()
    assert failed is not None and expected in failed.detail["error"]


# -- throttling ----------------------------------------------------------------------------


def test_throttled_with_retry_after_zero_then_served_completes(endpoint, user):
    endpoint.faults = ["429"]
    run = start(user)
    assert run.status == "pending", run.error
    assert endpoint.attempts == 2  # one 429, then the tool call
    request = run.requests.get()

    endpoint.faults = ["429", "429"]
    services.request_approve(request_id=request.request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert endpoint.attempts == 5  # two more 429s, then the final reply
    assert run.text == f"model read: {REFUND_OUTPUT}"
    assert run.error == ""
    assert endpoint.executed == [REFUND_ARGS]
    assert Event.objects.filter(run=run, action="run_failed").count() == 0


def test_throttled_past_the_retries_fails_naming_the_status(endpoint, user):
    endpoint.always = "429"
    run = start(user)
    assert_failed_readably(run, "HTTP 429")
    assert endpoint.attempts == ATTEMPTS_PER_CALL
    assert not run.requests.exists()


def test_a_client_error_is_not_retried(endpoint, user):
    endpoint.always = "401"
    run = start(user)
    assert_failed_readably(run, "HTTP 401")
    assert endpoint.attempts == 1


# -- persistent faults: on the first call and after a decision ------------------------------


@pytest.mark.parametrize("fault", sorted(FAULT_TEXT))
def test_fault_on_the_first_call_fails_readably_and_api_retry_completes(
    endpoint, style, user, fault
):
    endpoint.always = fault
    run = start(user)
    assert_failed_readably(run, FAULT_TEXT[fault][style])
    # A 500 is retried, then given up; a request the server read (timeout, truncated or
    # garbled reply) is never sent again: the model may have processed it.
    assert endpoint.attempts == (ATTEMPTS_PER_CALL if fault == "500" else 1)
    assert run.messages == []
    assert not run.requests.exists()
    assert not ToolExecution.objects.filter(run=run).exists()
    headers = bearer(user)
    shown = Client().get(f"/api/runs/{run.pk}", headers=headers).json()
    assert shown["status"] == "failed" and FAULT_TEXT[fault][style] in shown["error"]

    endpoint.always = None
    response = post_json(Client(), f"/api/runs/{run.pk}/retry", headers=headers)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued" and response.json()["error"] == ""
    drain()
    run = fresh(run)
    assert run.status == "pending", run.error
    services.request_approve(request_id=run.requests.get().request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert run.text == f"model read: {REFUND_OUTPUT}"
    assert endpoint.executed == [REFUND_ARGS]
    assert transcript_results(run, style) == [("call_1", REFUND_OUTPUT)]
    assert Event.objects.filter(run=run, action="run_retried").count() == 1


@pytest.mark.parametrize("decision", ["approve", "decline"])
@pytest.mark.parametrize("fault", sorted(FAULT_TEXT))
def test_fault_after_a_decision_keeps_it_and_retry_applies_it_once(
    endpoint, style, user, fault, decision
):
    run = start(user)
    assert run.status == "pending", run.error
    request = run.requests.get()
    if decision == "approve":
        services.request_approve(request_id=request.request_id, user=user)
        expected_output = REFUND_OUTPUT
    else:
        services.request_decline(request_id=request.request_id, user=user, reason="policy: no")
        expected_output = "relay declined for refund: policy: no"
    decided = decided_fields(request)
    before = endpoint.attempts

    # the resume's model call fails every time: the run fails, the decision stands
    endpoint.always = fault
    drain()
    run = fresh(run)
    assert_failed_readably(run, FAULT_TEXT[fault][style])
    assert endpoint.attempts == before + (ATTEMPTS_PER_CALL if fault == "500" else 1)
    assert decided_fields(request) == decided
    assert run.requests.count() == 1
    assert decision_events(run) == 1
    request.refresh_from_db()
    answer = request.answer
    assert answer is not None and answer["id"] == request.request_id
    applied = request.applied_at is not None
    # "applied" means the decision is in the stored transcript, never less and never twice
    assert transcript_results(run, style) == ([("call_1", expected_output)] if applied else [])
    assert len(endpoint.executed) == (1 if decision == "approve" else 0)

    # a retry while the endpoint is still broken fails again and changes nothing else
    services.run_retry(run_id=run.pk, user=user)
    drain()
    run = fresh(run)
    assert_failed_readably(run, FAULT_TEXT[fault][style])
    assert decided_fields(request) == decided
    assert len(endpoint.executed) == (1 if decision == "approve" else 0)

    # fixed: the retry completes with the decision applied exactly once
    endpoint.always = None
    if decision == "approve":
        services.run_retry(run_id=run.pk, user=user)
    else:
        response = post_json(Client(), f"/api/runs/{run.pk}/retry", headers=bearer(user))
        assert response.status_code == 200, response.content
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert run.text == f"model read: {expected_output}"
    assert transcript_results(run, style) == [("call_1", expected_output)]
    assert results_in(endpoint.bodies[-1], style) == [("call_1", expected_output)]
    assert len(endpoint.executed) == (1 if decision == "approve" else 0)
    assert ToolExecution.objects.filter(run=run).count() == (1 if decision == "approve" else 0)
    assert decided_fields(request) == decided
    request.refresh_from_db()
    assert request.answer == answer and request.applied_at is not None
    assert run.requests.count() == 1 and decision_events(run) == 1
    assert Event.objects.filter(run=run, action="run_retried").count() == 2


def test_fault_after_tool_results_were_recorded_continues_from_the_transcript(
    endpoint, style, user
):
    endpoint.first_turn = [("call_x", "x", {"a": 1})]
    endpoint.faults = [None]  # the first call is served, every later one fails
    endpoint.always = "500"
    run = start(user)
    assert_failed_readably(run, "HTTP 500")
    assert endpoint.attempts == 1 + ATTEMPTS_PER_CALL
    assert transcript_results(run, style) == [("call_x", "Unknown tool: x")]

    endpoint.always = None
    services.run_retry(run_id=run.pk, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert run.text == "model read: Unknown tool: x"
    assert transcript_results(run, style) == [("call_x", "Unknown tool: x")]
    assert results_in(endpoint.bodies[-1], style) == [("call_x", "Unknown tool: x")]
    assert [m["role"] for m in run.messages].count("assistant") == 2


DEADLINE = 2.0  # seconds for a whole execution: the stuck endpoint never answers in time


def test_a_run_past_its_deadline_fails_readably_and_retry_completes(style, user):
    endpoint = Endpoint(style)
    slow = {"on": True}

    async def handler(request: httpx.Request) -> httpx.Response:
        if slow["on"]:
            await asyncio.sleep(30)
        return endpoint.handler(request)

    def client():
        return create_client(
            base_url="http://model.invalid/v1",
            style=style,
            model="m",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
            retries=RETRIES,
            retry_base_ms=1,
            timeout=DEADLINE,
        )

    agents.register(AGENT, model=client, tools=demo_tools, replace=True)
    try:
        run = start(user)
        assert run.status == "failed"
        assert run.error.startswith("RunTimeout: "), run.error
        assert f"{DEADLINE}s deadline" in run.error, run.error
        slow["on"] = False
        services.run_retry(run_id=run.pk, user=user)
        drain()
        run = fresh(run)
        assert run.status == "pending", run.error
    finally:
        agents.unregister(AGENT)


# -- tool calls the toolkit cannot serve ------------------------------------------------------


def test_unknown_tool_is_reported_to_the_model_and_the_run_continues(endpoint, style, user):
    endpoint.first_turn = [("call_x", "x", {"a": 1})]
    run = start(user)
    assert run.status == "done", run.error
    assert run.text == "model read: Unknown tool: x"
    assert results_in(endpoint.bodies[-1], style) == [("call_x", "Unknown tool: x")]
    assert endpoint.attempts == 2
    assert not run.requests.exists()
    assert not ToolExecution.objects.filter(run=run).exists()


def test_unknown_tool_beside_a_relay_call_keeps_its_result_through_the_halt(endpoint, style, user):
    endpoint.first_turn = [("call_x", "x", {}), ("call_1", "refund", REFUND_ARGS)]
    run = start(user)
    assert run.status == "pending", run.error
    request = run.requests.get()
    assert [c.call_id for c in request.calls.all()] == ["call_1"]
    services.request_approve(request_id=request.request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    seen = results_in(endpoint.bodies[-1], style)
    assert sorted(seen) == [("call_1", REFUND_OUTPUT), ("call_x", "Unknown tool: x")]
    assert sorted(transcript_results(run, style)) == sorted(seen)
    assert endpoint.executed == [REFUND_ARGS]


@pytest.mark.parametrize(
    "arguments, problem",
    [("not json{", "are not valid JSON"), ([1, 2], "must be a JSON object, got list")],
    ids=["not-json", "json-array"],
)
def test_invalid_arguments_are_reported_to_the_model_and_the_run_continues(
    endpoint, style, user, arguments, problem
):
    endpoint.first_turn = [("call_1", "refund", arguments)]
    run = start(user)
    assert run.status == "done", run.error
    seen = results_in(endpoint.bodies[-1], style)
    assert len(seen) == 1 and seen[0][0] == "call_1"
    assert seen[0][1].startswith("invalid arguments for refund: "), seen
    assert problem in seen[0][1]
    assert run.text == f"model read: {seen[0][1]}"
    assert not run.requests.exists()  # nothing reaches a reviewer
    assert endpoint.executed == []
