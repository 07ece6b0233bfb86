"""approvals.execution.runner: a model failure fails the run readably and a retry carries on
(the decision kept, an executor never run twice); approval-gated calls are decided one after
the other; a step cancelled at shutdown goes back to the queue; the step's own writes inside
a tool call are not tool failures."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.db import OperationalError

from approvals import agents, services
from approvals.agents.demo import demo_tools
from approvals.execution import runner, store
from approvals.execution import worker as worker_module
from approvals.execution.worker import Worker
from approvals.models import Event, Run, ToolExecution
from toolnexus import Tool, create_client, create_in_process_client

from .factories import TOOL_RUNS, drain, fresh, make_user, start_and_halt, tasks_for, tool_output
from .factories import count_tool as _count_tool
from .factories import in_another_connection as _in_another_connection
from .factories import wait_until as _wait

pytestmark = pytest.mark.django_db(transaction=True)


# -- model failure and retry -------------------------------------------------------------------


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


def test_unregistered_agent_fails_the_run():
    run = start_and_halt()
    user = make_user()
    Run.objects.filter(pk=run.pk).update(agent="gone")
    services.request_decline(request_id=run.requests.get().request_id, user=user)
    drain()
    run = fresh(run)
    assert run.status == "failed"
    assert "gone" in run.error


# -- approval-gated calls, and a step cut short at shutdown ------------------------------------


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
