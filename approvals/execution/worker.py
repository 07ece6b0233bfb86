"""The task worker: django-tasks-db's own `Worker`, plus what runs need around it.

The stock worker claims the ready task rows of its queues, runs them, records each outcome on
its row and sends the task signals (`task_started`, `task_finished`). `Worker` extends it
through its public methods only:

- wake-ups: the stock loop runs one pass at a time (batch mode: every ready task, then it
  returns), and between passes the worker waits on an event rather than sleeping. An enqueue
  in this process sets it after commit; on PostgreSQL the enqueueing transaction also NOTIFYs
  a listener thread in every worker process. Polling every `interval` stays as the fallback.
- run leases: a heartbeat thread renews the leases of the runs this worker holds;
- maintenance every TOOLNEXUS_MAINTENANCE_SECONDS, between tasks and between passes:
  overdue requests expire, runs of dead workers are queued again, old task rows are pruned.

One event loop for the worker's whole life: `serve()` runs the blocking loop (`run`) in a
thread of its own, started by asgiref's SyncToAsync on the running loop. Every `async_to_sync`
call made in that thread (the runner driving the engine, the live layer's pushes in on-commit
hooks) then runs on that one loop, whose connections (the model client's HTTP pool, which
`clients` keeps for the loop, and channels-redis) live as long as the worker. A `db_worker`
process runs `serve()` on a loop of its own (`run_forever`); `manage.py serve` runs it on
daphne's loop (`start_on_daphne`), the loop the in-memory channel layer's queues belong to.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection, connections, transaction
from django.dispatch import receiver
from django.utils import timezone
from django.utils.crypto import get_random_string
from django_tasks_db.compat import (
    DEFAULT_TASK_BACKEND_ALIAS,
    DEFAULT_TASK_QUEUE_NAME,
    TaskResultStatus,
    task_enqueued,
)
from django_tasks_db.management.commands.db_worker import Worker as StockWorker
from django_tasks_db.models import DBTaskResult

from .. import events
from ..conf import app_settings
from . import (
    clients,
    escalation,
    heartbeats,
    notifications,
    recovery,
    slack,
    store,
    taskrow,
    webhooks,
)
from .identity import lease_owner, set_current_worker_id

log = logging.getLogger(__name__)
stock_log = logging.getLogger("django_tasks_db")

# How long `serve`'s shutdown waits for the worker's current step before cancelling it (the
# run keeps its last checkpoint; its lease lapses and the next worker continues it).
SHUTDOWN_GRACE_SECONDS = 10.0


# -- wake-ups ----------------------------------------------------------------------------------

# On PostgreSQL an enqueue also wakes the workers of OTHER processes: NOTIFY on this channel
# inside the enqueueing transaction (delivered at commit, dropped on rollback), and a listener
# thread in each worker process. Polling stays as the fallback, so a lost notification only
# costs one poll interval.
WAKE_CHANNEL = "toolnexus_tasks"

_idle_waits: set[threading.Event] = set()  # the wait events of this process's running workers
_idle_waits_lock = threading.Lock()


def wake_workers() -> None:
    """End the idle wait of every worker running in this process."""
    with _idle_waits_lock:
        waits = list(_idle_waits)
    for event in waits:
        event.set()


@receiver(task_enqueued)
def _wake_on_enqueue(sender, **kwargs) -> None:
    transaction.on_commit(wake_workers)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {WAKE_CHANNEL}")


def listen_for_tasks(stop: threading.Event, wake: Callable[[], None] = wake_workers) -> None:
    """Call `wake` whenever another process enqueues a task (PostgreSQL only); reconnects
    after errors until `stop` is set."""
    import psycopg

    while not stop.is_set():
        try:
            params = connection.get_connection_params()
            params.pop("cursor_factory", None)
            with psycopg.connect(**params, autocommit=True) as conn:
                conn.execute(f"LISTEN {WAKE_CHANNEL}")
                wake()  # anything enqueued while we were not listening
                while not stop.is_set():
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        wake()
        except Exception as exc:
            log.warning("task listener: %s; polling until it reconnects", exc)
            stop.wait(1.0)


# -- the stock loop's per-pass log lines ---------------------------------------------------------

# The stock loop logs these when it starts and when a batch pass finds nothing left; run one
# pass at a time, it would log both at every poll. A worker's first pass says it started.
_STARTING = "Starting worker worker_id=%s queues=%s"
_NOTHING_LEFT = "No more tasks to run for worker_id=%s - exiting gracefully."
_pass = threading.local()


class _QuietPasses(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg not in getattr(_pass, "quiet", ())


stock_log.addFilter(_QuietPasses())


@contextmanager
def _quiet(*messages: str) -> Iterator[None]:
    before = getattr(_pass, "quiet", ())
    _pass.quiet = messages
    try:
        yield
    finally:
        _pass.quiet = before


# -- the worker --------------------------------------------------------------------------------


class _StopEvent(threading.Event):
    """Set to stop the worker: setting it also ends the worker's idle wait."""

    def __init__(self, idle_wait: threading.Event) -> None:
        super().__init__()
        self._idle_wait = idle_wait

    def set(self) -> None:
        super().set()
        self._idle_wait.set()


