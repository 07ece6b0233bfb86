"""approvals.execution.journal: a worker killed after a tool or a relay executor ran, at any
write of its step, never runs it again once the run is recovered; killed while one was
running, its outcome is reported as unknown, not re-run."""

from __future__ import annotations

import pytest
from django_tasks_db.models import DBTaskResult

from approvals import agents, services
from approvals.agents.demo import demo_generate
from approvals.execution import journal, recovery, runner, store
from approvals.models import Event, ToolExecution
from toolnexus import create_in_process_client
from toolnexus.relay import relay_tool

from .factories import TOOL_RUNS, drain, fresh, make_user, start_and_halt, tool_output
from .factories import crash_agent_model as _crash_agent_model
from .factories import recover_stale_run as _recover

pytestmark = pytest.mark.django_db(transaction=True)


class WorkerKilled(BaseException):
    """Stands in for SIGKILL: nothing in the app catches it, so nothing gets cleaned up."""


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
