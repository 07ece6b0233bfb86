"""approvals.execution.store: a run is held by one worker at a time (a lapsed lease is taken
over), and a worker that lost its lease writes nothing over the new holder's run."""

from __future__ import annotations

import pytest

from approvals import services
from approvals.domain.exceptions import LeaseLost
from approvals.execution import runner, store
from approvals.models import Event

from .factories import fresh, lapse_lease, make_user

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
