"""A three-level chain's resume cascade killed in the worker, in-process (any database; the
fault suite, tests/faults/test_chain_kills.py, kills real worker processes on PostgreSQL).

coordinator > refunds > refund: the refund agent relays `refund` (a human approves, the
executor runs), then calls the native `lookup`, then replies; each parent replies with its
child's text. The worker dies (a BaseException out of the model call, which nothing in the
step catches) where the test says, the first time only: after the deepest agent resumed
and finished, before its parent's next turn; after the middle agent finished, before the
coordinator's turn; after the coordinator's final reply, before the step was stored. The
lapsed lease lets the queued task take the run over; it ends done once, with one handle per
level, each started once, and the executor and the native tool run once.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from approvals import testing
from approvals.execution import runner, teams
from approvals.models import Event, Run, ToolExecution
from toolnexus import InProcessResponse, Tool, ToolResult
from toolnexus.agents import Agent
from toolnexus.relay import relay_tool

pytestmark = pytest.mark.django_db

COORDINATOR = "root/coordinator.1"
REFUNDS = f"{COORDINATOR}/refunds.1"
REFUND = f"{REFUNDS}/refund.1"
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


class _Killed(BaseException):
    """The worker dies: nothing of the step after this point happens."""


class Chain:
    def __init__(self, kill: str) -> None:
        self.kill = kill
        self.killed = False
        self.refunds: list[str] = []
        self.lookups: list[str] = []
        self.asked: dict[str, int] = {}

    def final(self, who: str, point: str):
        def turn(request) -> InProcessResponse:
            self.asked[who] = self.asked.get(who, 0) + 1
            if self.kill == point and not self.killed:
                self.killed = True
                raise _Killed
            results = [m for m in request.messages if m.get("role") == "tool"]
            said = " | ".join(str(m.get("content")) for m in results)
            return InProcessResponse(content=f"{who} read: {said}")

        return turn

    def scripts(self) -> dict[str, list]:
        return {
            "coordinator": [
                testing.call("task", agent="refunds", prompt="refund A-1, $5"),
                # the coordinator's next turn: the middle agent finished before it
                self.final("coordinator", "mid_final"),
            ],
            "refunds": [
                testing.call("task", agent="refund", prompt="issue the refund for A-1"),
                # the middle agent's next turn: the deepest agent finished before it
                self.final("refunds", "deep_final"),
            ],
            "refund": [
                testing.call("refund", order="A-1", amount=5),
                testing.call("lookup", order="A-1"),
                self.final("refund", "never"),
            ],
        }

    def tools(self) -> list[Tool]:
        def lookup(args, ctx) -> ToolResult:
            self.lookups.append(args["order"])
            return ToolResult(f"looked up {args['order']}")

        return [
            relay_tool("refund", "Refund an order (a human approves)."),
            Tool("lookup", "Look an order up.", {"type": "object"}, execute=lookup),
        ]

    def refund(self, args) -> str:
        self.refunds.append(args["order"])
        return f"refunded {args['order']}"


def _team() -> list[Agent]:
    return [
        Agent("coordinator", system_prompt="agent:coordinator", tools=[], team=["refunds"]),
        Agent("refunds", system_prompt="agent:refunds", tools=[], team=["refund"]),
        Agent("refund", system_prompt="agent:refund", tools=["refund", "lookup"]),
    ]


@pytest.fixture
def chain(request):
    model = Chain(request.param)
    with testing.scripted_team(
        "chain-team",
        model.scripts(),
        team=_team(),
        tools=model.tools,
        executors={"refund": model.refund},
    ):
        yield model


@pytest.mark.parametrize("chain", ["deep_final", "mid_final", "stored"], indirect=True)
def test_a_cascade_killed_resumes_with_no_child_started_twice_and_no_tool_run_twice(
    chain, monkeypatch
):
    run = testing.start_and_halt(agent="chain-team", prompt="Customer wants A-1 back")
    assert run.status == "pending", run.error
    assert run.requests.get().data["path"] == REFUND.split("/")
    testing.approve(run, run_worker=False)
    real = teams._result
    if chain.kill == "stored":  # the whole cascade ran; its outcome was never written

        def dies(*args, **kwargs):
            chain.killed = True
            raise _Killed

        monkeypatch.setattr(teams, "_result", dies)
    with pytest.raises(_Killed):
        runner.drive(run.pk)
    assert chain.killed
    monkeypatch.setattr(teams, "_result", real)
    run.refresh_from_db()
    assert run.status == "running"  # held by the dead worker; its stored state untouched
    states = {h["id"]: h["state"] for h in run.team_state["handles"]}
    assert states == {
        "root": "idle",
        COORDINATOR: "suspended",
        REFUNDS: "suspended",
        REFUND: "suspended",
    }
    assert (chain.refunds, chain.lookups) == (["A-1"], ["A-1"])  # they ran before the death
    assert run.requests.get().applied_at is None

    Run.objects.filter(pk=run.pk).update(lease_expires_at=run.updated_at - timedelta(hours=1))
    testing.drain()  # the queued task takes the run over: its lease lapsed
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert run.text == ("coordinator read: refunds read: refund read: refunded A-1 | looked up A-1")
    # no tool run twice: the journal answered the executor and the native tool
    assert (chain.refunds, chain.lookups) == (["A-1"], ["A-1"])
    journal = sorted(
        ToolExecution.objects.filter(run=run).values_list("handle", "tool_name", "finished_at")
    )
    assert [(h, t) for h, t, _ in journal] == [(REFUND, "lookup"), (REFUND, "refund")]
    assert all(finished is not None for *_, finished in journal)
    # no child started twice: one handle per level, each started, halted and resumed once
    handles = {h["id"]: h for h in run.team_state["handles"]}
    assert list(handles) == ["root", COORDINATOR, REFUNDS, REFUND]
    assert handles[COORDINATOR]["transitions"] == ONCE
    assert handles[REFUNDS]["transitions"] == [*ONCE, "idle→closed"]
    assert handles[REFUND]["transitions"] == [*ONCE, "idle→closed"]
    assert Event.objects.filter(run=run, action="run_done").count() == 1
    assert run.requests.get().applied_at is not None
