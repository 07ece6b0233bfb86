"""Small factories and helpers for app tests. The ones a host project needs too (make_user,
drain, start_and_halt) live in the app's testing kit, approvals.testing, and are re-exported
here."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals import selectors, services, testing
from approvals.execution import recovery
from approvals.execution import worker as worker_module
from approvals.execution.worker import Worker
from approvals.live import publisher
from approvals.models import ApprovalRequest, Event, Run
from approvals.selectors import InboxQuery
from approvals.testing import drain, make_user
from toolnexus import ToolResult, create_client
from toolnexus_web.asgi import application

REFUND_PROMPT = "Refund order A-1001, $120"


def start_and_halt(*, prompt: str = REFUND_PROMPT, agent: str = "demo", user=None) -> Run:
    """The kit's start_and_halt with this project's demo agent and a refund by default."""
    return testing.start_and_halt(agent=agent, prompt=prompt, user=user)


def fresh(run: Run) -> Run:
    run.refresh_from_db()
    return run


def tool_messages(run: Run) -> list[dict[str, Any]]:
    return [m for m in run.messages if m.get("role") == "tool"]


def tool_output(run: Run, call_id: str) -> str:
    """The content of the (single) tool result for `call_id` in the stored transcript."""
    found = [m["content"] for m in tool_messages(run) if m.get("tool_call_id") == call_id]
    assert len(found) == 1, f"expected one result for {call_id}, got {found!r}"
    return found[0]


def tasks_for(run: Run) -> list[DBTaskResult]:
    """Every task row (any status) that drives `run`."""
    return [t for t in DBTaskResult.objects.all() if t.args_kwargs.get("args") == [run.pk]]


def run_actions(run) -> list[str]:
    """The audit events of `run`, oldest first, by action."""
    return list(Event.objects.filter(run=run).order_by("id").values_list("action", flat=True))


def lapse_lease(run: Run) -> None:
    """Pretend the worker holding `run` died long ago (test-only direct update)."""
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))


# -- triage inbox: requests made directly, reads, claims -------------------------------------

_ids = iter(range(1, 1_000_000))


def make_request(
    *,
    prompt: str = "Refund order A-1",
    agent: str = "demo",
    kind: str = "tool_call",
    tool: str = "refund",
    arguments: str | None = None,
    input: dict | None = None,
    expires_in: timedelta | None = None,
    age: timedelta = timedelta(0),
    run_prompt: str = "",
) -> ApprovalRequest:
    """A pending request made directly (no model turn), `age` old, with one call."""
    n = next(_ids)
    input = input if input is not None else {"order": f"A-{n}", "amount": 5}
    run = Run.objects.create(agent=agent, prompt=run_prompt or prompt, status="pending")
    if kind == "tool_call":
        data = {
            "calls": [{"id": f"c{n}", "name": tool, "input": input, "arguments": arguments or ""}]
        }
    elif kind == "approval":
        data = {"callId": f"c{n}", "tool": tool, "input": input, "arguments": arguments or ""}
    else:
        data = None
    row = ApprovalRequest.objects.create(
        run=run,
        agent=agent,
        request_id=f"req-{n}",
        kind=kind,
        prompt=prompt,
        data=data,
        expires_at=timezone.now() + expires_in if expires_in is not None else None,
    )
    if data is not None:
        row.calls.create(position=0, call_id=f"c{n}", tool_name=tool, input=input)
    if age:
        ApprovalRequest.objects.filter(pk=row.pk).update(created_at=timezone.now() - age)
        row.refresh_from_db()
    return row


def halted_request(prompt: str, starter) -> ApprovalRequest:
    """The pending request of a demo run started by `starter` with `prompt`."""
    return start_and_halt(prompt=prompt, user=starter).requests.get()


def ids(rows) -> list[str]:
    return [r.request_id for r in rows]


def inbox(user, **query) -> list[str]:
    return ids(selectors.inbox_requests(InboxQuery(**query), user_id=user.pk))


def counts(user, **query) -> dict[str, int]:
    return selectors.inbox_counts(InboxQuery(**query), user_id=user.pk)


def claim(row: ApprovalRequest, user, *, minutes_ago: float = 0) -> None:
    """Test-only: put a claim on the row directly, `minutes_ago` old."""
    ApprovalRequest.objects.filter(pk=row.pk).update(
        claimed_by=user, claimed_at=timezone.now() - timedelta(minutes=minutes_ago)
    )


# -- HTTP ----------------------------------------------------------------------------------


def session_client(user=None, **kwargs) -> Client:
    client = Client(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


def bearer(user) -> dict[str, str]:
    token, _ = services.api_token_create(user=user, name="tests")
    return {"Authorization": f"Bearer {token}"}


def post_json(client: Client, path: str, data: Any = None, *, headers=None, raw=None):
    body = raw if raw is not None else json.dumps({} if data is None else data)
    return client.post(path, data=body, content_type="application/json", headers=headers or {})


# -- a model endpoint on httpx.MockTransport ------------------------------------------------


class MockOpenAI:
    """An OpenAI-compatible endpoint served by `httpx.MockTransport` (no socket).

    First turn: one call of `tool` with `tool_input`. Later turns: a final reply quoting every
    tool result of the last turn. `fail = True` makes every call answer HTTP 500.
    """

    def __init__(self, *, tool: str = "refund", tool_input: dict[str, Any] | None = None):
        self.tool = tool
        self.tool_input = tool_input or {"order": "A-1", "amount": 5}
        self.fail = False
        self.calls = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.fail:
            return httpx.Response(500, json={"error": {"message": "model backend exploded"}})
        messages = json.loads(request.content)["messages"]
        if not any(m.get("role") == "assistant" for m in messages):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": self.tool, "arguments": json.dumps(self.tool_input)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            results = [m["content"] for m in messages if m.get("role") == "tool"]
            message = {"role": "assistant", "content": "model read: " + " | ".join(results)}
            finish = "stop"
        return httpx.Response(
            200,
            json={
                "id": f"cmpl-{self.calls}",
                "object": "chat.completion",
                "model": "x",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            },
        )

    def client(self):
        return create_client(
            base_url="http://model.invalid/v1",
            style="openai",
            model="x",
            retries=0,
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(self.handler)),
        )


@contextmanager
def registered_mock_agent(
    name: str, *, tool_input: dict[str, Any] | None = None, fail: bool = False
):
    """Register agent `name`: a `MockOpenAI` model that calls the demo's `refund` relay tool
    (executor included) with `tool_input`; yields the model, unregisters the agent after."""
    from approvals import agents
    from approvals.agents.demo import demo_tools, issue_refund

    model = MockOpenAI(tool="refund", tool_input=tool_input)
    model.fail = fail
    agents.register(
        name,
        model=model.client,
        tools=demo_tools,
        executors={"refund": issue_refund},
        replace=True,
    )
    try:
        yield model
    finally:
        agents.unregister(name)


# -- the worker side: expiry, crashes, a served worker ---------------------------------------


def make_overdue(run: Run) -> ApprovalRequest:
    """The pending request of `run`, its expiry a minute ago."""
    request = run.requests.get(state="pending")
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    return request


def recover_stale_run(run: Run) -> None:
    """The lease of `run`'s dead worker lapses, maintenance queues the run again, and a
    worker drives it."""
    lapse_lease(run)
    assert recovery.runs_recover_stale() == 1
    assert fresh(run).status == "queued"
    drain()


TOOL_RUNS: list[dict] = []  # every call of `count_tool` (the `crash_agent` fixture clears it)


def count_tool(args, ctx):
    TOOL_RUNS.append(dict(args))
    return ToolResult(f"counted {args.get('n')}")


def crash_agent_model(request):
    """One call of `count` first, then a reply quoting the tool results."""
    messages = request.messages
    if not any(m.get("role") == "assistant" for m in messages):
        return {
            "content": "",
            "tool_calls": [{"id": "call_count", "name": "count", "arguments": {"n": 1}}],
        }
    results = [m["content"] for m in messages if m.get("role") == "tool"]
    return {"content": "saw: " + " | ".join(results)}


def in_another_connection(fn) -> None:
    """Run `fn` in a thread of its own, on a database connection of its own."""

    def target():
        try:
            fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()


def wait_until(check, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)
    return value


def run_in_status(run: Run, *statuses: str) -> Run | None:
    run = fresh(run)
    return run if run.status in statuses else None


@contextmanager
def serving(**options):
    """A Worker served on an event loop of its own in another thread, as a `db_worker`
    process runs it (`run_forever`), with the loop visible to the test: (worker, loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-worker-loop", daemon=True)
    thread.start()
    worker = Worker(**{"maintenance_every": 0, "interval": 0.05, **options})
    served = asyncio.run_coroutine_threadsafe(worker.serve(), loop)
    try:
        wait_until(lambda: worker._idle_wait in worker_module._idle_waits, "the worker to start")
        yield worker, loop
    finally:
        worker.stop.set()
        served.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


# -- live pages: websockets through the real ASGI stack -------------------------------------
# Sockets talk to `toolnexus_web.asgi.application` with the session cookie of a logged-in
# test client; the tests that use them ask for the `in_memory_layer` fixture (conftest.py).

TIMEOUT = 5  # seconds for any single frame
CSRF_SECRET = "a" * 32  # the browser's CSRF cookie: a 32-character secret


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def signed_in_client(user) -> tuple[Client, str]:
    client = Client()
    client.force_login(user)
    return client, client.cookies["sessionid"].value


async def communicator(path: str, user=None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        cookie = await database_sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}; csrftoken={CSRF_SECRET}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def open_socket(path: str, user) -> tuple[WebsocketCommunicator, str]:
    """Connect (must be accepted) and return the communicator and its first frame."""
    comm = await communicator(path, user)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected, f"{path} refused {user}"
    snapshot = await comm.receive_from(timeout=TIMEOUT)
    return comm, snapshot


async def socket_for_session(path: str, session: str) -> WebsocketCommunicator:
    headers = [
        (b"origin", b"http://testserver"),
        (b"host", b"testserver"),
        (b"cookie", f"sessionid={session}; csrftoken={CSRF_SECRET}".encode()),
    ]
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await comm.connect(timeout=TIMEOUT)
    assert connected
    await comm.receive_from(timeout=TIMEOUT)  # the snapshot
    return comm


async def user_of(role: str):
    return await database_sync_to_async(make_user)(role=role)


async def in_thread(fn, *args, **kwargs):
    """Run `fn` (writes, drain) in a thread; its pushes are sent when its commits are."""
    return await database_sync_to_async(fn)(*args, **kwargs)


def pending_request(run: Run) -> ApprovalRequest:
    return run.requests.get(state="pending")


async def halted_run(
    user, prompt: str = "Refund order A-1001, $250"
) -> tuple[Run, ApprovalRequest]:
    run = await in_thread(start_and_halt, prompt=prompt, user=user)
    row = await database_sync_to_async(pending_request)(run)
    return run, row


async def frame_with(comm: WebsocketCommunicator, text: str) -> str:
    """The next frame holding `text` (presence and count frames may come first)."""
    while text not in (frame := await comm.receive_from(timeout=TIMEOUT)):
        pass
    return frame


def request_event(row: ApprovalRequest, *, change: str = "test", **fields) -> dict:
    """The publisher's message about `row`, as it goes through the channel layer."""
    message = publisher.request_message(row, created=False, change=change)
    return {**message, **fields}
