"""approvals.services.requests: decisions on a request (decline, approve with or without an
edit or a typed output, per-call decisions, a raw answer) and what the resumed run's model
reads."""

from __future__ import annotations

import pytest

from approvals import services
from approvals.domain.exceptions import AlreadyDecided, InvalidInput, NotAllowed
from approvals.models import Event, RequestCall, ToolExecution

from .factories import (
    REFUND_PROMPT,
    drain,
    fresh,
    make_user,
    start_and_halt,
    tasks_for,
    tool_output,
)
from .factories import run_actions as _actions

pytestmark = pytest.mark.django_db(transaction=True)


# -- decline ----------------------------------------------------------------------------


def test_decline_with_reason_resumes_and_the_model_reads_the_reason():
    user = make_user()
    run = start_and_halt(prompt=REFUND_PROMPT, user=user)
    request = run.requests.get()

    services.request_decline(
        request_id=request.request_id, user=user, reason="amount exceeds refund policy"
    )
    request.refresh_from_db()
    assert request.state == "declined"
    assert request.reason == "amount exceeds refund policy"
    assert request.decided_by == user and request.decided_at is not None
    assert request.answer == {
        "id": request.request_id,
        "ok": False,
        "reason": "amount exceeds refund policy",
    }
    assert fresh(run).status == "queued"
    (call,) = request.calls.all()
    assert call.decision == "decline" and call.reason == "amount exceeds refund policy"

    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == (
        "relay declined for refund: amount exceeds refund policy"
    )
    assert "amount exceeds refund policy" in run.text
    request.refresh_from_db()
    assert request.applied_at is not None
    assert not ToolExecution.objects.filter(run=run).exists()  # a decline runs nothing
    decided = Event.objects.get(run=run, action="request_declined")
    assert decided.actor == user
    assert decided.detail["model_reads"] == (
        "relay declined for refund: amount exceeds refund policy"
    )
    assert _actions(run)[-4:] == ["request_declined", "run_resumed", "run_claimed", "run_done"]


def test_decline_without_reason_reads_declined():
    user = make_user()
    runs = {reason: start_and_halt(user=user) for reason in ("", None, "   ")}
    for reason, run in runs.items():
        request = run.requests.get()
        services.request_decline(request_id=request.request_id, user=user, reason=reason)
        request.refresh_from_db()
        assert request.reason == "declined", repr(reason)
    drain()
    for run in runs.values():
        assert tool_output(fresh(run), "call_refund") == "relay declined for refund: declined"


def test_decline_reason_must_be_a_string_of_bounded_length():
    user = make_user()
    run = start_and_halt(user=user)
    request = run.requests.get()
    with pytest.raises(InvalidInput, match="reason"):
        services.request_decline(request_id=request.request_id, user=user, reason=42)
    with pytest.raises(InvalidInput, match="reason"):
        services.request_decline(
            request_id=request.request_id,
            user=user,
            reason="x" * (services.MAX_REASON_CHARS + 1),
        )
    request.refresh_from_db()
    assert request.state == "pending"


def test_second_decision_is_refused_naming_who_and_when():
    first, second = make_user(username="alice"), make_user(username="bob")
    run = start_and_halt(user=first)
    request = run.requests.get()
    services.request_decline(request_id=request.request_id, user=first, reason="no")
    with pytest.raises(AlreadyDecided) as info:
        services.request_approve(request_id=request.request_id, user=second)
    message = str(info.value)
    request.refresh_from_db()
    assert "alice" in message and "declined" in message
    assert request.decided_at.isoformat(timespec="seconds") in message
    with pytest.raises(AlreadyDecided):
        services.request_decline(request_id=request.request_id, user=second, reason="again")
    request.refresh_from_db()
    assert request.reason == "no" and request.decided_by == first
    assert len(tasks_for(run)) == 2  # the start and ONE resume
    assert Event.objects.filter(run=run, action="run_resumed").count() == 1


