"""A testing kit for projects that use the app: agents with scripted models, runs started
until they halt, decisions, the worker drained inline, pushes recorded.

    from approvals import testing
    from toolnexus.relay import relay_tool

    def test_refund_needs_a_human(db):
        with testing.scripted_agent(
            "support",
            testing.call("refund", order="A-1", amount=5),  # turn 1: the model calls refund
            "Done: {results}",  # turn 2: it reads what the tool returned
            tools=[relay_tool("refund", "refund an order")],
            executors={"refund": lambda args: f"refunded {args['order']}"},
        ):
            run = testing.start_and_halt(agent="support", prompt="refund A-1")
            assert run.status == "pending"
            run = testing.approve(run)
            assert run.status == "done" and "refunded A-1" in run.text

Works on Django's default test databases (in-memory SQLite included): the worker runs in
the test's own thread (`drain`), and pushes are sent from commit hooks, no threads. The
pytest plugin (`pytest_plugins = ["approvals.testing.pytest_plugin"]` in a conftest.py) adds
fixtures around these helpers.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from unittest import mock

from django.contrib.auth import get_user_model
from django.db import connection

from toolnexus import (
    InProcessRequest,
    InProcessResponse,
    InProcessToolCall,
    Tool,
    create_in_process_client,
)

from .. import agents, services
from ..execution.worker import DeliveryWorker, Worker
from ..live import publisher
from ..models import ApprovalRequest, Run
from ..permissions import ensure_groups

__all__ = [
    "Pushes",
    "ScriptedModel",
    "ScriptedTeam",
    "approve",
    "call",
    "decide",
    "decline",
    "deliver_webhooks",
    "drain",
    "make_user",
    "record_pushes",
    "register_scripted_agent",
    "register_scripted_team",
    "reply",
    "scripted_agent",
    "scripted_agents",
    "scripted_team",
    "start",
    "start_and_halt",
]

_names = itertools.count(1)


# -- users ---------------------------------------------------------------------------------


def make_user(
    *,
    role: str = "reviewer",
    username: str | None = None,
    password: str | None = None,
    is_staff: bool = False,
):
    """A user of the app. role: "reviewer" (the Reviewers group: view, decide, start runs),
    "watcher" (Watchers: view only), "nobody" (no permissions), "superuser". The groups are
    made if missing. Returned fresh from the database (no cached permissions)."""
    if role not in ("reviewer", "watcher", "nobody", "superuser"):
        raise ValueError(f"role must be reviewer, watcher, nobody or superuser, not {role!r}")
    groups = ensure_groups()
    User = get_user_model()
    name = username or f"{role}{next(_names)}"
    if role == "superuser":
        user = User.objects.create_superuser(username=name, password=password)
    else:
        user = User.objects.create_user(username=name, password=password, is_staff=is_staff)
    if role == "reviewer":
        user.groups.add(groups["Reviewers"])
    elif role == "watcher":
        user.groups.add(groups["Watchers"])
    return User.objects.get(pk=user.pk)


# -- a scripted model ------------------------------------------------------------------------


def call(name: str, id: str | None = None, **arguments: Any) -> InProcessToolCall:
    """One tool call in a scripted turn: `call("refund", order="A-1", amount=5)`."""
    return InProcessToolCall(id or f"call_{name}", name, arguments)


def reply(text: str, **usage: int) -> InProcessResponse:
    """A final reply (no tool calls)."""
    return InProcessResponse(content=text, usage=usage or None)


Turn = (
    str
    | InProcessToolCall
    | Iterable[InProcessToolCall]
    | InProcessResponse
    | Callable[[InProcessRequest], InProcessResponse]
)


class ScriptedModel:
    """A model that plays `turns` in order, one per model call of a run: the n-th call (n =
    assistant messages so far in the transcript) gets the n-th turn, so a run resumed in
    another process, with a fresh client, continues the script where it halted.

    A turn is a reply text (`"{results}"` in it is replaced by the tool results of the
    turn before, joined with " | "), a `call(...)` or a list of them (one model turn with
    several tool calls), an `InProcessResponse`, or a function of the request. Past the last
    turn the model replies "done"."""

    def __init__(self, *turns: Turn, name: str = "scripted") -> None:
        self.turns = list(turns)
        self.name = name
        self.requests: list[InProcessRequest] = []  # every call it answered, in order

    def generate(self, request: InProcessRequest) -> InProcessResponse:
        self.requests.append(request)
        messages = request.messages
        index = sum(1 for m in messages if m.get("role") == "assistant")
        turn: Turn = self.turns[index] if index < len(self.turns) else "done"
        if isinstance(turn, InProcessResponse):
            return turn
        if callable(turn):
            return turn(request)
        if isinstance(turn, str):
            return InProcessResponse(content=turn.replace("{results}", _last_results(messages)))
        calls = [turn] if isinstance(turn, InProcessToolCall) else list(turn)
        return InProcessResponse(tool_calls=calls)

    def client(self):
        """The model factory `agents.register(model=...)` takes."""
        return create_in_process_client(generate=self.generate, model=self.name)


def _last_results(messages: list[dict[str, Any]]) -> str:
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    results = [m for m in messages[last + 1 :] if m.get("role") == "tool"]
    return " | ".join(str(m.get("content") or "") for m in results)


def register_scripted_agent(
    name: str,
    *turns: Turn,
    tools: Iterable[Tool] | Callable[[], Iterable[Tool]] = (),
    executors: dict[str, Callable[[dict[str, Any]], Any]] | None = None,
    **options: Any,
) -> ScriptedModel:
    """Register (or replace) agent `name` whose model plays `turns` (see ScriptedModel);
    `options` go to `agents.register` (system_prompt, description, allow_typed_output).
    Returns the model: its `requests` show what the agent's model was asked."""
    model = ScriptedModel(*turns, name=name)
    agents.register(
        name,
        model=model.client,
        tools=tools,
        executors=executors,
        replace=True,
        **options,
    )
    return model


