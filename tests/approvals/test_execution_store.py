"""approvals.execution.store: a run is held by one worker at a time (a lapsed lease is taken
over), and a worker that lost its lease writes nothing over the new holder's run."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals import services
from approvals.domain.exceptions import LeaseLost
from approvals.execution import journal, runner, store
from approvals.models import Event, Run, ToolExecution
from toolnexus import Request, RunResult

from .factories import fresh, lapse_lease, make_user, run_actions, start_and_halt

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_is_executed_by_one_worker_at_a_time():
    user = make_user()
    run = services.run_start(agent="demo", prompt="refund", started_by=user)
    claimed = store.run_claim(run_id=run.pk, worker_id="w1")
    assert claimed is not None and claimed.status == "running"
    assert store.run_claim(run_id=run.pk, worker_id="w2") is None
    assert runner.drive(run.pk) == "skipped"
    lapse_lease(run)
    taken = store.run_claim(run_id=run.pk, worker_id="w2")
    assert taken is not None and taken.worker_id == "w2"
    assert Event.objects.filter(run=run, action="run_taken_over").count() == 1


def test_a_queued_run_is_claimed_in_one_update_that_reads_it_back():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    before = fresh(run).version
    with CaptureQueriesContext(connection) as ctx:
        claimed = store.run_claim(run_id=run.pk, worker_id="w1")
    writes = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith(("UPDATE", "SELECT"))]
    assert len(writes) == 1 and "RETURNING" in writes[0]  # no locking read first
    stored = fresh(run)
    assert (claimed.status, claimed.worker_id, claimed.attempts) == ("running", "w1", 1)
    assert (stored.status, stored.worker_id, stored.attempts) == ("running", "w1", 1)
    assert claimed.version == stored.version == before + 1
    assert claimed.prompt == "refund" and claimed.lease_expires_at == stored.lease_expires_at
    assert run_actions(run)[-1] == "run_claimed"


def test_a_run_queued_again_after_the_claims_update_looked_is_still_claimed(monkeypatch):
    """The conditional UPDATE saw the run before a requeue committed (it matched nothing):
    the locked read that follows finds it queued and claims it."""
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    real = store.statements.update
    seen = []

    def before_the_requeue(model, where, *args, **kwargs):
        if model is Run and kwargs.get("returning") and not seen:
            seen.append(where)
            return None  # what the UPDATE returns when the row was not queued yet
        return real(model, where, *args, **kwargs)

    monkeypatch.setattr(store.statements, "update", before_the_requeue)
    claimed = store.run_claim(run_id=run.pk, worker_id="w1")
    assert seen and claimed is not None
    stored = fresh(run)
    assert (stored.status, stored.worker_id, stored.attempts) == ("running", "w1", 1)
    assert run_actions(run)[-1] == "run_claimed"


def test_lost_lease_does_not_overwrite_the_new_workers_result():
    user = make_user()
    run = services.run_start(agent="demo", prompt="refund", started_by=user)
    store.run_claim(run_id=run.pk, worker_id="old")
    lapse_lease(run)
    store.run_claim(run_id=run.pk, worker_id="new")
    with pytest.raises(LeaseLost):
        store.run_checkpoint(run_id=run.pk, worker_id="old", messages=[])
    store.run_fail(run_id=run.pk, worker_id="old", error="late failure")
    run = fresh(run)
    assert run.status == "running" and run.worker_id == "new" and run.error == ""


def _halting_result(prompt: str) -> RunResult:
    messages = [{"role": "user", "content": prompt}]
    return RunResult(
        status="pending",
        text="",
        messages=messages,
        pending=Request(id="pnd-store-1", kind="input", prompt="Which order?"),
        turns=1,
        usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    )


def test_an_outcome_is_written_from_the_claims_copy_in_one_update_with_its_events():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    claimed = store.run_claim(run_id=run.pk, worker_id="w1")
    with CaptureQueriesContext(connection) as ctx:
        stored = store.run_store_result(
            run=claimed, worker_id="w1", result=_halting_result("refund")
        )
    writes = [q["sql"] for q in ctx.captured_queries]
    assert not [s for s in writes if s.startswith("SELECT") and '"approvals_run"' in s]
    assert sum(s.startswith('INSERT INTO "approvals_event"') for s in writes) == 1
    run = fresh(run)
    assert (run.status, run.worker_id, run.lease_expires_at) == ("pending", "", None)
    assert (run.turns, run.usage["total_tokens"], run.version) == (1, 7, stored.version)
    assert run.version == 2  # created 0, claimed 1, halted 2
    assert run.requests.get().prompt == "Which order?"
    assert run_actions(run)[-2:] == ["run_halted", "request_created"]


@pytest.mark.parametrize("taken", ["by another worker", "by a cancel"])
def test_a_worker_that_lost_its_run_stores_no_outcome(taken):
    user = make_user()
    run = services.run_start(agent="demo", prompt="refund", started_by=user)
    claimed = store.run_claim(run_id=run.pk, worker_id="old")
    if taken == "by a cancel":
        services.run_cancel(run_id=run.pk, user=user)
    else:
        lapse_lease(run)
        store.run_claim(run_id=run.pk, worker_id="new")
    before = run_actions(run)
    with pytest.raises(LeaseLost, match="no longer held by worker old"):
        store.run_store_result(run=claimed, worker_id="old", result=_halting_result("refund"))
    run = fresh(run)
    assert run.status == ("cancelled" if taken == "by a cancel" else "running")
    assert run_actions(run) == before and not run.requests.exists() and run.turns == 0


def test_a_tool_is_journaled_once_and_a_second_begin_gets_the_first_record():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    entry = {"run_id": run.pk, "message_index": 1, "call_id": "c1", "tool_name": "t", "input": {}}
    assert journal.execution_begin(**entry) is None
    with transaction.atomic():  # inside a transaction, the conflict leaves it usable
        earlier = journal.execution_begin(**entry)
        assert earlier is not None and earlier.finished_at is None
        assert Run.objects.filter(pk=run.pk).exists()
    assert ToolExecution.objects.filter(run=run).count() == 1
    journal.execution_finish(
        run_id=run.pk, message_index=1, call_id="c1", output="ok", is_error=False
    )
    assert journal.execution_begin(**entry).output == "ok"


def test_the_decided_request_is_read_with_its_calls_and_knows_its_run():
    user = make_user()
    run = start_and_halt(user=user)
    request = run.requests.get()
    services.request_decline(request_id=request.request_id, user=user, reason="no")
    run = fresh(run)
    with CaptureQueriesContext(connection) as ctx:
        found = store.request_to_apply(run)
        calls = found.call_list()
        assert calls and found.run is run and all(c.request is found for c in calls)
    assert len(ctx.captured_queries) == 2  # the request, then its calls
    assert found.pk == request.pk and found.state == "declined"
    assert [c.call_id for c in calls] == list(
        request.calls.order_by("position").values_list("call_id", flat=True)
    )