# -- approve: relay with executor, edited input, typed output ---------------------------


def test_approve_relay_runs_the_executor_once_and_the_model_reads_its_output():
    user = make_user()
    run = start_and_halt(prompt=REFUND_PROMPT, user=user)
    request = run.requests.get()
    services.request_approve(request_id=request.request_id, user=user)
    request.refresh_from_db()
    assert request.state == "approved"
    assert request.answer is None  # the worker builds it from the executor's result
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "refund issued: $120 to order A-1001"
    (execution,) = ToolExecution.objects.filter(run=run)
    assert execution.call_id == "call_refund" and execution.tool_name == "refund"
    assert execution.finished_at is not None
    assert execution.output == "refund issued: $120 to order A-1001"
    request.refresh_from_db()
    assert request.answer["ok"] is True
    assert request.answer["data"]["results"] == [
        {"id": "call_refund", "output": "refund issued: $120 to order A-1001", "isError": False}
    ]
    call = request.calls.get()
    assert call.decision == "approve" and call.output == "refund issued: $120 to order A-1001"


def test_approve_relay_with_edited_input_runs_the_executor_with_the_edit():
    user = make_user()
    run = start_and_halt(prompt=REFUND_PROMPT, user=user)
    request = run.requests.get()
    services.request_approve(
        request_id=request.request_id, user=user, input={"order": "A-1001", "amount": 50}
    )
    call = request.calls.get()
    assert call.decision == "edit"
    assert call.edited_input == {"order": "A-1001", "amount": 50}
    assert call.input == {"order": "A-1001", "amount": 120}  # what the model asked, kept
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "refund issued: $50 to order A-1001"
    assert ToolExecution.objects.get(run=run).input == {"order": "A-1001", "amount": 50}


INVALID_REFUND_EDITS = [
    ({"order": "A-1001", "amount": -5}, "amount"),
    ({"order": "A-1001", "amount": "lots"}, "amount"),
    ({"amount": 5}, "order"),
    ({"order": "A-1001", "amount": 5, "note": "x"}, "note"),
    ("not an object", "input"),
]


def test_approve_relay_with_invalid_edit_is_refused_and_changes_nothing():
    user = make_user()
    run = start_and_halt(prompt=REFUND_PROMPT, user=user)
    request = run.requests.get()
    events_before = Event.objects.count()
    for edited, field in INVALID_REFUND_EDITS:
        with pytest.raises(InvalidInput) as info:
            services.request_approve(request_id=request.request_id, user=user, input=edited)
        assert field in str(info.value), (edited, str(info.value))
    request.refresh_from_db()
    assert request.state == "pending" and request.decided_at is None
    call = request.calls.get()
    assert call.decision == "" and call.edited_input is None
    assert fresh(run).status == "pending"
    assert Event.objects.count() == events_before
    assert len(tasks_for(run)) == 1


def test_demo_delete_account_approval_with_edited_input():
    user = make_user()
    run = start_and_halt(prompt="Please delete the account", user=user)
    request = run.requests.get()
    assert request.kind == "approval"
    assert request.data["tool"] == "delete_account"
    assert request.data["callId"] == "call_delete"
    assert "acct-42" in request.prompt
    services.request_approve(request_id=request.request_id, user=user, input={"account": "acct-7"})
    request.refresh_from_db()
    assert request.state == "approved"
    assert request.answer == {
        "id": request.request_id,
        "ok": True,
        "data": {"input": {"account": "acct-7"}},
    }
    call = request.calls.get()
    assert call.decision == "edit" and call.edited_input == {"account": "acct-7"}
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_delete") == "account acct-7 scheduled for deletion"
    assert ToolExecution.objects.filter(run=run, call_id="call_delete").count() == 1


