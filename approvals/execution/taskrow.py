"""The task row a worker is running, finished by the run's outcome in the outcome's own
transaction.

The stock django-tasks-db worker marks a task row successful in a transaction of its own
once the task returns. A step's outcome is stored in a transaction anyway, so that
transaction finishes the row too: one commit fewer per step, and the run and its task row
never disagree (a worker killed between the two commits used to leave the row "running").
The stock finish then finds the row already finished and writes nothing. Any other ending
(a failure, a requeue, a lost lease, a rolled-back outcome) keeps the stock finish.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.utils import timezone
from django_tasks_db.compat import TaskResultStatus
from django_tasks_db.models import DBTaskResult

_current = threading.local()
_UNSET = object()


@contextmanager
def running(row: DBTaskResult) -> Iterator[None]:
    """While the worker runs `row` in this thread: an outcome stored meanwhile may finish it."""
    stock_finish = row.set_successful
    finished: dict[str, Any] = {}

    def set_successful(return_value: Any) -> None:
        if finished.get("return_value", _UNSET) == return_value:
            # The outcome's transaction wrote exactly this: only the instance catches up.
            row.status = TaskResultStatus.SUCCESSFUL
            row.finished_at = finished["at"]
            row.return_value = return_value
            return
        stock_finish(return_value)

    # An instance attribute: the stock loop calls `row.set_successful(...)` on this object.
    row.set_successful = set_successful  # type: ignore[method-assign]
    _current.task = (row, finished)
    try:
        yield
    finally:
        _current.task = None
        del row.set_successful


def finish_with_outcome(*, run_id: int, return_value: Any) -> None:
    """Inside the outcome's transaction: mark the running task row of this run successful
    with the value the task will return (nothing when no worker task is driving the run, as
    in a direct call of the runner)."""
    current = getattr(_current, "task", None)
    if current is None:
        return
    row, finished = current
    if (row.args_kwargs or {}).get("args") != [run_id]:
        return
    at = timezone.now()
    DBTaskResult.objects.filter(pk=row.pk, status=TaskResultStatus.RUNNING).update(
        status=TaskResultStatus.SUCCESSFUL,
        finished_at=at,
        return_value=return_value,
        exception_class_path="",
        traceback="",
    )

    def committed() -> None:
        finished.update(return_value=return_value, at=at)

    transaction.on_commit(committed)
