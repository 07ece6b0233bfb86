"""Rules decide gated calls in the worker: no pending request, the run carries on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import testing
from approvals.models import ApprovalRequest, Event, Rule, ToolExecution
from toolnexus.relay import relay_tool

pytestmark = pytest.mark.django_db(transaction=False)

State = ApprovalRequest.State


def rule(**fields) -> Rule:
    fields.setdefault("name", "small refunds")
    fields.setdefault("effect", Rule.Effect.APPROVE)
    return Rule.objects.create(**fields)


def test_an_approve_rule_runs_the_relay_call_inline_and_the_run_finishes():
    r = rule(agent="demo", tool="ref*", condition="args.amount <= 50")
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "done", run.error
    assert "refund issued: $20 to order A-1" in str(run.messages)
    row = run.requests.get()
    assert row.state == State.APPROVED and row.decided_by is None
    assert row.decided_by_rule == r and row.rule_version == 1
    assert row.applied_at is not None
    assert not ApprovalRequest.objects.filter(state=State.PENDING).exists()
    assert ToolExecution.objects.filter(run=run, tool_name="refund").count() == 1
    decided = Event.objects.get(run=run, action="request_approved")
    assert decided.actor is None
    assert decided.detail["rule"] == {"id": r.pk, "name": "small refunds", "version": 1}
    r.refresh_from_db()
    assert r.match_count == 1 and r.last_matched_at is not None


def test_a_call_outside_the_condition_halts_for_a_person_as_before():
    rule(condition="args.amount <= 50")
    run = testing.start(agent="demo", prompt="Refund $250 on order A-1")
    assert run.status == "pending"
    row = run.requests.get()
    assert row.state == State.PENDING and row.decided_by_rule is None
    run = testing.approve(run)
    assert run.status == "done"


def test_a_decline_rule_is_a_tool_error_the_model_reads_and_the_run_continues():
    rule(effect=Rule.Effect.DECLINE, tool="refund", reason="refunds go through billing")
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "done", run.error
    row = run.requests.get()
    assert row.state == State.DECLINED and row.reason == "refunds go through billing"
    tool_messages = [m for m in run.messages if m.get("role") == "tool"]
    assert "refunds go through billing" in tool_messages[-1]["content"]
    assert not ToolExecution.objects.filter(run=run).exists()


def test_an_empty_decline_reason_reads_declined():
    rule(effect=Rule.Effect.DECLINE, tool="refund")
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    tool_messages = [m for m in run.messages if m.get("role") == "tool"]
    assert "declined" in tool_messages[-1]["content"]


def test_an_approval_gated_tool_runs_when_a_rule_approves_it():
    rule(kind="approval", tool="delete_account", condition='args.account.startsWith("test-")')
    run = testing.start(agent="demo", prompt="delete account test-9")
    assert run.status == "done", run.error
    assert "account test-9 scheduled for deletion" in str(run.messages)
    assert run.requests.get().state == State.APPROVED


def test_at_the_same_position_a_decline_wins_and_a_lower_position_wins_over_both():
    rule(name="yes", position=10)
    no = rule(name="no", position=10, effect=Rule.Effect.DECLINE)
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.requests.get().decided_by_rule == no
    first = rule(name="first", position=1)
    run = testing.start(agent="demo", prompt="Refund $20 on order A-2")
    assert run.requests.get().decided_by_rule == first


@pytest.mark.parametrize(
    "fields",
    [
        {"enabled": False},
        {"expires_at": timezone.now() - timedelta(minutes=1)},
        {"agent": "someone-else"},
        {"tool": "send_*"},
        {"kind": "approval"},
        {"condition": "args.missing > 3"},  # an evaluation error: no match, no crash
        {"condition": "args.amount"},  # not a boolean: no match
    ],
)
def test_rules_out_of_scope_or_failing_never_decide(fields):
    rule(**fields)
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "pending"
    assert run.requests.get().state == State.PENDING


def test_the_run_condition_sees_who_started_it():
    user = testing.make_user(username="alice")
    rule(condition='run.started_by == "alice" && run.agent == "demo"')
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1", user=user)
    assert run.status == "done"
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1")
    assert run.status == "pending"


def test_of_two_calls_in_one_turn_the_rule_decides_one_and_the_run_halts_on_the_other():
    rule(tool="refund")
    run = testing.start(agent="demo", prompt="Refund $20 on order A-1 and email both")
    assert run.status == "pending"
    decided, waiting = run.requests.order_by("created_at", "id")
    assert decided.state == State.APPROVED and decided.decided_by_rule is not None
    assert [c.tool_name for c in waiting.calls.all()] == ["send_email"]
    run = testing.decline(run, "no emails today")
    assert run.status == "done", run.error
    assert ToolExecution.objects.filter(run=run, tool_name="refund").count() == 1


def test_a_scripted_agent_reads_the_rule_decline_in_its_next_turn():
    with testing.scripted_agent(
        "support",
        testing.call("refund", order="A-1", amount=5),
        "I read: {results}",
        tools=[relay_tool("refund", "refund an order")],
        executors={"refund": lambda args: "refunded"},
    ):
        rule(effect=Rule.Effect.DECLINE, agent="support", reason="not on Sundays")
        run = testing.start(agent="support", prompt="refund A-1")
    assert run.status == "done"
    assert "not on Sundays" in run.text