def test_demo_delete_account_approved_as_shown_runs_the_original_input():
    user = make_user()
    run = start_and_halt(prompt="delete my account", user=user)
    request = run.requests.get()
    services.request_approve(request_id=request.request_id, user=user)
    drain()
    assert tool_output(fresh(run), "call_delete") == "account acct-42 scheduled for deletion"


def test_demo_delete_account_invalid_edit_is_refused():
    user = make_user()
    run = start_and_halt(prompt="delete my account", user=user)
    request = run.requests.get()
    with pytest.raises(InvalidInput, match="account"):
        services.request_approve(request_id=request.request_id, user=user, input={"account": ""})
    with pytest.raises(InvalidInput, match="output"):
        services.request_approve(request_id=request.request_id, user=user, output="done")
    request.refresh_from_db()
    assert request.state == "pending"


def test_demo_delete_account_decline_carries_the_reason():
    user = make_user()
    run = start_and_halt(prompt="delete my account", user=user)
    request = run.requests.get()
    services.request_decline(request_id=request.request_id, user=user, reason="legal hold")
    drain()
    run = fresh(run)
    output = tool_output(run, "call_delete")
    assert "legal hold" in output
    assert "scheduled for deletion" not in output
    assert not ToolExecution.objects.filter(run=run).exists()


def test_relay_call_without_executor_takes_a_typed_output(typed_output_agent):
    user = make_user()
    run = start_and_halt(
        prompt="Refund A-2002 $30 and email the customer", user=user, agent=typed_output_agent
    )
    request = run.requests.get()
    calls = {c.call_id: c for c in request.calls.all()}
    assert list(calls) == ["call_refund", "call_email"]
    with pytest.raises(InvalidInput, match="no executor"):
        services.request_approve(
            request_id=request.request_id,
            user=user,
            calls={"call_refund": {"decision": "approve"}, "call_email": {"decision": "approve"}},
        )
    services.request_approve(
        request_id=request.request_id,
        user=user,
        calls={
            "call_refund": {"decision": "output", "output": "refunded by hand"},
            "call_email": {"output": "email sent at 10:02"},
        },
    )
    request.refresh_from_db()
    assert request.state == "answered"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "refunded by hand"
    assert tool_output(run, "call_email") == "email sent at 10:02"
    assert not ToolExecution.objects.filter(run=run).exists()  # typed outputs run nothing


def test_two_call_turn_mixed_decision_each_call_gets_its_own_result():
    user = make_user()
    run = start_and_halt(prompt="Refund A-2002 $30 and email the customer", user=user)
    request = run.requests.get()
    assert request.calls.count() == 2
    services.request_approve(
        request_id=request.request_id,
        user=user,
        calls={
            "call_refund": {"decision": "approve"},
            "call_email": {"decision": "decline", "reason": "wrong address"},
        },
    )
    request.refresh_from_db()
    assert request.state == "approved"
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_refund") == "refund issued: $30 to order A-2002"
    assert tool_output(run, "call_email") == "relay declined for send_email: wrong address"
    assert "refund issued" in run.text and "wrong address" in run.text
    (execution,) = ToolExecution.objects.filter(run=run)
    assert execution.call_id == "call_refund"
    email = RequestCall.objects.get(request=request, call_id="call_email")
    assert email.decision == "decline" and email.reason == "wrong address" and email.is_error


def test_two_call_turn_declined_whole_gives_every_call_the_reason():
    user = make_user()
    run = start_and_halt(prompt="refund and email please", user=user)
    request = run.requests.get()
    services.request_decline(request_id=request.request_id, user=user, reason="fraud suspected")
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "relay declined for refund: fraud suspected"
    assert tool_output(run, "call_email") == "relay declined for send_email: fraud suspected"