@contextmanager
def scripted_agent(name: str, *turns: Turn, **options: Any) -> Iterator[ScriptedModel]:
    """`register_scripted_agent` for the length of a `with` block; after it, the agent that
    had the name before (a project's own, overridden for a test) is back, or none."""
    with scripted_agents() as register:
        yield register(name, *turns, **options)


@contextmanager
def scripted_agents() -> Iterator[Callable[..., ScriptedModel]]:
    """`register(name, *turns, **options)` (as `register_scripted_agent`) for the length of a
    `with` block, as often as needed; after it each name is as it was before the first."""
    before: dict[str, agents.Agent | None] = {}

    def register(name: str, *turns: Turn, **options: Any) -> ScriptedModel:
        before.setdefault(name, agents.get(name))
        return register_scripted_agent(name, *turns, **options)

    try:
        yield register
    finally:
        for name, previous in before.items():
            agents.restore(name, previous)


# -- runs, decisions, the worker -----------------------------------------------------------


def drain(max_tasks: int = 1000) -> int:
    """Run every queued task (runs to start, decisions to apply) in this thread, as a
    worker would, until none is left; returns how many ran."""
    with _keeping_the_test_connection():
        return Worker(maintenance_every=0).drain(max_tasks)


def deliver_webhooks(max_tasks: int = 1000) -> int:
    """Turn the host events so far into webhook deliveries and send every one that is due,
    in this thread, as the delivery worker would; returns how many attempts ran. Events are
    handed out TOOLNEXUS_EVENTS_SETTLE_SECONDS after they happen: set it to 0 in tests."""
    with _keeping_the_test_connection():
        worker = DeliveryWorker(maintenance_every=0)
        worker.maintenance()
        return worker.drain(max_tasks)


@contextmanager
def _keeping_the_test_connection() -> Iterator[None]:
    """The stock worker loop checks for stale connections between tasks, as a request does;
    inside a test's transaction (pytest-django's `db`, Django's TestCase) the connection is
    not in autocommit mode, which that check takes for a broken one and closes: the test's
    transaction would be gone. Django's test client skips the check the same way."""
    if not connection.in_atomic_block:
        yield
        return
    from django_tasks_db.management.commands import db_worker

    with mock.patch.object(db_worker, "close_old_connections", lambda **kwargs: None):
        yield


def start(*, agent: str, prompt: str, user=None, run_worker: bool = True) -> Run:
    """Start a run of `agent` as `user` (default: a new reviewer) and, with `run_worker`,
    drive it to its first stop (pending, done or failed). Returns the run, fresh."""
    user = user if user is not None else make_user()
    run = services.run_start(agent=agent, prompt=prompt, started_by=user)
    if run_worker:
        drain()
    run.refresh_from_db()
    return run


def start_and_halt(*, agent: str, prompt: str, user=None) -> Run:
    """Start a run of `agent` (one of the project's, or a scripted one) and drive it until
    it halts on a request (or stops otherwise: check `run.status`, "pending" when it waits
    for a decision)."""
    return start(agent=agent, prompt=prompt, user=user)


