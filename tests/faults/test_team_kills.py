"""kill -9 the worker at each point of a team run's resume cascade; a new worker finishes it.

A `faults-team` run (tests/faults/agents.py) halts on its payer sub-agent's relayed `pay`
(the request climbs to the root, `data.path` names the payer); it is approved through the
API, and the worker SIGKILLs itself at one point of the cascade (the first time only): in
the executor, in the payer's native tool, after the payer's final reply, after the
coordinator's. A new `db_worker` takes the run over once its 3 s lease lapses and drives the
step again from the stored runtime state. The run ends `done` once; no handle is started
twice (one payer, one id); every side effect happened once; a tool the kill interrupted
reaches the payer as "outcome unknown" and the coordinator reads the payer's final text.
"""

from __future__ import annotations

import secrets

import pytest

from approvals.execution.runner import UNKNOWN_OUTCOME
from approvals.models import ApprovalRequest, Event, ToolExecution

from .agents import TEAM_AGENT, prompt_for
from .conftest import WAIT, pending_request_id, start_run, wait_for

pytestmark = pytest.mark.faults

PAYER = "root/coordinator.1/payer.1"
KILLS = ["none", "executor", "native", "child_final", "final"]
INTERRUPTED = {"executor": "pay", "native": "stamp"}


@pytest.fixture(scope="module")
def app(stack):
    return {"server": stack.server(), "worker": stack.worker()}


@pytest.mark.parametrize("kill", KILLS)
def test_a_worker_killed_mid_cascade_is_replaced_and_the_team_run_finishes_once(stack, app, kill):
    if not app["worker"].alive():
        app["worker"] = stack.worker()
    worker = app["worker"]
    tag = f"t{secrets.token_hex(4)}"
    with stack.client(app["server"]) as api:
        run_id = start_run(api, prompt_for(tag=tag, kill=kill), agent=TEAM_AGENT)
        request_id = pending_request_id(stack, run_id)
        alias = stack.db()
        asked = ApprovalRequest.objects.using(alias).get(request_id=request_id)
        assert asked.data["path"] == PAYER.split("/")
        approved = api.post(f"/api/requests/{request_id}/approve", json={})
        assert approved.status_code == 200, approved.text
        if kill != "none":
            wait_for(lambda: not worker.alive(), f"the worker to die at {kill}")
            assert worker.popen.returncode == -9, worker.tail(30)
            assert stack.marker(f"killed-{tag}-{kill}").exists()
            app["worker"] = stack.worker()  # a new process; the old one's lease lapses
        run = stack.wait_status(run_id, {"done", "failed", "incomplete", "cancelled"}, WAIT)
        assert run.status == "done", run.error

    actions = list(
        Event.objects.using(alias).filter(run_id=run_id).values_list("action", flat=True)
    )
    assert actions.count("run_done") == 1, actions
    assert actions.count("run_recovered") == (0 if kill == "none" else 1), actions

    # no handle started twice: one coordinator, one payer, under the ids of the halt
    ids = [h["id"] for h in run.team_state["handles"]]
    assert ids == ["root", "root/coordinator.1", PAYER], ids
    # every side effect exactly once, journaled once under the payer's handle
    effects = stack.effects()
    assert effects[(tag, "pay")] == 1 and effects[(tag, "stamp")] == 1, effects
    journal = list(
        ToolExecution.objects.using(alias)
        .filter(run_id=run_id)
        .values_list("handle", "tool_name", "finished_at")
    )
    assert sorted((h, t) for h, t, _ in journal) == [(PAYER, "pay"), (PAYER, "stamp")]
    interrupted = INTERRUPTED.get(kill)
    for _, tool, finished in journal:
        assert (finished is None) == (tool == interrupted), journal

    # the payer read each result (unknown where the kill hit), the coordinator the payer's text
    payer = run.team_state["conversations"][PAYER]
    outputs = {
        m["tool_call_id"].removeprefix("call_"): m["content"]
        for m in payer
        if m.get("role") == "tool"
    }
    assert sorted(outputs) == ["pay", "stamp"]
    for tool, output in outputs.items():
        if tool == interrupted:
            assert output == UNKNOWN_OUTCOME.format(name=tool), output
        else:
            assert tag in output and "outcome is unknown" not in output, (tool, output)
    said = " | ".join(f"{tool}={outputs[tool]}" for tool in ("pay", "stamp"))
    assert run.text == f"coordinator read: payer read: {said}", run.text
    request = ApprovalRequest.objects.using(alias).get(request_id=request_id)
    assert request.state == "approved" and request.applied_at is not None
