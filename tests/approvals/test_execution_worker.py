"""approvals.execution.worker: the stock worker with the app's additions: maintenance (overdue
requests expire), drain, an enqueue waking an idle worker and a stop ending it at once, the
stock task signals, a long worker id, and run leases renewed during a long step."""

from __future__ import annotations

import time

import pytest
from django_tasks_db.compat import task_finished, task_started

from approvals import agents, services
from approvals.execution import store
from approvals.execution.worker import Worker
from approvals.models import Run
from toolnexus import create_in_process_client

from .factories import drain, fresh, make_user, serving, start_and_halt, tasks_for
from .factories import in_another_connection as _in_another_connection
from .factories import make_overdue as _overdue
from .factories import run_in_status as _status
from .factories import wait_until as _wait

pytestmark = pytest.mark.django_db(transaction=True)


def test_worker_maintenance_expires_overdue_requests():
    run = start_and_halt()
    request = _overdue(run)
    Worker(maintenance_every=0).maintenance()
    request.refresh_from_db()
    assert request.state == "expired"


def test_drain_runs_task_rows_and_leaves_no_finished_one(settings):
    settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 0  # the default (tests keep rows)
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    (task,) = tasks_for(run)
    assert task.status == "READY"
    assert drain() == 1
    assert tasks_for(run) == [] and fresh(run).status == "pending"
    assert drain() == 0


def test_an_enqueue_wakes_an_idle_worker_and_stop_ends_it_at_once():
    user = make_user()
    with serving(interval=60):
        time.sleep(0.2)  # idle: waiting out a 60 s poll
        started = time.monotonic()
        run = services.run_start(agent="demo", prompt="refund A-1 $1", started_by=user)
        _wait(lambda: _status(run, "pending"), "the run to halt", timeout=5)
        assert time.monotonic() - started < 5
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 3  # `serving` returned: the worker has stopped


def test_the_worker_sends_the_stock_task_signals():
    started, finished = [], []

    def on_started(sender, task_result, **kwargs):
        started.append(task_result.id)

    def on_finished(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
        (task,) = tasks_for(run)
        drain()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert started == [str(task.id)]
    assert [(str(i), str(s)) for i, s in finished] == [(str(task.id), "SUCCESSFUL")]


def test_a_long_worker_id_still_holds_its_runs():
    worker = Worker(maintenance_every=0, worker_id="w" * 64)
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    held: list[str] = []
    real = store.run_store_result

    def spy(**kwargs):
        held.append(kwargs["worker_id"])
        return real(**kwargs)

    store.run_store_result = spy
    try:
        assert worker.drain() == 1
    finally:
        store.run_store_result = real
    assert fresh(run).status == "pending"
    assert held and all(len(h) <= 64 and h.startswith("w" * 51 + ":") for h in held)


def test_a_batch_worker_renews_its_runs_leases_during_a_long_step(settings):
    settings.TOOLNEXUS_RUN_LEASE_SECONDS = 3  # the heartbeat renews every second
    leases: list[object] = []
    state: dict[str, int] = {}

    def lease_now() -> None:
        _in_another_connection(
            lambda: leases.append(Run.objects.get(pk=state["run"]).lease_expires_at)
        )

    def slow_model(request):
        lease_now()
        time.sleep(1.8)
        lease_now()
        return {"content": "done"}

    agents.register(
        "slow", model=lambda: create_in_process_client(generate=slow_model), replace=True
    )
    try:
        run = services.run_start(agent="slow", prompt="take your time", started_by=make_user())
        state["run"] = run.pk
        Worker(batch=True, maintenance_every=0).run()
    finally:
        agents.unregister("slow")
    assert fresh(run).status == "done"
    before, during = leases
    assert before is not None and during > before  # renewed while the model answered
