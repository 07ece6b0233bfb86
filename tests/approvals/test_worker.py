"""The worker side: expiry, model failures and retry, crash recovery without double runs."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals import agents, services
from approvals.agents.demo import demo_generate, demo_tools
from approvals.domain.exceptions import LeaseLost, NotAllowed
from approvals.execution import journal, recovery, runner, store
from approvals.execution.worker import Worker
from approvals.models import ApprovalRequest, Event, Run, ToolExecution
from toolnexus import Tool, ToolResult, create_client, create_in_process_client
from toolnexus.approval import approval_required
from toolnexus.relay import relay_tool

from .factories import (
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


def _recover(run: Run) -> None:
    lapse_lease(run)
    assert recovery.runs_recover_stale() == 1
    assert fresh(run).status == "queued"
    drain()


@pytest.mark.parametrize("step", ["run_checkpoint", "run_store_result"])
def test_killed_after_a_native_tool_ran_it_is_not_run_again(crash_agent, monkeypatch, step):
    killed = _kill_once(monkeypatch, step, when=lambda: len(TOOL_RUNS) > 0)
    run = services.run_start(agent="crashy", prompt="count once", started_by=make_user())
    with pytest.raises(WorkerKilled):
        drain()
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
    with pytest.raises(WorkerKilled):
        drain()
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

    _kill_once(monkeypatch, "run_checkpoint", when=lambda: len(TOOL_RUNS) > 0)
    with pytest.raises(WorkerKilled):
        drain()
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
    "step", ["execution_finish", "request_store_answer", "run_checkpoint", "run_store_result"]
)
def test_killed_after_a_relay_executor_ran_recovery_does_not_run_it_again(
    relay_agent, monkeypatch, step
):
    user = make_user()
    run = start_and_halt(agent="relayer", prompt="Refund A-4004 $44", user=user)
    request = run.requests.get()
    services.request_approve(request_id=request.request_id, user=user)
    _kill_once(monkeypatch, step, when=lambda: len(EXECUTOR_RUNS) > 0)
    with pytest.raises(WorkerKilled):
        drain()
    assert EXECUTOR_RUNS == [{"order": "A-4004", "amount": 44}]

    _recover(run)
    run = fresh(run)
    assert run.status == "done", run.error
    assert len(EXECUTOR_RUNS) == 1
    assert ToolExecution.objects.filter(run=run, call_id="call_refund").count() == 1
    output = tool_output(run, "call_refund")
    if step == "execution_finish":
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
