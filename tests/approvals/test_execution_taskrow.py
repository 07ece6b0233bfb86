"""approvals.execution.taskrow: a step's outcome removes its task row in the outcome's own
commit (or marks it successful there when finished rows are kept; any other ending keeps the
stock finish, and maintenance prunes it), so the table holds what is ready or running; and the run is claimed in the task row's
claim, positional or keyword arguments alike (a claim never taken is handed back)."""

from __future__ import annotations

import pytest
from django_tasks_db.compat import task_finished, task_started
from django_tasks_db.models import DBTaskResult

from approvals import services
from approvals.execution import runner, store
from approvals.execution.worker import Worker
from approvals.models import Event

from .factories import drain, fresh, make_user, tasks_for
from .factories import recover_stale_run as _recover

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_steps_outcome_removes_its_task_row_in_the_same_commit(settings, monkeypatch):
    """The worker's task row ends with the run's outcome: no commit of its own after it, so a
    worker killed after the outcome's commit cannot leave the row "running", and no finished
    row is left for the claim query to walk."""
    settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 0  # the default (tests keep rows)
    stock_finishes: list[object] = []
    monkeypatch.setattr(DBTaskResult, "set_successful", lambda row, rv: stock_finishes.append(rv))
    finished: list[tuple[str, object]] = []

    def on_finished(sender, task_result, **kwargs):
        finished.append((task_result.status, task_result.return_value))

    task_finished.connect(on_finished)
    try:
        run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
        assert drain() == 1
    finally:
        task_finished.disconnect(on_finished)
    assert tasks_for(run) == [] and fresh(run).status == "pending"
    assert stock_finishes == []  # the stock finish had nothing left to write
    assert finished == [("SUCCESSFUL", "pending")]  # its signal still says how it ended


def test_the_run_is_claimed_in_the_task_rows_claim_and_a_claim_never_taken_is_handed_back():
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())

    def receiver_fails(sender, task_result, **kwargs):
        raise RuntimeError("a task_started receiver failed")

    task_started.connect(receiver_fails)
    try:
        assert drain() == 1
    finally:
        task_started.disconnect(receiver_fails)
    (task,) = tasks_for(run)
    assert task.status == "FAILED"  # the task never started
    run = fresh(run)
    # Claimed with the task row, before the task failed to start: held, but no longer renewed.
    assert run.status == "running" and run.worker_id in store.FORGOTTEN.still_held()
    assert Event.objects.filter(run=run, action="run_claimed").count() == 1
    _recover(run)
    assert fresh(run).status == "pending"
    # Taken back: the forgotten execution holds nothing, and is no longer kept.
    assert run.worker_id not in store.FORGOTTEN.still_held()


def test_kept_finished_rows_are_marked_in_the_outcomes_commit(settings, monkeypatch):
    settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 3600
    stock_finishes: list[object] = []
    monkeypatch.setattr(DBTaskResult, "set_successful", lambda row, rv: stock_finishes.append(rv))
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    assert drain() == 1
    (task,) = tasks_for(run)
    assert (task.status, task.return_value) == ("SUCCESSFUL", "pending")
    assert task.finished_at is not None and fresh(run).status == "pending"
    assert stock_finishes == []  # the outcome's commit marked it: the stock finish wrote nothing


def test_a_step_that_ends_without_an_outcome_keeps_the_stock_finish_and_maintenance_prunes_it(
    settings,
):
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    store.run_claim(run_id=run.pk, worker_id="someone-else")  # held elsewhere: skipped
    assert drain() == 1
    (task,) = tasks_for(run)
    assert (task.status, task.return_value) == ("SUCCESSFUL", "skipped")
    settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 3600
    Worker(maintenance_every=0).maintenance()
    assert tasks_for(run) == [task]  # kept for an hour
    settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 0
    Worker(maintenance_every=0).maintenance()
    assert tasks_for(run) == []


def test_a_task_enqueued_with_keyword_arguments_is_claimed_and_finished_too(settings):
    settings.TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS = 0  # the default (tests keep rows)
    run = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    DBTaskResult.objects.all().delete()
    runner.execute_run.enqueue(run_id=run.pk)
    other = services.run_start(agent="demo", prompt="refund", started_by=make_user())
    assert drain() == 2
    assert fresh(run).status == "pending" and fresh(other).status == "pending"
    assert not DBTaskResult.objects.exists()
