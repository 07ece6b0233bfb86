"""The worker side: expiry, model failures and retry, crash recovery without double runs, and
the worker itself (the stock worker's loop and options, one event loop and one model client
for a worker's life)."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections
from django.utils import timezone
from django_tasks_db.compat import task_finished, task_started
from django_tasks_db.models import DBTaskResult

from approvals import agents, services
from approvals.agents.demo import demo_generate, demo_tools
from approvals.domain.exceptions import LeaseLost, NotAllowed
from approvals.execution import journal, recovery, runner, store
from approvals.execution import worker as worker_module
from approvals.execution.worker import Worker
from approvals.models import ApprovalRequest, Event, Run, ToolExecution
from toolnexus import Tool, ToolResult, create_client, create_in_process_client
from toolnexus.approval import approval_required
from toolnexus.relay import relay_tool

from .factories import (
    MockOpenAI,
    drain,
    fresh,
    lapse_lease,
    make_user,
    start_and_halt,
    tasks_for,
    tool_output,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _overdue(run: Run) -> ApprovalRequest:
    request = run.requests.get(state="pending")
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    return request


# -- expiry --------------------------------------------------------------------------------


def test_overdue_request_is_expired_by_the_service_and_the_run_reads_it():
    run = start_and_halt()
    request = _overdue(run)
    not_due = start_and_halt(prompt="refund A-9 $9")
    ApprovalRequest.objects.filter(run=not_due).update(
        expires_at=timezone.now() + timedelta(hours=1)
    )
    assert recovery.requests_expire_overdue() == 1
    request.refresh_from_db()
    assert request.state == "expired"
    assert request.reason == "expired"
    assert request.decided_by is None and request.decided_at is not None
    assert request.answer == {"id": request.request_id, "ok": False, "reason": "expired"}
    assert fresh(run).status == "queued"
    assert not_due.requests.get().state == "pending"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: expired"
    assert "expired" in run.text
    assert recovery.requests_expire_overdue() == 0  # nothing twice
    assert Event.objects.filter(run=run, action="request_expired").count() == 1


def test_expire_requests_command():
    run = start_and_halt()
    request = _overdue(run)
    out = io.StringIO()
    call_command("expire_requests", stdout=out)
    assert "expired 1 request" in out.getvalue()
    request.refresh_from_db()
    assert request.state == "expired" and request.reason == "expired"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "relay declined for refund: expired"


def test_expired_approval_request_reaches_the_model_and_nothing_runs():
    run = start_and_halt(prompt="delete the account")
    _overdue(run)
    recovery.requests_expire_overdue()
    drain()
    run = fresh(run)
    output = tool_output(run, "call_delete")
    assert "expired" in output and "scheduled" not in output
    assert not ToolExecution.objects.filter(run=run).exists()


def test_worker_maintenance_expires_overdue_requests():
    run = start_and_halt()
    request = _overdue(run)
    Worker(maintenance_every=0).maintenance()
    request.refresh_from_db()
    assert request.state == "expired"


def test_request_ttl_setting_sets_an_expiry(settings):
    settings.TOOLNEXUS_REQUEST_TTL_SECONDS = 60
    run = start_and_halt()
    request = run.requests.get()
    assert request.expires_at is not None
    assert timezone.now() < request.expires_at <= timezone.now() + timedelta(seconds=61)
    assert request.wire["expiresAt"].endswith("Z")


def test_decided_request_is_not_expired_later():
    user = make_user()
    run = start_and_halt(user=user)
    request = _overdue(run)
    services.request_decline(request_id=request.request_id, user=user, reason="no")
    assert recovery.requests_expire_overdue() == 0
    request.refresh_from_db()
    assert request.state == "declined" and request.reason == "no"


# -- model failure and retry ---------------------------------------------------------------


def test_model_failure_fails_the_run_readably_and_retry_completes(mock_model):
    user = make_user()
    mock_model.fail = True
    run = services.run_start(agent="remote", prompt="refund B-7", started_by=user)
    drain()
    run = fresh(run)
    assert run.status == "failed"
    assert "500" in run.error or "exploded" in run.error
    assert run.finished_at is not None and run.worker_id == ""
    assert Event.objects.filter(run=run, action="run_failed").count() == 1

    mock_model.fail = False
    services.run_retry(run_id=run.pk, user=user)
    run = fresh(run)
    assert run.status == "queued" and run.error == ""
    drain()
    run = fresh(run)
    assert run.status == "pending"
    request = run.requests.get()
    assert request.calls.get().input == {"order": "B-7", "amount": 9}
    services.request_approve(request_id=request.request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert run.text == "model read: refund issued: $9 to order B-7"
    assert run.attempts == 3


def test_failure_during_resume_keeps_the_decision_and_retry_applies_it(mock_model):
    user = make_user()
    run = services.run_start(agent="remote", prompt="refund B-7", started_by=user)
    drain()
    request = fresh(run).requests.get()
    services.request_decline(request_id=request.request_id, user=user, reason="policy")

    mock_model.fail = True
    drain()
    run = fresh(run)
    assert run.status == "failed"
    assert run.error
    request.refresh_from_db()
    assert request.state == "declined" and request.reason == "policy"
    assert run.requests.count() == 1
    # "applied" means the decision is in the stored transcript, never less
    if request.applied_at is not None:
        assert tool_output(run, "call_1") == "relay declined for refund: policy"

    mock_model.fail = False
    services.run_retry(run_id=run.pk, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_1") == "relay declined for refund: policy"
    assert run.text == "model read: relay declined for refund: policy"
    request.refresh_from_db()
    assert request.applied_at is not None


def test_failure_during_approved_resume_does_not_run_the_executor_again(mock_model):
    user = make_user()
    ran: list[dict] = []

    def executor(args):
        ran.append(args)
        return f"paid {args['amount']}"

    agents.register(
        "remote",
        model=mock_model.client,
        tools=demo_tools,
        executors={"refund": executor},
        replace=True,
    )
    run = services.run_start(agent="remote", prompt="refund", started_by=user)
    drain()
    request = fresh(run).requests.get()
    services.request_approve(request_id=request.request_id, user=user)
    mock_model.fail = True
    drain()
    assert fresh(run).status == "failed"
    assert len(ran) == 1
    mock_model.fail = False
    services.run_retry(run_id=run.pk, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert len(ran) == 1
    assert tool_output(run, "call_1") == "paid 9"
    assert ToolExecution.objects.filter(run=run).count() == 1


def test_unreachable_model_fails_readably():
    agents.register(
        "unreachable",
        model=lambda: create_client(
            base_url="http://127.0.0.1:9", style="openai", model="x", retries=0
        ),
        tools=demo_tools,
        replace=True,
    )
    try:
        run = services.run_start(agent="unreachable", prompt="hi", started_by=make_user())
        drain()
        run = fresh(run)
        assert run.status == "failed"
        assert "unreachable" in run.error.lower() or "connect" in run.error.lower()
    finally:
        agents.unregister("unreachable")


def test_retry_needs_permission(mock_model):
    mock_model.fail = True
    run = services.run_start(agent="remote", prompt="x", started_by=make_user())
    drain()
    with pytest.raises(NotAllowed):
        services.run_retry(run_id=run.pk, user=make_user(role="watcher"))
    assert fresh(run).status == "failed"


def test_unregistered_agent_fails_the_run():
    run = start_and_halt()
    user = make_user()
    Run.objects.filter(pk=run.pk).update(agent="gone")
    services.request_decline(request_id=run.requests.get().request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "failed"
    assert "gone" in run.error


# -- crash safety --------------------------------------------------------------------------


class WorkerKilled(BaseException):
    """Stands in for SIGKILL: nothing in the app catches it, so nothing gets cleaned up."""


TOOL_RUNS: list[dict] = []


def _count_tool(args, ctx):
    TOOL_RUNS.append(dict(args))
    return ToolResult(f"counted {args.get('n')}")


def _crash_agent_model(request):
    messages = request.messages
    if not any(m.get("role") == "assistant" for m in messages):
        return {
            "content": "",
            "tool_calls": [{"id": "call_count", "name": "count", "arguments": {"n": 1}}],
        }
    results = [m["content"] for m in messages if m.get("role") == "tool"]
    return {"content": "saw: " + " | ".join(results)}


@pytest.fixture
def crash_agent():
    """`crashy`: a plain native tool `count` and an approval-gated `gated_count`."""
    TOOL_RUNS.clear()

    def tools():
        plain = Tool("count", "count a call", {"type": "object"}, execute=_count_tool)
        gated = approval_required(
            Tool("gated_count", "count after approval", {"type": "object"}, execute=_count_tool)
        )
        return [plain, gated]

    agents.register(
        "crashy",
        model=lambda: create_in_process_client(generate=_crash_agent_model),
        tools=tools,
        replace=True,
    )
    yield
    agents.unregister("crashy")
    TOOL_RUNS.clear()


def _kill_once(monkeypatch, name: str, *, when=lambda: True) -> list[bool]:
    """Make the worker's write <name> (its store or journal) raise WorkerKilled the first
    time `when()` holds."""
    module = journal if hasattr(journal, name) else store
    real = getattr(module, name)
    killed: list[bool] = []

    def wrapper(*args, **kwargs):
        if not killed and when():
            killed.append(True)
            raise WorkerKilled(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return killed


def _kill_model_once(agent: str, generate, *, when) -> list[bool]:
    """Re-register `agent` with a model that "kills" the worker the first time `when()`
    holds while the model is being called."""
    killed: list[bool] = []

    def dying(request):
        if not killed and when():
            killed.append(True)
            raise WorkerKilled("model call")
        return generate(request)

    agent_def = agents.get(agent)
    agents.register(
        agent,
        model=lambda: create_in_process_client(generate=dying),
        tools=agent_def.tools,
        executors=agent_def.executors,
        replace=True,
    )
    return killed


def _kill_at(monkeypatch, step: str, agent: str, generate, *, when) -> list[bool]:
    if step == "model call":
        return _kill_model_once(agent, generate, when=when)
    return _kill_once(monkeypatch, step, when=when)


def _drain_and_die() -> None:
    """drain() while the worker "dies": WorkerKilled escapes the run's code, and the stock
    worker records it on the task row (as it does any exception) and carries on."""
    drain()
    (killed,) = DBTaskResult.objects.filter(exception_class_path__endswith=".WorkerKilled")
    assert killed.status == "FAILED"


def _recover(run: Run) -> None:
    lapse_lease(run)
    assert recovery.runs_recover_stale() == 1
    assert fresh(run).status == "queued"
    drain()


@pytest.mark.parametrize("step", ["model call", "run_store_result"])
def test_killed_after_a_native_tool_ran_it_is_not_run_again(crash_agent, monkeypatch, step):
    killed = _kill_at(
        monkeypatch, step, "crashy", _crash_agent_model, when=lambda: len(TOOL_RUNS) > 0
    )
    run = services.run_start(agent="crashy", prompt="count once", started_by=make_user())
    _drain_and_die()
    assert killed and len(TOOL_RUNS) == 1
    run = fresh(run)
    assert run.status == "running" and run.worker_id  # the dead worker still "holds" it
    assert recovery.runs_recover_stale() == 0  # its lease has not lapsed yet

    _recover(run)
    run = fresh(run)
    assert run.status == "done", run.error
    assert len(TOOL_RUNS) == 1
    assert ToolExecution.objects.filter(run=run, call_id="call_count").count() == 1
    assert tool_output(run, "call_count") == "counted 1"
    assert run.text == "saw: counted 1"
    assert Event.objects.filter(run=run, action="run_recovered").count() == 1


def test_killed_while_a_native_tool_was_running_reports_an_unknown_outcome(
    crash_agent, monkeypatch
):
    killed = _kill_once(monkeypatch, "execution_finish")
    run = services.run_start(agent="crashy", prompt="count", started_by=make_user())
    _drain_and_die()
    assert killed and len(TOOL_RUNS) == 1
    _recover(run)
    run = fresh(run)
    assert run.status == "done", run.error
    assert len(TOOL_RUNS) == 1  # unknown outcome: never silently re-run
    output = tool_output(run, "call_count")
    assert "outcome is unknown" in output
    assert output == runner.UNKNOWN_OUTCOME.format(name="count")


def test_killed_after_an_approved_gated_tool_ran_it_is_not_run_again(crash_agent, monkeypatch):
    def gated_model(request):
        if not any(m.get("role") == "assistant" for m in request.messages):
            return {
                "content": "",
                "tool_calls": [{"id": "call_g", "name": "gated_count", "arguments": {"n": 2}}],
            }
        return {"content": "saw: " + request.messages[-1]["content"]}

    agents.register(
        "crashy",
        model=lambda: create_in_process_client(generate=gated_model),
        tools=agents.get("crashy").tools,
        replace=True,
    )
    user = make_user()
    run = start_and_halt(agent="crashy", prompt="gated", user=user)
    request = run.requests.get()
    assert request.kind == "approval" and TOOL_RUNS == []
    services.request_approve(request_id=request.request_id, user=user)

    _kill_model_once("crashy", gated_model, when=lambda: len(TOOL_RUNS) > 0)
    _drain_and_die()
    assert len(TOOL_RUNS) == 1
    _recover(run)
    run = fresh(run)
    assert run.status == "done", run.error
    assert len(TOOL_RUNS) == 1
    assert tool_output(run, "call_g") == "counted 2"
    assert ToolExecution.objects.filter(run=run).count() == 1


def test_two_gated_calls_in_one_turn_are_approved_one_after_the_other(crash_agent):
    def two_gated(request):
        if not any(m.get("role") == "assistant" for m in request.messages):
            return {
                "content": "",
                "tool_calls": [
                    {"id": "call_a", "name": "gated_count", "arguments": {"n": 1}},
                    {"id": "call_b", "name": "gated_count", "arguments": {"n": 2}},
                ],
            }
        results = [m["content"] for m in request.messages if m.get("role") == "tool"]
        return {"content": "saw: " + " | ".join(results)}

    agents.register(
        "crashy",
        model=lambda: create_in_process_client(generate=two_gated),
        tools=agents.get("crashy").tools,
        replace=True,
    )
    user = make_user()
    run = start_and_halt(agent="crashy", prompt="two", user=user)
    first = run.requests.get()
    assert first.data["callId"] == "call_a"
    services.request_approve(request_id=first.request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "pending"
    second = run.requests.get(state="pending")
    assert second.pk != first.pk and second.data["callId"] == "call_b"
    assert TOOL_RUNS == [{"n": 1}]
    first.refresh_from_db()
    assert first.applied_at is not None
    services.request_decline(request_id=second.request_id, user=user, reason="one is enough")
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert TOOL_RUNS == [{"n": 1}]
    assert tool_output(run, "call_a") == "counted 1"
    assert "one is enough" in tool_output(run, "call_b")
    assert ToolExecution.objects.filter(run=run).count() == 1


EXECUTOR_RUNS: list[dict] = []


def _refund_executor(args):
    EXECUTOR_RUNS.append(dict(args))
    return f"paid {args['amount']}"


@pytest.fixture
def relay_agent():
    EXECUTOR_RUNS.clear()
    agents.register(
        "relayer",
        model=lambda: create_in_process_client(generate=demo_generate),
        tools=lambda: [
            relay_tool(
                "refund",
                "refund",
                {
                    "type": "object",
                    "properties": {"order": {"type": "string"}, "amount": {"type": "number"}},
                    "required": ["order", "amount"],
                },
            )
        ],
        executors={"refund": _refund_executor},
        replace=True,
    )
    yield
    agents.unregister("relayer")
    EXECUTOR_RUNS.clear()


@pytest.mark.parametrize(
    "step", ["execution_finish", "request_store_answer", "model call", "run_store_result"]
)
def test_killed_after_a_relay_executor_ran_recovery_does_not_run_it_again(
    relay_agent, monkeypatch, step
):
    user = make_user()
    run = start_and_halt(agent="relayer", prompt="Refund A-4004 $44", user=user)
    request = run.requests.get()
    services.request_approve(request_id=request.request_id, user=user)
    _kill_at(monkeypatch, step, "relayer", demo_generate, when=lambda: len(EXECUTOR_RUNS) > 0)
    _drain_and_die()
    assert EXECUTOR_RUNS == [{"order": "A-4004", "amount": 44}]

    _recover(run)
    run = fresh(run)
    assert run.status == "done", run.error
    assert len(EXECUTOR_RUNS) == 1
    assert ToolExecution.objects.filter(run=run, call_id="call_refund").count() == 1
    output = tool_output(run, "call_refund")
    if step in ("execution_finish", "request_store_answer"):
        # The executor's result and the answer built from it commit together: killed before
        # that commit, the call ran but its outcome is unknown (never run again).
        assert "outcome is unknown" in output
    else:
        assert output == "paid 44"
    request.refresh_from_db()
    assert request.applied_at is not None


def test_a_run_is_executed_by_one_worker_at_a_time():
    user = make_user()
    run = services.run_start(agent="demo", prompt="refund", started_by=user)
    claimed = store.run_claim(run_id=run.pk, worker_id="w1")
    assert claimed is not None and claimed.status == "running"
    assert store.run_claim(run_id=run.pk, worker_id="w2") is None
    assert runner.drive(run.pk) == "skipped"
    lapse_lease(run)
    taken = store.run_claim(run_id=run.pk, worker_id="w2")
    assert taken is not None and taken.worker_id == "w2"
    assert Event.objects.filter(run=run, action="run_taken_over").count() == 1


def test_lost_lease_does_not_overwrite_the_new_workers_result():
    user = make_user()
    run = services.run_start(agent="demo", prompt="refund", started_by=user)
    store.run_claim(run_id=run.pk, worker_id="old")
    lapse_lease(run)
    store.run_claim(run_id=run.pk, worker_id="new")
    with pytest.raises(LeaseLost):
        store.run_checkpoint(run_id=run.pk, worker_id="old", messages=[])
    store.run_fail(run_id=run.pk, worker_id="old", error="late failure")
    run = fresh(run)
    assert run.status == "running" and run.worker_id == "new" and run.error == ""


def test_drain_marks_task_rows_finished():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    (task,) = tasks_for(run)
    assert task.status == "READY"
    assert drain() == 1
    (task,) = tasks_for(run)
    assert task.status == "SUCCESSFUL"
    assert task.return_value == "pending"
    assert drain() == 0


def test_a_steps_outcome_finishes_its_task_row_in_the_same_commit(monkeypatch):
    """The worker's task row ends with the run's outcome: no commit of its own after it, so a
    worker killed after the outcome's commit cannot leave the row "running"."""
    stock_finishes: list[object] = []
    monkeypatch.setattr(DBTaskResult, "set_successful", lambda row, rv: stock_finishes.append(rv))
    finished: list[tuple[str, object]] = []

    def on_finished(sender, task_result, **kwargs):
        finished.append((task_result.status, task_result.return_value))

    task_finished.connect(on_finished)
    try:
        run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
        assert drain() == 1
    finally:
        task_finished.disconnect(on_finished)
    (task,) = tasks_for(run)
    assert (task.status, task.return_value) == ("SUCCESSFUL", "pending")
    assert task.finished_at is not None and fresh(run).status == "pending"
    assert stock_finishes == []  # the stock finish had nothing left to write
    assert finished == [("SUCCESSFUL", "pending")]  # its signal still says how it ended


