"""approvals.services.runs: starting a run (permission, validation) up to its first halt,
cancelling it, and which runs (and whom) a retry refuses."""

from __future__ import annotations

import pytest

from approvals import services
from approvals.domain.exceptions import InvalidInput, InvalidTransition, NotAllowed

from .factories import REFUND_PROMPT, drain, fresh, make_user, start_and_halt, tasks_for
from .factories import run_actions as _actions

pytestmark = pytest.mark.django_db(transaction=True)


# -- start and halt ---------------------------------------------------------------------


def test_halt_stores_transcript_and_one_pending_request_with_its_call():
    run = start_and_halt(prompt=REFUND_PROMPT)
    assert run.status == "pending"
    assert run.worker_id == "" and run.lease_expires_at is None
    request = run.requests.get()
    assert request.state == "pending" and request.kind == "tool_call"
    assert request.decided_at is None and request.answer is None
    (call,) = request.calls.all()
    assert (call.call_id, call.tool_name) == ("call_refund", "refund")
    assert call.input == {"order": "A-1001", "amount": 120}
    assert call.arguments == '{"order":"A-1001","amount":120}'
    # the halted assistant turn is in the stored transcript
    assert run.messages[-1]["role"] in ("assistant", "tool")
    assert any(m.get("tool_calls") for m in run.messages if m["role"] == "assistant")
    assert _actions(run) == [
        "run_started",
        "run_claimed",
        "run_halted",
        "request_created",
    ]


def test_run_start_needs_the_add_run_permission():
    with pytest.raises(NotAllowed):
        services.run_start(agent="demo", prompt="hi", started_by=make_user(role="watcher"))
    with pytest.raises(NotAllowed):
        services.run_start(agent="demo", prompt="hi", started_by=make_user(role="nobody"))
    with pytest.raises(NotAllowed):
        services.run_start(agent="demo", prompt="hi", started_by=None)
    run = services.run_start(agent="demo", prompt="hi", started_by=make_user())
    assert run.status == "queued" and run.started_by is not None


def test_run_start_validates_agent_and_prompt():
    user = make_user()
    with pytest.raises(InvalidInput, match="agent"):
        services.run_start(agent="no-such-agent", prompt="hi", started_by=user)
    with pytest.raises(InvalidInput, match="prompt"):
        services.run_start(agent="demo", prompt="   ", started_by=user)
    with pytest.raises(InvalidInput, match="prompt"):
        services.run_start(
            agent="demo", prompt="x" * (services.MAX_PROMPT_CHARS + 1), started_by=user
        )


# -- cancel, retry ----------------------------------------------------------------------


def test_cancel_stops_the_run_and_its_open_request_without_resuming():
    user = make_user()
    run = start_and_halt(user=user)
    request = run.requests.get()
    services.run_cancel(run_id=run.pk, user=user, reason="customer withdrew")
    request.refresh_from_db()
    assert request.state == "cancelled"
    run = fresh(run)
    assert run.status == "cancelled" and run.finished_at is not None
    assert len(tasks_for(run)) == 1  # no resume task
    assert drain() == 0
    with pytest.raises(InvalidTransition):
        services.run_retry(run_id=run.pk, user=user)


def test_retry_refuses_a_pending_run():
    # Retry is for failed runs. A pending run re-queued by "retry" would carry on without
    # the human decision and leave its request open.
    user = make_user()
    run = start_and_halt(user=user)
    with pytest.raises(InvalidTransition):
        services.run_retry(run_id=run.pk, user=user)
    drain()
    assert fresh(run).status == "pending"
    assert run.requests.get().state == "pending"


def test_retry_refuses_a_done_run():
    user = make_user()
    run = start_and_halt(user=user)
    services.request_decline(request_id=run.requests.get().request_id, user=user)
    drain()
    with pytest.raises(InvalidTransition):
        services.run_retry(run_id=run.pk, user=user)
    assert fresh(run).status == "done"


def test_retry_needs_permission(mock_model):
    mock_model.fail = True
    run = services.run_start(agent="remote", prompt="x", started_by=make_user())
    drain()
    with pytest.raises(NotAllowed):
        services.run_retry(run_id=run.pk, user=make_user(role="watcher"))
    assert fresh(run).status == "failed"
