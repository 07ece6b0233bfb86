"""`manage.py db_worker`: django-tasks-db's command, running the app's `Worker`.

Same options as the stock command (`--queue-name`, `--exclude-queues`, `--interval`,
`--batch`, `--max-tasks`, `--backend`, `--worker-id`, `--reload`, `--no-startup-delay`);
`--interval` defaults to TOOLNEXUS_WORKER_INTERVAL. The worker (approvals.execution.worker)
adds wake-ups, run leases and maintenance, and runs its whole life on one event loop.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management.base import CommandError
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV, run_with_reloader
from django_tasks_db.management.commands.db_worker import Command as StockCommand
from django_tasks_db.management.commands.db_worker import logger as stock_log

from approvals.execution.worker import DeliveryWorker, Worker, delivery_workers

from ...conf import app_settings
from ...execution.webhooks import WEBHOOK_QUEUE

_SIGNALS = [
    signal.SIGINT,
    signal.SIGTERM,
    *([signal.SIGQUIT] if hasattr(signal, "SIGQUIT") else []),
]


class Command(StockCommand):
    help = (
        "Run a background worker: executes runs and resumes, expires overdue requests, "
        "recovers abandoned runs."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.set_defaults(interval=app_settings.WORKER_INTERVAL)
        parser.add_argument(
            "--no-webhooks",
            action="store_true",
            help="do not run the webhooks' delivery worker beside this one (run it elsewhere:"
            " `db_worker --queue-name webhooks`)",
        )

    def handle(
        self,
        *,
        verbosity: int,
        queue_name: str,
        interval: float,
        batch: bool,
        backend_name: str,
        startup_delay: bool,
        reload: bool,
        max_tasks: int | None,
        worker_id: str,
        exclude_queues: str,
        no_webhooks: bool = False,
        **options,
    ) -> None:
        # The stock command's handling of its options, with the app's Worker.
        self.configure_logging(verbosity)
        if reload and batch:
            stock_log.warning(
                "Warning: --reload and --batch cannot be specified together. Disabling autoreload."
            )
            reload = False
        queue_names = queue_name.split(",")
        excluded_queue_names = exclude_queues.split(",") if exclude_queues else []
        if excluded_queue_names and "*" not in queue_names:
            raise CommandError("--exclude-queues can only be used with --queue-name=*")
        worker_class = DeliveryWorker if queue_names == [WEBHOOK_QUEUE] else Worker
        worker = worker_class(
            queue_names=queue_names,
            excluded_queue_names=excluded_queue_names,
            interval=interval,
            batch=batch,
            backend_name=backend_name,
            startup_delay=startup_delay,
            max_tasks=max_tasks,
            worker_id=worker_id,
        )
        if batch:
            with _signals(worker):
                worker.run_forever()
            self.stdout.write(f"ran {worker.ran} task(s)")
            return
        reloader_child = os.environ.get(DJANGO_AUTORELOAD_ENV) == "true"
        if reloader_child or not reload:  # not the reloader's parent, which runs no worker
            self.stdout.write(f"worker {worker.worker_id} running (Ctrl+C to stop)")
            self.stdout.flush()
        if reload:
            if reloader_child:
                worker.configure_signals()

            def run() -> None:
                with _deliveries_beside(worker, enabled=not no_webhooks):
                    worker.run_forever()

            run_with_reloader(run)
        else:
            with _signals(worker), _deliveries_beside(worker, enabled=not no_webhooks):
                worker.run_forever()


@contextmanager
def _deliveries_beside(worker: Worker, *, enabled: bool) -> Iterator[None]:
    """Delivery workers (`delivery_workers`), each in a thread of its own beside a run
    worker, stopped with it."""
    if not enabled or isinstance(worker, DeliveryWorker):
        yield
        return
    started = []
    for n, deliveries in enumerate(delivery_workers(), start=1):
        thread = threading.Thread(target=deliveries.run_forever, name=f"webhooks-{n}", daemon=True)
        thread.start()
        started.append((deliveries, thread))
    try:
        yield
    finally:
        for deliveries, _ in started:
            deliveries.stop.set()
        for _, thread in started:
            thread.join(timeout=15)


@contextmanager
def _signals(worker: Worker) -> Iterator[None]:
    """The worker's SIGINT/SIGTERM handling while it runs; the previous handlers after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: its owner handles them
        return
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    worker.configure_signals()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