def test_the_run_is_claimed_in_the_task_rows_claim_and_a_claim_never_taken_is_handed_back():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())

    def receiver_fails(sender, task_result, **kwargs):
        raise RuntimeError("a task_started receiver failed")

    task_started.connect(receiver_fails)
    try:
        assert drain() == 1
    finally:
        task_started.disconnect(receiver_fails)
    (task,) = tasks_for(run)
    assert task.status == "FAILED"  # the task never started
    run = fresh(run)
    # Claimed with the task row, before the task failed to start: held, but no longer renewed.
    assert run.status == "running" and run.worker_id in store._forgotten
    assert Event.objects.filter(run=run, action="run_claimed").count() == 1
    _recover(run)
    assert fresh(run).status == "pending"


def test_a_step_that_ends_without_an_outcome_keeps_the_stock_finish():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    store.run_claim(run_id=run.pk, worker_id="someone-else")  # held elsewhere: skipped
    assert drain() == 1
    (task,) = tasks_for(run)
    assert (task.status, task.return_value) == ("SUCCESSFUL", "skipped")


# -- the stock worker, one event loop, one model client ------------------------------------------


def _wait(check, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)
    return value


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
        _wait(lambda: worker._idle_wait in worker_module._idle_waits, "the worker to start")
        yield worker, loop
    finally:
        worker.stop.set()
        served.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def _status(run: Run, *statuses: str) -> Run | None:
    run = fresh(run)
    return run if run.status in statuses else None


