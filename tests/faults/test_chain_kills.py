"""kill -9 the worker in the cascade of a three-level chain; a new worker finishes it.

A `faults-chain` run (tests/faults/agents.py: coordinator > desk > payer) halts on the
payer's relayed `pay`, three levels down; it is approved through the API, and the worker
SIGKILLs itself at one point of the cascade (the first time only): after the payer (the
deepest agent) resumed and gave its final reply, before the desk ran again (`deep_final`);
after the desk's `task` call was answered by the finished payer, before the desk's turn was
stored (`mid_task`); the same one level up (`top_task`). A new `db_worker` takes the run over
once its 3 s lease lapses and drives the step again from the stored state. The run ends
`done` once; no agent is started twice (one handle per level, each started once); the
executor and the payer's native tool ran once each, both finished in the journal.
"""

from __future__ import annotations

import secrets

import pytest

from approvals.models import ApprovalRequest, Event, ToolExecution

from .agents import CHAIN_AGENT, CHAIN_KILL_POINTS, prompt_for
from .conftest import WAIT, pending_request_id, start_run, wait_for

pytestmark = pytest.mark.faults

COORDINATOR = "root/coordinator.1"
DESK = f"{COORDINATOR}/desk.1"
PAYER = f"{DESK}/payer.1"
KILLS = ["none", *CHAIN_KILL_POINTS]
# each level started once, halted once, resumed once (the durable resume), then ended
# Each level started, halted and resumed once. Before it halts, each level is suspended while
# the step's rules are consulted about the call (the runtime's wait_for), then runs on to halt.
ONCE = [
    "idle→running",
    "running→suspended",  # asking the rules
    "suspended→running",  # no rule decided: the call halts the run
    "running→suspended",
    "suspended→idle",
    "idle→running",
    "running→idle",
]


@pytest.fixture(scope="module")
def app(stack):
    return {"server": stack.server(), "worker": stack.worker()}


@pytest.mark.parametrize("kill", KILLS)
def test_a_worker_killed_in_a_three_level_cascade_is_replaced_and_the_run_finishes_once(
    stack, app, kill
):
    if not app["worker"].alive():
        app["worker"] = stack.worker()
    worker = app["worker"]
    tag = f"c{secrets.token_hex(4)}"
    with stack.client(app["server"]) as api:
        run_id = start_run(api, prompt_for(tag=tag, kill=kill), agent=CHAIN_AGENT)
        request_id = pending_request_id(stack, run_id)
        alias = stack.db()
        asked = api.get(f"/api/requests/{request_id}").json()
        assert asked["chain"] == ["coordinator", "desk", "payer"], asked
        assert asked["request"]["data"]["path"] == PAYER.split("/")
        approved = api.post(f"/api/requests/{request_id}/approve", json={})
        assert approved.status_code == 200, approved.text
        if kill != "none":
            wait_for(lambda: not worker.alive(), f"the worker to die at {kill}")
            assert worker.popen.returncode == -9, worker.tail(30)
            assert stack.marker(f"killed-{tag}-{kill}").exists()
            app["worker"] = stack.worker()  # a new process; the old one's lease lapses
        run = stack.wait_status(run_id, {"done", "failed", "incomplete", "cancelled"}, WAIT)
        assert run.status == "done", run.error
        tree = api.get(f"/api/runs/{run_id}").json()["agents"]

    actions = list(
        Event.objects.using(alias).filter(run_id=run_id).values_list("action", flat=True)
    )
    assert actions.count("run_done") == 1, actions
    assert actions.count("run_recovered") == (0 if kill == "none" else 1), actions

    # no agent started twice: one handle per level, under the ids of the halt, each
    # started, halted and resumed exactly once
    handles = {h["id"]: h for h in run.team_state["handles"]}
    assert list(handles) == ["root", COORDINATOR, DESK, PAYER], list(handles)
    assert handles[COORDINATOR]["transitions"] == ONCE
    assert handles[DESK]["transitions"] == [*ONCE, "idle→closed"]
    assert handles[PAYER]["transitions"] == [*ONCE, "idle→closed"]
    [top] = tree
    assert [top["handle"], top["children"][0]["handle"]] == [COORDINATOR, DESK]
    assert [n["handle"] for n in top["children"][0]["children"]] == [PAYER]

    # every tool once: the executor and the native tool, each journaled once and finished
    effects = stack.effects()
    assert effects[(tag, "pay")] == 1 and effects[(tag, "stamp")] == 1, effects
    journal = list(
        ToolExecution.objects.using(alias)
        .filter(run_id=run_id)
        .values_list("handle", "tool_name", "finished_at")
    )
    assert sorted((h, t) for h, t, _ in journal) == [(PAYER, "pay"), (PAYER, "stamp")]
    assert all(finished is not None for *_, finished in journal), journal

    said = f"pay=paid 7 for {tag} | stamp=stamped {tag}"
    assert run.text == f"coordinator read: desk read: payer read: {said}", run.text
    request = ApprovalRequest.objects.using(alias).get(request_id=request_id)
    assert request.state == "approved" and request.applied_at is not None
