"""The task row a worker is running, finished by the run's outcome in the outcome's own
transaction.

The stock django-tasks-db worker marks a task row successful in a transaction of its own
once the task returns. A step's outcome is stored in a transaction anyway, so that
transaction finishes the row too: one commit fewer per step, and the run and its task row
never disagree (a worker killed between the two commits used to leave the row "running").
The stock finish then finds the row already finished and writes nothing.

By default the outcome's transaction removes the row rather than marking it: the run's own
record (its status, its events) says how the step ended, and finished rows left in the table
are what django-tasks-db's claim query walks to find a ready one, more with every resume
until a vacuum (bench/queue_aging.py). TOOLNEXUS_KEEP_FINISHED_TASKS_SECONDS keeps them,
marked, for that long instead. Any other ending (a failure, a skip, a requeue, a lost lease,
a rolled-back outcome) keeps the stock finish: the worker's maintenance prunes those rows.

The other end works the same way: a task may start its work in the transaction that claims
its row (`claim_with_task`): the runner claims the run there, so a step starts with one
commit, not two, and a task row is never "running" for a run nobody holds.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models.signals import post_save
from django.utils import timezone
from django_tasks_db.compat import TaskResultStatus

from ..conf import app_settings
from ..domain import statements

if TYPE_CHECKING:
    from django_tasks_db.models import DBTaskResult

log = logging.getLogger(__name__)

_current = threading.local()
_UNSET = object()


# -- the claim ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Claimer:
    claim: Callable[..., Any]  # (*task args) -> what the task starts from, in the claim's tx
    release: Callable[[Any], None]  # what a claim left unused is handed back with


# A registry (task path -> its claimer), filled at import by the modules defining the tasks.
_claimers: dict[str, _Claimer] = {}


def claim_with_task(
    task: Any, *, claim: Callable[..., Any], release: Callable[[Any], None]
) -> None:
    """Let `claim(*args)` start `task`'s work inside the transaction in which a worker claims
    one of its rows; the task takes the value with `claimed_with_task`. `release(value)`
    hands back a value the task never took (it failed before it started)."""
    _claimers[task.module_path] = _Claimer(claim, release)


@contextmanager
def claiming() -> Iterator[None]:
    """Around the stock loop of a worker of ours: its claims in this thread may start work."""
    before = getattr(_current, "claiming", False)
    _current.claiming = True
    try:
        yield
    finally:
        _current.claiming = before


def connect() -> None:
    """Hear the stock worker's claims (called from the app's ready()). Not at import:
    django-tasks-db's models cannot be imported in a project that lacks the app, and that
    project must reach `manage.py check` (approvals.E003 says what is missing)."""
    post_save.connect(
        _on_claim, sender=_task_model(), dispatch_uid="approvals.execution.taskrow.claimed"
    )


def _task_model() -> type[DBTaskResult]:
    from django_tasks_db.models import DBTaskResult

    return DBTaskResult


def _on_claim(sender, instance: DBTaskResult, update_fields=None, **kwargs: Any) -> None:
    # The stock claim saves status, started_at and worker_ids inside its claiming transaction.
    if (
        not getattr(_current, "claiming", False)
        or instance.status != TaskResultStatus.RUNNING
        or not update_fields
        or "worker_ids" not in update_fields
    ):
        return
    claimer = _claimers.get(instance.task_path)
    if claimer is None:
        return
    stored = instance.args_kwargs or {}
    try:
        call = inspect.signature(claimer.claim).bind(
            *(stored.get("args") or []), **(stored.get("kwargs") or {})
        )
    except TypeError:
        return  # the task fails on these arguments itself, and the stock worker records it
    # A database error here rolls the row's claim back with it: the next pass tries again.
    _current.claimed = (instance.pk, claimer.claim(*call.args, **call.kwargs))


def claimed_with_task() -> Any:
    """What the claim of the task row running now started, taken once; None without one."""
    current = getattr(_current, "task", None)
    claimed = getattr(_current, "claimed", None)
    if current is None or claimed is None or claimed[0] != current[0].pk:
        return None
    _current.claimed = None
    return claimed[1]


def _release_unused(row: DBTaskResult) -> None:
    claimed = getattr(_current, "claimed", None)
    _current.claimed = None
    if claimed is None or claimed[0] != row.pk:
        return
    claimer = _claimers.get(row.task_path)
    if claimer is not None and claimed[1] is not None:
        log.warning("task %s ended before it took its claim: handing it back", row.pk)
        claimer.release(claimed[1])


# -- the finish -----------------------------------------------------------------------------


@contextmanager
def running(row: DBTaskResult) -> Iterator[None]:
    """While the worker runs `row` in this thread: an outcome stored meanwhile may finish it."""
    stock_finish = row.set_successful
    finished: dict[str, Any] = {}

    def caught_up(return_value: Any, at: Any) -> None:
        # Only the instance: the stock worker's task_finished signal reads it.
        row.status = TaskResultStatus.SUCCESSFUL
        row.finished_at = at
        row.return_value = return_value

    def set_successful(return_value: Any) -> None:
        if finished.get("removed") or finished.get("return_value", _UNSET) == return_value:
            # The outcome's commit removed the row, or wrote exactly this.
            caught_up(return_value, finished["at"])
            return
        if (
            not app_settings.KEEP_FINISHED_TASKS_SECONDS
            and not _task_model().objects.filter(pk=row.pk).exists()
        ):
            # Removed by an outcome whose commit hooks have not run (inside a test's atomic
            # block): nothing left to mark.
            caught_up(return_value, timezone.now())
            return
        stock_finish(return_value)

    # An instance attribute: the stock loop calls `row.set_successful(...)` on this object.
    row.set_successful = set_successful  # type: ignore[method-assign]
    outer = getattr(_current, "task", None)  # a drain() inside a task: restored after
    _current.task = (row, finished)
    try:
        yield
    finally:
        _current.task = outer
        del row.set_successful
        _release_unused(row)


def finish_with_outcome(*, run_id: int, return_value: Any) -> None:
    """Inside the outcome's transaction: remove (or, kept, mark successful) the running task
    row of this run, which ends with `return_value` (nothing when no worker task is driving
    the run, as in a direct call of the runner)."""
    current = getattr(_current, "task", None)
    if current is None:
        return
    row, finished = current
    stored = row.args_kwargs or {}
    kwargs = dict(stored.get("kwargs") or {})
    kwargs.pop("traceparent", None)  # the trace it continues (telemetry.tracing), not the run
    if (stored.get("args") or [], kwargs) not in (
        ([run_id], {}),
        ([], {"run_id": run_id}),
    ):
        return
    at = timezone.now()
    where = {"pk": row.pk, "status": TaskResultStatus.RUNNING}
    if app_settings.KEEP_FINISHED_TASKS_SECONDS:
        statements.update(
            _task_model(),
            where,
            {
                "status": TaskResultStatus.SUCCESSFUL,
                "finished_at": at,
                "return_value": return_value,
                "exception_class_path": "",
                "traceback": "",
            },
        )
    else:
        _task_model().objects.filter(**where).delete()
    removed = not app_settings.KEEP_FINISHED_TASKS_SECONDS

    def committed() -> None:
        finished.update(return_value=return_value, at=at, removed=removed)

    transaction.on_commit(committed)