class _OwnThread(Executor):
    """Runs each submitted call in a new daemon thread: the worker's thread for SyncToAsync.

    Not the loop's default pool, whose threads the interpreter joins at exit: a worker whose
    step was abandoned at shutdown (it waits on a loop that stopped) must not hold the exit.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def target() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=target, name=self.name, daemon=True).start()
        return future


class Worker(StockWorker):
    """django-tasks-db's worker with wake-ups, run leases and maintenance (module docstring).

    `batch`: run maintenance and every ready task, then return (`db_worker --batch`).
    `maintenance_every`: seconds between maintenance passes (0: never; default
    TOOLNEXUS_MAINTENANCE_SECONDS). `stop` (an event) stops the worker; so does the stock
    `running = False`, which is the same thing.
    """

    def __init__(
        self,
        *,
        queue_names: list[str] | None = None,
        excluded_queue_names: list[str] | None = None,
        interval: float | None = None,
        batch: bool = False,
        backend_name: str = DEFAULT_TASK_BACKEND_ALIAS,
        startup_delay: bool = False,
        max_tasks: int | None = None,
        worker_id: str | None = None,
        maintenance_every: float | None = None,
    ) -> None:
        self._idle_wait = threading.Event()
        self.stop = _StopEvent(self._idle_wait)  # before the stock __init__ sets `running`
        super().__init__(
            queue_names=list(queue_names or [DEFAULT_TASK_QUEUE_NAME]),
            interval=app_settings.WORKER_INTERVAL if interval is None else interval,
            batch=True,  # the stock loop runs one pass at a time; `run` waits between passes
            backend_name=backend_name,
            startup_delay=False,  # `run` delays its first pass only, not every pass
            max_tasks=max_tasks,
            worker_id=worker_id or get_random_string(32),
            excluded_queue_names=list(excluded_queue_names or []),
        )
        self.exit_when_idle = batch
        self.delay_start = startup_delay
        self.maintenance_every = (
            app_settings.MAINTENANCE_SECONDS if maintenance_every is None else maintenance_every
        )
        self._next_maintenance = 0.0
        self._loop_thread: threading.Thread | None = None
        self.ran = 0  # tasks run (the stock loop counts the same ones for `max_tasks`)

    # The stock loop reads and clears `running`; here it is the other side of `stop`.
    @property
    def running(self) -> bool:
        return not self.stop.is_set()

    @running.setter
    def running(self, value: bool) -> None:
        if value:
            self.stop.clear()
        else:
            self.stop.set()

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Run tasks until stopped (blocking): passes of the stock loop, maintenance, and
        between passes an idle wait that an enqueue, a NOTIFY or `stop` ends early. With
        `batch`: maintenance, then one pass."""
        set_current_worker_id(lease_owner(self.worker_id))
        if self.exit_when_idle:
            # A batch also renews its runs' leases while a step runs (transcripts are not
            # stored after every model reply, so a long step would otherwise let them lapse).
            done = threading.Event()
            beat = threading.Thread(
                target=self.heartbeat, args=(done,), name=f"heartbeat-{self.worker_id[:8]}"
            )
            beat.daemon = True
            beat.start()
            try:
                self._maintain(time.monotonic())
                with taskrow.claiming():
                    super().run()
            finally:
                done.set()
                beat.join(timeout=2)
                connections.close_all()  # this thread's: it is done with the database
            return
        with _idle_waits_lock:
            _idle_waits.add(self._idle_wait)
        log.info("worker %s started", self.worker_id)
        helpers = self._start_helpers()
        try:
            if self.delay_start and self.interval:
                self.stop.wait(random.random())  # no thundering herd of workers
            first = True
            while self.running:
                self._maybe_maintain()
                self._idle_wait.clear()  # before polling: a later enqueue ends the wait
                try:
                    with (
                        _quiet(_NOTHING_LEFT) if first else _quiet(_STARTING, _NOTHING_LEFT),
                        taskrow.claiming(),
                    ):
                        super().run()
                except Exception:
                    log.exception("worker %s could not claim a task", self.worker_id)
                first = False
                if self.max_tasks is not None and self.ran >= self.max_tasks:
                    break
                if self.running:
                    self._idle_wait.wait(self.interval)
        finally:
            with _idle_waits_lock:
                _idle_waits.discard(self._idle_wait)
            self.stop.set()  # the heartbeat and the listener end with the loop
            for helper in helpers:
                helper.join(timeout=2)
            connections.close_all()  # this thread's: it is done with the database
            log.info("worker %s stopped", self.worker_id)

    def run_task(self, db_task_result: DBTaskResult) -> None:
        set_current_worker_id(lease_owner(self.worker_id))
        try:
            with taskrow.running(db_task_result):  # the run's outcome may finish the row
                super().run_task(db_task_result)
        finally:
            self.ran += 1
        if not self.exit_when_idle:
            self._maybe_maintain()  # a busy queue does not hold maintenance back

    def drain(self, max_tasks: int = 1000) -> int:
        """Run the ready tasks of this worker's queues in this thread until none is left (at
        most `max_tasks`): one pass of the stock loop, no maintenance, no waiting. Tests and
        inline use; how many ran."""
        before, limit = self.ran, self.max_tasks
        self.max_tasks = before + max_tasks
        set_current_worker_id(lease_owner(self.worker_id))
        try:
            with _quiet(_STARTING, _NOTHING_LEFT), taskrow.claiming():
                StockWorker.run(self)
        finally:
            self.max_tasks = limit
        return self.ran - before

    # -- one event loop for the worker's life ------------------------------------------------

    async def serve(self) -> None:
        """Run the worker on the running event loop until it stops: `run` in a thread of its
        own whose `async_to_sync` calls come back to this loop, with the agents' model clients
        kept for the loop and closed at the end."""
        self._loop_thread = threading.current_thread()
        run = sync_to_async(
            self.run,
            thread_sensitive=False,
            executor=_OwnThread(f"toolnexus-worker-{self.worker_id[:8]}"),
        )
        async with clients.keep_clients():
            try:
                await run()
            finally:
                await events.settle()  # its last pushes go out before the loop ends

    def run_forever(self) -> None:
        """A worker process's life: `serve` on a new event loop in this thread."""
        asyncio.run(self.serve())

    # -- signals (db_worker) -------------------------------------------------------------------

    def shutdown(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT/SIGTERM: stop after the current task (a second one: exit at once)."""
        if not self.running:
            super().shutdown(signum, frame)  # the stock worker's forced exit
            return
        stock_log.warning(
            "Received %s - shutting down gracefully... (press Ctrl+C again to force)",
            signal.strsignal(signum),
        )
        self.running = False
        if not self.running_task and self._loop_thread is not threading.current_thread():
            # The main thread is not running the worker's loop (the autoreloader's child
            # runs it in another thread): exit as the stock worker does.
            sys.exit(0)

    # -- heartbeat, listener, maintenance ------------------------------------------------------

    def _start_helpers(self) -> list[threading.Thread]:
        name = self.worker_id[:8]
        helpers = [threading.Thread(target=self.heartbeat, name=f"heartbeat-{name}", daemon=True)]
        if connection.vendor == "postgresql":
            helpers.append(
                threading.Thread(
                    target=listen_for_tasks,
                    args=(self.stop, self._idle_wait.set),
                    name=f"task-listener-{name}",
                    daemon=True,
                )
            )
        for helper in helpers:
            helper.start()
        return helpers

    def heartbeat(self, until: threading.Event | None = None) -> None:
        """Keep the leases of the runs this worker holds fresh, however long a step takes,
        until `until` (default: the worker's stop) is set; when the worker dies the leases
        lapse and another worker takes the runs over. Each beat also records that the worker
        is alive (`WorkerHeartbeat`: /readyz and the admin read it)."""
        lease = app_settings.RUN_LEASE_SECONDS
        prefix = f"{lease_owner(self.worker_id)}:"
        stop = until or self.stop
        started_at = timezone.now()
        self._beat(started_at)
        while not stop.wait(max(1.0, lease / 3)):
            try:
                store.runs_renew_leases(worker_prefix=prefix)
            except Exception:
                log.exception("worker %s could not renew its leases", self.worker_id)
            finally:
                close_old_connections()
            self._beat(started_at)
        try:
            heartbeats.worker_stopped(worker_id=self.worker_id[:64])
        except Exception:
            log.warning("worker %s could not record that it stopped", self.worker_id)
        connections.close_all()

    def _beat(self, started_at) -> None:
        try:
            heartbeats.worker_beat(worker_id=self.worker_id[:64], started_at=started_at)
        except Exception as exc:  # the database is down: the leases' own errors say so
            log.warning("worker %s could not record its heartbeat: %s", self.worker_id, exc)
        finally:
            close_old_connections()

    def maintenance(self) -> None:
        expired = recovery.requests_expire_overdue()
        escalated = escalation.requests_escalate_due()
        recovered = recovery.runs_recover_stale()
        now = timezone.now()
        day_ago = now - timedelta(days=1)
        # Rows that ended well and were kept (KEEP_FINISHED_TASKS_SECONDS, or a skip or a
        # requeue, which have no outcome to remove them with), and failures after a day.
        kept_until = now - timedelta(seconds=app_settings.KEEP_FINISHED_TASKS_SECONDS)
        pruned, _ = DBTaskResult.objects.filter(
            status=TaskResultStatus.SUCCESSFUL, finished_at__lt=kept_until
        ).delete()
        failed, _ = DBTaskResult.objects.finished().filter(finished_at__lt=day_ago).delete()
        pruned += failed
        # A task whose worker was killed stays "running" forever; its run was taken over
        # long before (leases last seconds), so after a day the row is only clutter.
        DBTaskResult.objects.running().filter(started_at__lt=day_ago).delete()
        heartbeats.heartbeats_prune()
        if expired or recovered or escalated:
            log.info(
                "maintenance: %s request(s) expired, %s escalated, %s run(s) recovered,"
                " %s task row(s) pruned",
                expired,
                escalated,
                recovered,
                pruned,
            )

    def _maintain(self, now: float) -> None:
        self._next_maintenance = now + (self.maintenance_every or 0)
        self.maintenance()

    def _maybe_maintain(self) -> None:
        now = time.monotonic()
        if self.maintenance_every and now >= self._next_maintenance:
            try:
                self._maintain(now)
            except Exception:
                log.exception("worker maintenance failed")


class DeliveryWorker(Worker):
    """The webhooks' worker: runs the "webhooks" queue only (a slow endpoint never holds a
    run's resume back) and, every TOOLNEXUS_WEBHOOK_DISPATCH_SECONDS, turns new host events
    into deliveries (`webhooks.dispatch`). `serve` and `db_worker` start one beside the run
    worker."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("maintenance_every", app_settings.WEBHOOK_DISPATCH_SECONDS)
        kwargs["queue_names"] = kwargs.get("queue_names") or [webhooks.WEBHOOK_QUEUE]
        super().__init__(**kwargs)

    def _start_helpers(self) -> list[threading.Thread]:
        return []  # it holds no run leases; polling its short interval is its wake-up

    def maintenance(self) -> None:
        made = webhooks.dispatch()
        stuck = webhooks.requeue_stuck()
        if made or stuck:
            log.debug("webhooks: %s delivery(ies) made, %s re-queued", made, stuck)
        # Reviewers' notifications share the worker (off unless TOOLNEXUS_NOTIFICATIONS).
        items, messages, requeued = notifications.maintain()
        if items or messages or requeued:
            log.debug(
                "notifications: %s item(s), %s message(s), %s re-queued", items, messages, requeued
            )
        # The team's Slack channel too (off unless TOOLNEXUS_SLACK_* are set).
        posts, reposted = slack.maintain()
        if posts or reposted:
            log.debug("slack: %s message(s), %s re-queued", posts, reposted)


def delivery_workers() -> list[DeliveryWorker]:
    """The delivery workers to start beside a run worker (TOOLNEXUS_WEBHOOK_WORKERS): the
    first also turns events into deliveries (its maintenance); the others only deliver, each
    taking the next queued delivery, so a slow receiver holds one of them at a time."""
    from django.db import connection

    count = app_settings.WEBHOOK_WORKERS
    if count is None:
        count = 4 if connection.vendor == "postgresql" else 1
    count = max(1, int(count))
    return [DeliveryWorker()] + [DeliveryWorker(maintenance_every=0) for _ in range(count - 1)]


# -- the worker inside `manage.py serve` ---------------------------------------------------------


def start_on_daphne(worker: Worker, *, grace: float = SHUTDOWN_GRACE_SECONDS) -> asyncio.Task:
    """Run `worker` on daphne's event loop; stop it when the reactor shuts down.

    Call from daphne's `Server(ready_callable=...)`, which runs in the reactor's thread, whose
    asyncio loop is the server's. The worker's thread is then a SyncToAsync thread of the
    server's loop: a push it sends with `async_to_sync` runs on that loop, the only one the
    in-memory channel layer's queues may be used from. At shutdown the worker finishes its
    current step within `grace` seconds, or the step is cancelled: the runner then queues
    the run again from its last checkpoint.
    """
    from twisted.internet import defer, reactor

    task = asyncio.get_event_loop().create_task(worker.serve())
    task.add_done_callback(_log_failure(worker))

    async def stopped() -> None:
        worker.stop.set()
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            log.warning(
                "worker %s: its step is still running %.0f s into the shutdown: cancelling it "
                "(its run continues from its last checkpoint)",
                worker.worker_id,
                grace,
            )
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:  # a synchronous tool that does not return: the process exits anyway
            log.warning("worker %s: left behind at exit", worker.worker_id)

    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: defer.Deferred.fromFuture(asyncio.ensure_future(stopped()))
    )
    return task


def _log_failure(worker: Worker) -> Callable[[asyncio.Task], None]:
    def done(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("worker %s failed", worker.worker_id, exc_info=task.exception())

    return done
