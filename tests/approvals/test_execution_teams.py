"""Team runs through the worker (drain): a sub-agent's request halts the run at the root with
its chain in `data.path`, a decision resumes the asking sub-agent (a decline's reason reaches
it and it recovers; an approval runs the executor once), and the coordinator reads its final
text. The journal keys tool executions by handle too: two agents whose calls share a
transcript position and a call id each run their own tool."""

from __future__ import annotations

from datetime import timedelta

import pytest

from approvals import agents, testing
from approvals.execution import runner, teams
from approvals.models import Event, Run, ToolExecution
from toolnexus import Tool, ToolResult
from toolnexus.agents import Agent
from toolnexus.relay import relay_tool

pytestmark = pytest.mark.django_db

REFUNDS_PATH = ["root", "coordinator.1", "refunds.1"]


def _team() -> list[Agent]:
    return [
        Agent("coordinator", system_prompt="agent:coordinator", tools=["lookup"], team=["refunds"]),
        Agent(
            "refunds",
            system_prompt="agent:refunds",
            description="issues refunds",
            tools=["lookup", "refund"],
        ),
    ]


class Effects:
    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.refunds: list[str] = []

    def tools(self) -> list[Tool]:
        def lookup(args, ctx) -> ToolResult:
            self.lookups.append(args["order"])
            return ToolResult(f"looked up {args['order']}")

        return [
            Tool("lookup", "Look an order up.", {"type": "object"}, execute=lookup),
            relay_tool("refund", "Refund an order (a human approves).", {"type": "object"}),
        ]

    def refund(self, args) -> str:
        self.refunds.append(args["order"])
        return f"refunded {args['order']}"


def _scripts() -> dict[str, list]:
    task = testing.call("task", agent="refunds", prompt="refund A-1, $5")
    return {
        # Both agents' first call is `call_lookup` at position 2 of their own transcript.
        "coordinator": [
            testing.call("lookup", order="C-9"),
            task,
            "coordinator read: {results}",
        ],
        "refunds": [
            testing.call("lookup", order="A-1"),
            testing.call("refund", order="A-1", amount=5),
            "refunds read: {results}",
        ],
    }


@pytest.fixture
def team():
    effects = Effects()
    with testing.scripted_team(
        "support-team",
        _scripts(),
        team=_team(),
        tools=effects.tools,
        executors={"refund": effects.refund},
    ) as model:
        model.effects = effects
        yield model


def _halted(team) -> Run:
    run = testing.start_and_halt(agent="support-team", prompt="Customer wants a refund for A-1")
    assert run.status == "pending", run.error
    return run


def test_a_sub_agents_relay_call_halts_the_run_with_its_chain(team):
    run = _halted(team)
    request = run.requests.get()
    assert request.kind == "tool_call"
    assert request.data["path"] == REFUNDS_PATH
    assert [c.tool_name for c in request.call_list()] == ["refund"]
    assert request.call_list()[0].input == {"order": "A-1", "amount": 5}
    # the state is stored with the halt: every handle suspended, the asker at the bottom
    handles = {h["id"]: h for h in run.team_state["handles"]}
    assert handles["root/coordinator.1"]["state"] == "suspended"
    assert handles["root/coordinator.1/refunds.1"]["state"] == "suspended"
    assert teams.halted_position(run) == ("root/coordinator.1/refunds.1", 4)
    # the run's transcript is the coordinator's, with the task call it waits on
    calls = [tc["function"]["name"] for m in run.messages for tc in m.get("tool_calls") or []]
    assert calls == ["lookup", "task"]
    # each agent ran its own lookup, journaled under its handle
    assert team.effects.lookups == ["C-9", "A-1"]
    journal = {
        e.handle: (e.message_index, e.call_id, e.output)
        for e in ToolExecution.objects.filter(run=run)
    }
    assert journal == {
        "root/coordinator.1": (2, "call_lookup", "looked up C-9"),
        "root/coordinator.1/refunds.1": (2, "call_lookup", "looked up A-1"),
    }
    assert run.turns == 4  # the coordinator's two and the refunds agent's two