@pytest.fixture
def loop_agent():
    """`looper`: the demo's model and tools; records the loop of every model call, every
    client its factory builds, and every client closed."""
    seen: dict[str, list] = {"loops": [], "built": [], "closed": []}

    def generate(request):
        seen["loops"].append(asyncio.get_running_loop())
        return demo_generate(request)

    def model():
        client = create_in_process_client(generate=generate, model="looper")
        seen["built"].append(client)
        close = client.backend.aclose

        async def aclose():
            seen["closed"].append(client)
            await close()

        client.backend.aclose = aclose
        return client

    agents.register("looper", model=model, tools=demo_tools, replace=True)
    yield seen
    agents.unregister("looper")


def test_a_worker_drives_every_run_and_resume_on_its_one_loop_with_one_client(loop_agent):
    user = make_user()
    with serving() as (_, loop):
        runs = [
            services.run_start(agent="looper", prompt=f"Refund order A-{n}, ${n}", started_by=user)
            for n in (1, 2)
        ]
        for run in runs:
            _wait(lambda run=run: _status(run, "pending"), f"run {run.pk} to halt")
            request = run.requests.get()
            services.request_decline(request_id=request.request_id, user=user, reason="no")
            _wait(lambda run=run: _status(run, "done"), f"run {run.pk} to finish")
        assert loop_agent["closed"] == []  # kept while the worker runs
    # Four drives (two runs, two resumes), every model call on the worker's loop ...
    assert len(loop_agent["loops"]) == 4
    assert all(seen is loop for seen in loop_agent["loops"])
    # ... through the one client the agent's factory built for it, closed when it stopped.
    assert len(loop_agent["built"]) == 1
    assert loop_agent["closed"] == loop_agent["built"]
    for run in runs:
        assert tool_output(fresh(run), "call_refund") == "relay declined for refund: no"


