import pytest

from approvals import services

from .factories import drain, make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_refund_halts_then_decline_reaches_the_model():
    user = make_user()
    run = start_and_halt(user=user)
    assert run.status == "pending"
    request = run.requests.get()
    services.request_decline(
        request_id=request.request_id, user=user, reason="amount exceeds refund policy"
    )
    drain()
    run.refresh_from_db()
    assert run.status == "done"
    tool_messages = [m for m in run.messages if m["role"] == "tool"]
    assert tool_messages[-1]["content"] == "relay declined for refund: amount exceeds refund policy"
    assert "amount exceeds refund policy" in run.text
