"""The task worker: runs queued tasks, and every so often expires overdue requests and
recovers runs whose worker died. Used in-process by `serve` and as `db_worker` processes."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.utils import OperationalError
from django.dispatch import receiver
from django.utils import timezone
from django.utils.crypto import get_random_string
from django_tasks.signals import task_enqueued
from django_tasks_db.models import DBTaskResult
from django_tasks_db.utils import exclusive_transaction

from . import recovery, store
from .identity import set_current_worker_id

log = logging.getLogger(__name__)

# Set when a task is enqueued in this process (after commit), so an in-process worker starts
# it at once instead of at its next poll.
wake = threading.Event()


# On PostgreSQL an enqueue also wakes the workers of OTHER processes: NOTIFY on this channel
# inside the enqueueing transaction (delivered at commit, dropped on rollback), and a listener
# thread in each worker process. Polling stays as the fallback, so a lost notification only
# costs one poll interval.
WAKE_CHANNEL = "toolnexus_tasks"


@receiver(task_enqueued)
def _wake_on_enqueue(sender, **kwargs) -> None:
    transaction.on_commit(wake.set)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {WAKE_CHANNEL}")


def listen_for_tasks(stop: threading.Event) -> None:
    """Set `wake` whenever another process enqueues a task (PostgreSQL only); reconnects
    after errors until `stop` is set."""
    import psycopg

    while not stop.is_set():
        try:
            params = connection.get_connection_params()
            params.pop("cursor_factory", None)
            with psycopg.connect(**params, autocommit=True) as conn:
                conn.execute(f"LISTEN {WAKE_CHANNEL}")
                wake.set()  # anything enqueued while we were not listening
                while not stop.is_set():
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        wake.set()
        except Exception as exc:
            log.warning("task listener: %s; polling until it reconnects", exc)
            stop.wait(1.0)


class Worker:
    def __init__(
        self,
        *,
        interval: float | None = None,
        maintenance_every: float | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.interval = settings.TOOLNEXUS_WORKER_INTERVAL if interval is None else interval
        self.maintenance_every = (
            settings.TOOLNEXUS_MAINTENANCE_SECONDS
            if maintenance_every is None
            else maintenance_every
        )
        self.worker_id = worker_id or get_random_string(32)
        self.stop = threading.Event()
        self._next_maintenance = 0.0
        self.ran = 0

    def claim(self) -> DBTaskResult | None:
        try:
            with exclusive_transaction():
                row = DBTaskResult.objects.ready().get_locked()
                if row is not None:
                    row.claim(self.worker_id)
                return row
        except OperationalError as exc:
            if "locked" in str(exc).lower():
                return None  # SQLite busy: try again at the next poll
            raise

    def run_task(self, row: DBTaskResult) -> None:
        set_current_worker_id(self.worker_id)
        try:
            result = row.task_result
            value = row.task.call(*result.args, **result.kwargs)
            row.set_successful(value)
        except Exception as exc:  # recorded on the task row; runs record their own failures
            log.exception("task %s failed", row.id)
            row.set_failed(exc)
        self.ran += 1

    def run_once(self) -> bool:
        row = self.claim()
        if row is None:
            return False
        self.run_task(row)
        return True

    def drain(self, max_tasks: int = 1000) -> int:
        """Run ready tasks until none is left (tests and `--batch`)."""
        done = 0
        while done < max_tasks and self.run_once():
            done += 1
        return done

    def maintenance(self) -> None:
        expired = recovery.requests_expire_overdue()
        recovered = recovery.runs_recover_stale()
        day_ago = timezone.now() - timedelta(days=1)
        pruned, _ = DBTaskResult.objects.finished().filter(finished_at__lt=day_ago).delete()
        # A task whose worker was killed stays "running" forever; its run was taken over
        # long before (leases last seconds), so after a day the row is only clutter.
        DBTaskResult.objects.running().filter(started_at__lt=day_ago).delete()
        if expired or recovered:
            log.info(
                "maintenance: %s request(s) expired, %s run(s) recovered, %s task row(s) pruned",
                expired,
                recovered,
                pruned,
            )

    def _maybe_maintain(self) -> None:
        now = time.monotonic()
        if self.maintenance_every and now >= self._next_maintenance:
            self._next_maintenance = now + self.maintenance_every
            try:
                self.maintenance()
            except Exception:
                log.exception("worker maintenance failed")

    def heartbeat(self) -> None:
        """Keep the leases of the runs this worker holds fresh, however long a step takes;
        when the worker dies the leases lapse and another worker takes the runs over."""
        lease = settings.TOOLNEXUS_RUN_LEASE_SECONDS
        while not self.stop.wait(max(1.0, lease / 3)):
            try:
                store.runs_renew_leases(worker_prefix=f"{self.worker_id}:")
            except Exception:
                log.exception("worker %s could not renew its leases", self.worker_id)
            finally:
                close_old_connections()

    def run_forever(self) -> None:
        log.info("worker %s started", self.worker_id)
        threading.Thread(
            target=self.heartbeat, name=f"heartbeat-{self.worker_id[:8]}", daemon=True
        ).start()
        if connection.vendor == "postgresql":
            threading.Thread(
                target=listen_for_tasks,
                args=(self.stop,),
                name=f"task-listener-{self.worker_id[:8]}",
                daemon=True,
            ).start()
        while not self.stop.is_set():
            close_old_connections()
            self._maybe_maintain()
            wake.clear()  # before polling: a task enqueued after this point wakes the wait
            try:
                ran = self.run_once()
            except Exception:
                log.exception("worker %s could not claim a task", self.worker_id)
                ran = False
            if not ran:
                wake.wait(self.interval)
        close_old_connections()
        log.info("worker %s stopped", self.worker_id)


def start_in_process_worker() -> tuple[Worker, threading.Thread]:
    worker = Worker()
    thread = threading.Thread(target=worker.run_forever, name="toolnexus-worker", daemon=True)
    thread.start()
    return worker, thread