def test_each_run_gets_its_own_system_prompt_on_the_kept_client(loop_agent):
    agents.register(
        "looper",
        model=agents.get("looper").model,
        tools=demo_tools,
        system_prompt="the agent's prompt",
        replace=True,
    )
    user = make_user()
    first = services.run_start(agent="looper", prompt="a question", started_by=user)
    second = services.run_start(agent="looper", prompt="a question", started_by=user)
    Run.objects.filter(pk=second.pk).update(system_prompt="this run's prompt")
    with serving():
        for run in (first, second):
            _wait(lambda run=run: _status(run, "pending", "done"), f"run {run.pk}")
    assert fresh(first).messages[0] == {"role": "system", "content": "the agent's prompt"}
    assert fresh(second).messages[0] == {"role": "system", "content": "this run's prompt"}
    (kept,) = loop_agent["built"]
    assert kept.system_prompt == "the agent's prompt" and kept.hooks is None


class _Socket(ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def socket_model():
    """`socketed`: MockOpenAI's replies over a real loopback socket; the client port of
    every request is recorded (one port: one connection, reused)."""
    model = MockOpenAI(tool="refund", tool_input={"order": "S-1", "amount": 3})
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            ports.append(self.client_address[1])
            reply = model.handler(httpx.Request("POST", "http://model/", content=body))
            self.send_response(reply.status_code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        def log_message(self, *args) -> None:
            pass

    server = _Socket(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    agents.register(
        "socketed",
        model=lambda: create_client(base_url=url, style="openai", model="x", retries=0),
        tools=demo_tools,
        replace=True,
    )
    yield ports
    agents.unregister("socketed")
    server.shutdown()
    server.server_close()


def test_the_model_connection_outlives_a_run_in_a_worker(socket_model):
    user = make_user()
    with serving():
        runs = [
            services.run_start(agent="socketed", prompt="refund", started_by=user) for _ in (1, 2)
        ]
        for run in runs:
            _wait(lambda run=run: _status(run, "pending"), f"run {run.pk} to halt")
            request = run.requests.get()
            services.request_decline(request_id=request.request_id, user=user, reason="no")
            _wait(lambda run=run: _status(run, "done"), f"run {run.pk} to finish")
    assert len(socket_model) == 4  # two runs, two resumes: four model calls ...
    assert len(set(socket_model)) == 1  # ... over one connection


def test_drain_outside_a_worker_builds_and_closes_a_client_per_run(loop_agent):
    start_and_halt(agent="looper")
    start_and_halt(agent="looper", prompt="refund A-2 $2")
    assert len(loop_agent["built"]) == 2
    assert loop_agent["closed"] == loop_agent["built"]


def test_an_enqueue_wakes_an_idle_worker_and_stop_ends_it_at_once():
    user = make_user()
    with serving(interval=60):
        time.sleep(0.2)  # idle: waiting out a 60 s poll
        started = time.monotonic()
        run = services.run_start(agent="demo", prompt="refund A-1 $1", started_by=user)
        _wait(lambda: _status(run, "pending"), "the run to halt", timeout=5)
        assert time.monotonic() - started < 5
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 3  # `serving` returned: the worker has stopped


def test_the_worker_sends_the_stock_task_signals():
    started, finished = [], []

    def on_started(sender, task_result, **kwargs):
        started.append(task_result.id)

    def on_finished(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
        drain()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    (task,) = tasks_for(run)
    assert started == [str(task.id)]
    assert [(str(i), str(s)) for i, s in finished] == [(str(task.id), "SUCCESSFUL")]


def test_db_worker_takes_the_stock_options():
    user = make_user()
    runs = [services.run_start(agent="demo", prompt="refund", started_by=user) for _ in (1, 2)]
    out = io.StringIO()
    call_command("db_worker", "--batch", "--queue-name", "elsewhere", stdout=out)
    assert "ran 0 task(s)" in out.getvalue()
    out = io.StringIO()
    call_command("db_worker", "--batch", "--max-tasks", "1", "--worker-id", "w-one", stdout=out)
    assert "ran 1 task(s)" in out.getvalue()
    out = io.StringIO()
    call_command("db_worker", "--batch", "--queue-name", "*", "--exclude-queues", "x", stdout=out)
    assert "ran 1 task(s)" in out.getvalue()
    assert {fresh(run).status for run in runs} == {"pending"}
    assert ["w-one"] in [t.worker_ids for run in runs for t in tasks_for(run)]
    with pytest.raises(CommandError, match="exclude-queues"):
        call_command("db_worker", "--batch", "--exclude-queues", "x", stdout=io.StringIO())


def test_a_long_worker_id_still_holds_its_runs():
    worker = Worker(maintenance_every=0, worker_id="w" * 64)
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    held: list[str] = []
    real = store.run_store_result

    def spy(**kwargs):
        held.append(kwargs["worker_id"])
        return real(**kwargs)

    store.run_store_result = spy
    try:
        assert worker.drain() == 1
    finally:
        store.run_store_result = real
    assert fresh(run).status == "pending"
    assert held and all(len(h) <= 64 and h.startswith("w" * 51 + ":") for h in held)


def test_a_step_cancelled_at_shutdown_goes_back_to_the_queue_and_carries_on_later():
    """`serve` cancels a step still running when its shutdown grace is over: the run is queued
    again from its last checkpoint, not failed; the next worker finishes it."""
    generating = threading.Event()

    async def stuck(request):
        generating.set()
        await asyncio.sleep(60)

    agents.register(
        "stuck", model=lambda: create_in_process_client(generate=stuck), tools=[], replace=True
    )
    try:
        run = services.run_start(agent="stuck", prompt="hi", started_by=make_user())
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        worker = Worker(maintenance_every=0, interval=0.05)
        served = asyncio.run_coroutine_threadsafe(worker.serve(), loop)
        assert generating.wait(10)
        worker.stop.set()
        served.cancel()  # what `start_on_daphne` does once the grace is over
        _wait(lambda: worker._idle_wait not in worker_module._idle_waits, "the worker to stop")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()

        run = fresh(run)
        assert run.status == "queued" and run.worker_id == "" and run.error == ""
        actions = list(Event.objects.filter(run=run).values_list("action", flat=True))
        assert "run_requeued" in actions and "run_failed" not in actions
        assert sorted((t.status, t.return_value) for t in tasks_for(run)) == [
            ("READY", None),
            ("SUCCESSFUL", "requeued"),
        ]
        agents.register(
            "stuck",
            model=lambda: create_in_process_client(generate=lambda r: {"content": "later"}),
            tools=[],
            replace=True,
        )
        assert drain() == 1
        run = fresh(run)
        assert run.status == "done" and run.text == "later"
    finally:
        agents.unregister("stuck")


# -- the step's own writes inside a tool call are not tool failures ----------------------------


def _in_another_connection(fn) -> None:
    def target():
        try:
            fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()


def _register_counting_agent(name: str, model) -> None:
    agents.register(
        name,
        model=lambda: create_in_process_client(generate=model),
        tools=lambda: [Tool("count", "count a call", {"type": "object"}, execute=_count_tool)],
        replace=True,
    )


def test_a_run_cancelled_during_a_model_call_stops_before_its_tools_run(crash_agent):
    model_calls: list[int] = []
    state: dict[str, int] = {}

    def model(request):
        model_calls.append(1)
        if len(model_calls) == 1:  # cancelled elsewhere while the model answers
            _in_another_connection(
                lambda: Run.objects.filter(pk=state["run"]).update(
                    status="cancelled", worker_id="", lease_expires_at=None
                )
            )
        return {
            "content": "",
            "tool_calls": [{"id": f"c{len(model_calls)}", "name": "count", "arguments": {}}],
        }

    _register_counting_agent("crashy", model)
    run = services.run_start(agent="crashy", prompt="go", started_by=make_user())
    state["run"] = run.pk
    # The lease is gone when the transcript is stored before the tool: the step ends there,
    # it does not hand the model "tool count failed: LeaseLost" and call it again.
    assert runner.drive(run.pk) == "lease lost"
    assert len(model_calls) == 1 and TOOL_RUNS == []
    assert fresh(run).status == "cancelled"


def test_a_database_error_before_a_tool_runs_fails_the_step_not_the_tool(crash_agent, monkeypatch):
    real = store.run_checkpoint
    failed: list[bool] = []

    def fails_once(**kwargs):
        if not failed:
            failed.append(True)
            raise OperationalError("couldn't get a connection after 5.00 sec")
        return real(**kwargs)

    monkeypatch.setattr(store, "run_checkpoint", fails_once)
    user = make_user()
    run = services.run_start(agent="crashy", prompt="go", started_by=user)
    assert drain() == 1
    run = fresh(run)
    assert run.status == "failed" and "OperationalError" in run.error
    assert TOOL_RUNS == []  # the model never read a made-up tool failure
    services.run_retry(run_id=run.pk, user=user)
    drain()
    run = fresh(run)
    assert run.status == "done", run.error
    assert TOOL_RUNS == [{"n": 1}] and run.text == "saw: counted 1"


def test_a_task_enqueued_with_keyword_arguments_is_claimed_and_finished_too():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    DBTaskResult.objects.all().delete()
    runner.execute_run.enqueue(run_id=run.pk)
    other = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    assert drain() == 2
    assert fresh(run).status == "pending" and fresh(other).status == "pending"
    assert sorted(t.status for t in DBTaskResult.objects.all()) == ["SUCCESSFUL", "SUCCESSFUL"]


def test_a_batch_worker_renews_its_runs_leases_during_a_long_step(settings):
    settings.TOOLNEXUS_RUN_LEASE_SECONDS = 3  # the heartbeat renews every second
    leases: list[object] = []
    state: dict[str, int] = {}

    def lease_now() -> None:
        _in_another_connection(
            lambda: leases.append(Run.objects.get(pk=state["run"]).lease_expires_at)
        )

    def slow_model(request):
        lease_now()
        time.sleep(1.8)
        lease_now()
        return {"content": "done"}

    agents.register(
        "slow", model=lambda: create_in_process_client(generate=slow_model), replace=True
    )
    try:
        run = services.run_start(agent="slow", prompt="take your time", started_by=make_user())
        state["run"] = run.pk
        Worker(batch=True, maintenance_every=0).run()
    finally:
        agents.unregister("slow")
    assert fresh(run).status == "done"
    before, during = leases
    assert before is not None and during > before  # renewed while the model answered
