import signal

from django.core.management.base import BaseCommand

from approvals.execution.worker import Worker


class Command(BaseCommand):
    help = "Run a background worker: executes runs and resumes, expires overdue requests, recovers abandoned runs."

    def add_arguments(self, parser):
        parser.add_argument(
            "--interval", type=float, default=None, help="seconds between polls when idle"
        )
        parser.add_argument("--batch", action="store_true", help="run what is ready, then exit")
        parser.add_argument("--worker-id", default=None)

    def handle(self, *, interval, batch, worker_id, **options):
        worker = Worker(interval=interval, worker_id=worker_id)
        if batch:
            worker.maintenance()
            self.stdout.write(f"ran {worker.drain()} task(s)")
            return

        def stop(signum, frame):
            worker.stop.set()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        self.stdout.write(f"worker {worker.worker_id} running (Ctrl+C to stop)")
        worker.run_forever()