def test_two_call_turn_needs_per_call_decisions_and_known_call_ids():
    user = make_user()
    run = start_and_halt(prompt="refund and email please", user=user)
    request = run.requests.get()
    with pytest.raises(InvalidInput, match="calls"):
        services.request_approve(
            request_id=request.request_id, user=user, input={"order": "A-1", "amount": 1}
        )
    with pytest.raises(InvalidInput, match="nope"):
        services.request_approve(
            request_id=request.request_id, user=user, calls={"nope": {"decision": "approve"}}
        )
    with pytest.raises(InvalidInput, match=r"calls\.call_refund\.input"):
        services.request_approve(
            request_id=request.request_id,
            user=user,
            calls={
                "call_refund": {"input": {"order": "A-1", "amount": -1}},
                "call_email": {"decision": "decline"},
            },
        )
    with pytest.raises(InvalidInput, match="decision"):
        services.request_approve(
            request_id=request.request_id,
            user=user,
            calls={"call_refund": {"decision": "maybe"}, "call_email": {"decision": "decline"}},
        )
    request.refresh_from_db()
    assert request.state == "pending"
    assert set(request.calls.values_list("decision", flat=True)) == {""}


def test_question_answered_with_typed_output():
    user = make_user()
    run = start_and_halt(prompt="I have a question for the customer", user=user)
    request = run.requests.get()
    assert request.kind == "question"
    assert "Which plan" in request.prompt
    services.request_approve(request_id=request.request_id, user=user, output="pro")
    request.refresh_from_db()
    assert request.state == "answered"
    assert request.answer == {"id": request.request_id, "ok": True, "data": {"output": "pro"}}
    drain()
    run = fresh(run)
    assert run.status == "done"
    assert tool_output(run, "call_question") == '{"output":"pro"}'
    assert "pro" in run.text


def test_question_declined_carries_the_reason():
    user = make_user()
    run = start_and_halt(prompt="ask the customer", user=user)
    request = run.requests.get()
    services.request_decline(request_id=request.request_id, user=user, reason="no idea")
    drain()
    output = tool_output(fresh(run), "call_question")
    assert output.startswith("declined/expired:") and "no idea" in output


def test_answer_service_refuses_an_id_that_does_not_echo():
    user = make_user()
    run = start_and_halt(user=user)
    request = run.requests.get()
    with pytest.raises(InvalidInput, match="does not echo"):
        services.request_answer(
            request_id=request.request_id, user=user, answer={"id": "other", "ok": False}
        )
    request.refresh_from_db()
    assert request.state == "pending"


def test_answer_service_relay_results_by_call_id(typed_output_agent):
    user = make_user()
    run = start_and_halt(prompt="refund and email please", user=user, agent=typed_output_agent)
    request = run.requests.get()
    services.request_answer(
        request_id=request.request_id,
        user=user,
        answer={
            "id": request.request_id,
            "ok": True,
            "data": {
                "results": [
                    {"id": "call_email", "output": "mail queued"},
                    {"id": "call_refund", "output": "refund failed: card expired", "isError": True},
                ]
            },
        },
    )
    drain()
    run = fresh(run)
    assert tool_output(run, "call_refund") == "refund failed: card expired"
    assert tool_output(run, "call_email") == "mail queued"
    assert RequestCall.objects.get(request=request, call_id="call_refund").is_error is True


# -- permissions ------------------------------------------------------------------------


def test_watcher_can_not_decide_and_nothing_changes():
    run = start_and_halt()
    request = run.requests.get()
    watcher = make_user(role="watcher")
    for decide in (
        lambda: services.request_decline(request_id=request.request_id, user=watcher),
        lambda: services.request_approve(request_id=request.request_id, user=watcher),
        lambda: services.request_answer(
            request_id=request.request_id,
            user=watcher,
            answer={"id": request.request_id, "ok": False},
        ),
        lambda: services.request_expire(request_id=request.request_id, user=watcher),
        lambda: services.run_cancel(run_id=run.pk, user=watcher),
    ):
        with pytest.raises(NotAllowed):
            decide()
    request.refresh_from_db()
    assert request.state == "pending"
    assert fresh(run).status == "pending"