def _pending_request(target: Run | ApprovalRequest | str) -> ApprovalRequest:
    if isinstance(target, ApprovalRequest):
        return target
    if isinstance(target, Run):
        row = target.requests.filter(state=ApprovalRequest.State.PENDING).first()
        if row is None:
            raise AssertionError(f"run {target.pk} has no pending request ({target.status})")
        return row
    return ApprovalRequest.objects.get(request_id=target)


def decide(
    target: Run | ApprovalRequest | str,
    decision: str = "approve",
    *,
    user=None,
    reason: str = "",
    input: Any = None,
    output: Any = None,
    calls: dict[str, dict[str, Any]] | None = None,
    run_worker: bool = True,
) -> Run:
    """Decide a run's pending request (or a request, or a request id) as `user` (default: a
    new reviewer): "approve" (with edited `input`, a typed `output`, or per-call `calls`) or
    "decline" (with `reason`). With `run_worker` the run resumes at once (`drain`). Returns
    the run, fresh."""
    row = _pending_request(target)
    user = user if user is not None else make_user()
    if decision == "approve":
        services.request_approve(
            request_id=row.request_id, user=user, input=input, output=output, calls=calls
        )
    elif decision == "decline":
        services.request_decline(request_id=row.request_id, user=user, reason=reason)
    else:
        raise ValueError(f'decision must be "approve" or "decline", not {decision!r}')
    if run_worker:
        drain()
    return Run.objects.get(pk=row.run_id)


def approve(target: Run | ApprovalRequest | str, **options: Any) -> Run:
    return decide(target, "approve", **options)


def decline(target: Run | ApprovalRequest | str, reason: str = "", **options: Any) -> Run:
    return decide(target, "decline", reason=reason, **options)


# -- pushes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Push:
    group: str  # "approvals.inbox", "approvals.run.<id>", "approvals.user.<id>"
    message: dict[str, Any]

    @property
    def type(self) -> str:
        return self.message.get("type", "")


class Pushes:
    """The live pushes sent while recording (`record_pushes`), in order. Each is sent to the
    channel layer as usual too, so open pages still get it."""

    def __init__(self) -> None:
        self.sent: list[Push] = []
        self._changed = threading.Condition()
        self._hooks_from = 0

    def _add(self, group: str, message: dict[str, Any]) -> None:
        with self._changed:
            self.sent.append(Push(group, json.loads(json.dumps(message, default=str))))
            self._changed.notify_all()

    def matching(self, *, type: str | None = None, group: str | None = None) -> list[Push]:
        return [
            p
            for p in list(self.sent)
            if (type is None or p.type == type) and (group is None or p.group == group)
        ]

    def wait(
        self,
        count: int = 1,
        *,
        type: str | None = None,
        group: str | None = None,
        timeout: float = 5.0,
    ) -> list[Push]:
        """The matching pushes once there are at least `count` (AssertionError after
        `timeout` seconds). In a test inside a transaction (pytest-django's default), the
        commit hooks queued so far run first: that is when pushes are sent."""
        self.run_commit_hooks()
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(found := self.matching(type=type, group=group)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"expected {count} push(es) (type={type}, group={group}) within "
                        f"{timeout} s; sent: {[(p.group, p.type) for p in self.sent]}"
                    )
                self._changed.wait(left)
        return found

    def run_commit_hooks(self) -> None:
        """Run the on-commit callbacks this thread's connection queued since recording began
        (as Django's captureOnCommitCallbacks(execute=True) does): inside a test's
        transaction they would never run. Outside one, commits ran them already."""
        if not connection.in_atomic_block:
            return
        while len(connection.run_on_commit) > self._hooks_from:
            _, callback, robust = connection.run_on_commit[self._hooks_from]
            self._hooks_from += 1
            if robust:
                with suppress(Exception):
                    callback()
            else:
                callback()


class _RecordingLayer:
    def __init__(self, layer: Any, pushes: Pushes) -> None:
        self._layer = layer
        self._pushes = pushes

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self._pushes._add(group, message)
        await self._layer.group_send(group, message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


@contextmanager
def record_pushes() -> Iterator[Pushes]:
    """Record every live push the app sends inside the block (from any thread)."""
    pushes = Pushes()
    pushes._hooks_from = len(connection.run_on_commit) if connection.in_atomic_block else 0
    real = publisher.get_channel_layer

    def recording(*args: Any, **kwargs: Any) -> Any:
        layer = real(*args, **kwargs)
        return None if layer is None else _RecordingLayer(layer, pushes)

    publisher.get_channel_layer = recording
    try:
        yield pushes
    finally:
        publisher.get_channel_layer = real


from .teams import ScriptedTeam, register_scripted_team, scripted_team  # noqa: E402