def test_a_decline_reaches_the_sub_agent_which_recovers_and_the_coordinator_reads_it(team):
    run = _halted(team)
    run = testing.decline(run, "over the refund policy")
    assert run.status == "done", run.error
    said = "relay declined for refund: over the refund policy"
    refunds_text = f"refunds read: {said}"
    assert run.text == f"coordinator read: {refunds_text}"
    assert team.effects.refunds == []  # declined: the executor never ran
    assert team.effects.lookups == ["C-9", "A-1"]  # nothing ran twice on resume
    handles = {h["id"]: h for h in run.team_state["handles"]}
    assert sorted(handles) == ["root", "root/coordinator.1", "root/coordinator.1/refunds.1"]
    refunds = handles["root/coordinator.1/refunds.1"]
    assert refunds["outcome"]["status"] == "done" and refunds["outcome"]["text"] == refunds_text
    assert refunds["turns"] == 3  # it read the decline and answered
    convo = run.team_state["conversations"]["root/coordinator.1/refunds.1"]
    assert any(m.get("role") == "tool" and m.get("content") == said for m in convo)
    assert run.turns == 6
    assert Event.objects.filter(run=run, action="run_done").count() == 1
    request = run.requests.get()
    assert request.state == "declined" and request.applied_at is not None


def test_an_approval_runs_the_executor_once_and_the_run_finishes(team):
    run = _halted(team)
    run = testing.approve(run)
    assert run.status == "done", run.error
    assert team.effects.refunds == ["A-1"]
    assert run.text == "coordinator read: refunds read: refunded A-1"
    refund = ToolExecution.objects.get(run=run, tool_name="refund")
    assert (refund.handle, refund.message_index) == ("root/coordinator.1/refunds.1", 4)
    assert refund.output == "refunded A-1" and refund.finished_at is not None


class _Killed(BaseException):
    """The worker dies: nothing of the step after this point happens."""


def test_a_decided_step_driven_again_runs_nothing_twice(team, monkeypatch):
    """A worker that dies after the cascade ran its tools (the executor, the sub-agent's and
    the coordinator's next turns) but before it stored the outcome: the step is driven again
    from the stored state; the journal answers every tool, no handle is started twice."""
    run = _halted(team)
    testing.approve(run, run_worker=False)
    real_result = teams._result

    def dies(*args, **kwargs):
        raise _Killed

    monkeypatch.setattr(teams, "_result", dies)
    with pytest.raises(_Killed):
        runner.drive(run.pk)
    run.refresh_from_db()
    assert run.status == "running"  # held by the dead worker; its stored state untouched
    assert team.effects.refunds == ["A-1"]  # the executor ran before the death
    states = {h["id"]: h["state"] for h in run.team_state["handles"]}
    assert states["root/coordinator.1/refunds.1"] == "suspended"
    assert run.requests.get().applied_at is None

    monkeypatch.setattr(teams, "_result", real_result)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=run.updated_at - timedelta(hours=1))
    testing.drain()  # the queued task takes the run over: its lease lapsed
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert run.text == "coordinator read: refunds read: refunded A-1"
    assert team.effects.refunds == ["A-1"] and team.effects.lookups == ["C-9", "A-1"]
    ids = [h["id"] for h in run.team_state["handles"]]
    assert ids == ["root", "root/coordinator.1", "root/coordinator.1/refunds.1"]
    assert ToolExecution.objects.filter(run=run, tool_name="refund").count() == 1
    assert Event.objects.filter(run=run, action="run_done").count() == 1


def test_a_team_registration_is_checked():
    with pytest.raises(ValueError, match="delegates to unknown"):
        agents.register(
            "bad-team",
            model=lambda: None,
            team=[Agent("coordinator", system_prompt="c", team=["nobody"])],
        )
    with pytest.raises(ValueError, match="names tools the agent lacks"):
        agents.register(
            "bad-team",
            model=lambda: None,
            tools=[relay_tool("refund", "r")],
            team=[Agent("coordinator", system_prompt="c", tools=["refund", "wipe"])],
        )
    assert agents.get("bad-team") is None


# -- the demo team ---------------------------------------------------------------------------


def test_the_demo_team_delegates_a_refund_and_reports_a_decline(settings):
    assert agents.get("demo-team") is not None  # registered with the demo (TOOLNEXUS_DEMO_AGENT)
    run = testing.start_and_halt(agent="demo-team", prompt="Plan a refund for order B-7, $40")
    assert run.status == "pending", run.error
    request = run.requests.get()
    assert request.data["path"] == REFUNDS_PATH
    assert request.call_list()[0].input == {"order": "B-7", "amount": 40}
    run = testing.decline(run, "over policy")
    assert run.status == "done", run.error
    assert run.text == (
        "The refunds desk reports: I did not run refund: the reviewer declined it (over"
        " policy). I can offer store credit or escalate to a manager instead."
    )


