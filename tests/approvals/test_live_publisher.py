"""approvals.live.publisher: a committed change becomes one small message per page kind,
built from the row in memory for a decision, sent from the commit hook, never for a
rolled-back change, and carrying no HTML."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.live import publisher
from approvals.live.groups import INBOX_GROUP, run_group

from .factories import make_user, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)

TRANSACTION_CONTROL = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")


def _statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(TRANSACTION_CONTROL)]


def test_a_decisions_push_is_built_from_the_row_in_memory_and_carries_no_html():
    user = make_user()
    run = start_and_halt(user=user)
    request_id = run.requests.get().request_id
    row = services.request_decline(request_id=request_id, user=user, reason="over the limit")
    with CaptureQueriesContext(connection) as ctx:
        from_memory = publisher.messages_for(
            run_id=run.pk, request_pk=row.pk, created=False, row=row
        )
    assert _statements(ctx) == []
    from_database = publisher.messages_for(
        run_id=run.pk, request_pk=row.pk, created=False, row=None
    )

    def without_change(messages):
        return [(group, {**m, "change": None}) for group, m in messages]

    assert without_change(from_memory) == without_change(from_database)
    (inbox_group, event), (run_grp, run_event) = from_memory
    assert (inbox_group, run_grp) == (INBOX_GROUP, run_group(run.pk))
    assert event["change"] == run_event["change"]  # one change, one name for its renderings
    assert f"Already declined by {user.username}" in event["toast"]
    assert "The agent wants to run refund" in event["toast"]
    assert not any("<" in str(value) for value in [*event.values(), *run_event.values()])


def test_a_decision_is_pushed_when_it_commits_before_its_service_returns(monkeypatch):
    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    assert [[group for group, _ in batch] for batch in sent] == [[INBOX_GROUP, run_group(run.pk)]]
    assert sent[0][0][1]["state"] == "declined"


def test_a_rolled_back_change_is_never_pushed(monkeypatch):
    from django.db import transaction

    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.request_decline(request_id=run.requests.get().request_id, user=user)
        raise RuntimeError("the caller fails after the decision")
    assert sent == []
    assert run.requests.get().state == "pending"


def test_only_a_worker_taking_a_run_is_a_status_only_change(monkeypatch):
    """A claim changes the run's status line alone (its pages re-render only that); the
    decision before it and the step's result after it change the transcript too."""
    from .factories import drain

    user = make_user()
    run = start_and_halt(user=user)
    sent = []
    monkeypatch.setattr(publisher, "send", sent.append)
    services.request_decline(request_id=run.requests.get().request_id, user=user, reason="no")
    drain()
    run_messages = [m for batch in sent for group, m in batch if group == run_group(run.pk)]
    assert [m["status_only"] for m in run_messages] == [False, True, False]
