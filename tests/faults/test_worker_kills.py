"""kill -9 the worker at each step of a resume; a new worker finishes every run exactly once.

Each case starts a `faults` run through the API, waits until it halts, approves it through
the API (so relay executors run in the worker), and lets the agent SIGKILL its worker at one
point of the resume (the first time only). A new `db_worker` process then takes the run over
once its 3 s lease lapses. Every run must end `done` exactly once with a balanced transcript,
each side effect must have happened once (never re-run), and a tool the kill interrupted must
reach the model as "outcome unknown".
"""

from __future__ import annotations

import secrets

import pytest

from approvals.execution.runner import UNKNOWN_OUTCOME
from approvals.models import ApprovalRequest, Event, ToolExecution

from .agents import prompt_for
from .conftest import WAIT, assert_balanced, pending_request_id, start_run, tasks_for, wait_for

pytestmark = pytest.mark.faults

TOOLS = {"relay": ["pay", "ship", "stamp"], "gated": ["wipe", "stamp"]}
# Which tool's outcome the kill leaves unknown (it died inside that tool).
INTERRUPTED = {"executor": "pay", "gated": "wipe", "native": "stamp"}
CASES = [
    ("relay", "none"),
    ("relay", "executor"),  # inside a relay executor, after its side effect
    ("relay", "relay_turn"),  # executors recorded, transcript of the turn not stored
    ("relay", "model"),  # before the model call that follows the decided turn
    ("relay", "native"),  # inside a native tool, after its side effect
    ("relay", "native_turn"),  # native tool recorded, transcript of its turn not stored
    ("relay", "final"),  # final reply generated, result not stored
    ("gated", "gated"),  # inside an approval-gated tool run on resume
    ("gated", "gated_turn"),  # gated tool recorded, transcript not stored
]


@pytest.fixture(scope="module")
def app(stack):
    """One server and a worker slot the tests restart after each kill."""
    state = {"server": stack.server(), "worker": stack.worker()}
    yield state


def _worker(stack, app):
    if not app["worker"].alive():
        app["worker"] = stack.worker()
    return app["worker"]


@pytest.mark.parametrize(("flow", "kill"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_a_worker_killed_mid_resume_is_replaced_and_the_run_finishes_once(stack, app, flow, kill):
    worker = _worker(stack, app)
    tag = f"k{secrets.token_hex(4)}"
    with stack.client(app["server"]) as api:
        run_id = start_run(api, prompt_for(tag=tag, flow=flow, kill=kill))
        request_id = pending_request_id(stack, run_id)
        approved = api.post(f"/api/requests/{request_id}/approve", json={})
        assert approved.status_code == 200, approved.text

        if kill != "none":
            wait_for(lambda: not worker.alive(), f"the worker to die at {kill}")
            assert worker.popen.returncode == -9, worker.tail(30)
            assert stack.marker(f"killed-{tag}-{kill}").exists()
            assert stack.wait_status(run_id, {"running"}).status == "running"
            app["worker"] = stack.worker()  # a new process; the old one's lease lapses

        run = stack.wait_status(run_id, {"done", "failed", "incomplete", "cancelled"}, WAIT)
        assert run.status == "done", run.error
        api_view = api.get(f"/api/runs/{run_id}").json()
        assert api_view["status"] == "done" and api_view["pending"] is None

    alias = stack.db()
    events = list(Event.objects.using(alias).filter(run_id=run_id).order_by("created_at", "id"))
    actions = [e.action for e in events]
    assert actions.count("run_done") == 1, actions
    assert actions.count("request_approved") == 1, actions
    assert actions.count("run_resumed") == 1, actions
    assert actions.count("run_recovered") == (0 if kill == "none" else 1), actions
    assert tasks_for(stack, [run_id])[run_id] == (2 if kill == "none" else 3), actions

    request = ApprovalRequest.objects.using(alias).get(request_id=request_id)
    assert request.state == "approved" and request.applied_at is not None

    # the transcript: every call answered once, three model turns, one final reply
    assert_balanced(run.messages)
    assert sum(1 for m in run.messages if m.get("role") == "assistant") == 3
    outputs = {
        m["tool_call_id"].removeprefix("call_"): m["content"]
        for m in run.messages
        if m.get("role") == "tool"
    }
    assert sorted(outputs) == sorted(TOOLS[flow])

    # every side effect happened exactly once: none lost, none repeated
    effects = stack.effects()
    for tool in TOOLS[flow]:
        assert effects[(tag, tool)] == 1, (tool, effects)

    interrupted = INTERRUPTED.get(kill)
    for tool, output in outputs.items():
        if tool == interrupted:
            assert output == UNKNOWN_OUTCOME.format(name=tool), output
        else:
            assert "outcome is unknown" not in output, (tool, output)
            assert tag in output, (tool, output)
    # ... and the model read it: its final reply quotes every tool result it saw
    for tool, output in outputs.items():
        assert f"{tool}={output}" in run.text, run.text
    if interrupted:
        executions = ToolExecution.objects.using(alias).filter(run_id=run_id, tool_name=interrupted)
        assert [e.finished_at for e in executions] == [None]