def test_the_demo_team_runs_the_refund_once_approved():
    run = testing.start_and_halt(agent="demo-team", prompt="Plan a refund for order B-8, $12")
    run = testing.approve(run)
    assert run.status == "done", run.error
    assert run.text == (
        "The refunds desk reports: Done with refund: refund issued: $12 to order B-8."
    )


# -- rules decide a sub-agent's calls as a single agent's ----------------------------------


def _rule(**fields):
    from approvals.models import Rule

    fields.setdefault("name", "small refunds")
    return Rule.objects.create(**fields)


def test_an_approve_rule_runs_a_sub_agents_relay_call_inline_under_its_handle(team):
    from approvals.models import ApprovalRequest

    rule = _rule(
        agent="support-team", tool="refund", effect="approve", condition="args.amount <= 50"
    )
    run = testing.start(agent="support-team", prompt="Customer wants a refund for A-1")
    assert run.status == "done", run.error
    assert run.text == "coordinator read: refunds read: refunded A-1"
    assert team.effects.refunds == ["A-1"]
    row = run.requests.get()  # the record keeps the call, decided by the rule, never pending
    assert row.state == ApprovalRequest.State.APPROVED and row.decided_by_rule == rule
    assert row.data["path"] == REFUNDS_PATH and row.decided_by is None
    refund = ToolExecution.objects.get(run=run, tool_name="refund")
    # journaled under the asking agent's handle and its halted turn, as a person's approval is
    assert (refund.handle, refund.message_index) == ("root/coordinator.1/refunds.1", 4)
    assert Event.objects.filter(run=run, action="request_created").count() == 1


def test_a_decline_rule_reaches_the_sub_agent_which_recovers(team):
    _rule(
        agent="support-team", tool="refund", effect="decline", reason="refunds go through billing"
    )
    run = testing.start(agent="support-team", prompt="Customer wants a refund for A-1")
    assert run.status == "done", run.error
    said = "relay declined for refund: refunds go through billing"
    assert run.text == f"coordinator read: refunds read: {said}"
    assert team.effects.refunds == []
    assert run.requests.get().decided_by_rule is not None


def test_a_require_rule_halts_a_sub_agents_call_with_its_requirement(team):
    _rule(tool="refund", effect="require_approvers", approvals_needed=2)
    run = _halted(team)
    request = run.requests.get()
    assert request.data["path"] == REFUNDS_PATH
    assert request.requirement.approvals_needed == 2
    assert team.effects.refunds == []


def test_a_route_rule_routes_a_sub_agents_call_to_its_person(team):
    from .factories import inbox, make_user

    rita, other = make_user(username="rita"), make_user()
    _rule(agent="support-team", tool="refund", effect="route", route_user=rita)
    run = _halted(team)
    request = run.requests.get()
    assert request.state == "pending" and request.data["path"] == REFUNDS_PATH
    assert request.requirement.routed_user == rita
    assert inbox(rita, claim="routed") == [request.request_id]
    assert inbox(other, claim="routed") == []
    assert team.effects.refunds == []


def test_a_rule_out_of_scope_leaves_the_sub_agents_call_to_a_person(team):
    _rule(agent="someone-else", tool="refund", effect="approve")
    run = _halted(team)
    assert run.requests.get().state == "pending"


def test_a_sub_agents_request_is_declined_in_bulk_and_recorded_as_any_other(team):
    from .factories import make_user, post_json, session_client

    run = _halted(team)
    request = run.requests.get()
    reviewer = make_user()
    response = post_json(
        session_client(reviewer),
        "/api/requests/bulk",
        {"ids": [request.request_id], "action": "decline", "reason": "over the policy"},
    )
    assert response.json()["results"] == [
        {
            "id": request.request_id,
            "status": "done",
            "message": response.json()["results"][0]["message"],
        }
    ]
    testing.drain()
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert run.text == "coordinator read: refunds read: relay declined for refund: over the policy"
    declined = Event.objects.get(run=run, action="request_declined")
    assert declined.actor == reviewer and declined.detail["reason"] == "over the policy"
