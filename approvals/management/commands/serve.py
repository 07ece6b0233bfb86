"""`python manage.py serve`: the whole app in one process on the embedded defaults.

Applies migrations, makes sure the demo accounts exist (printing their passwords), starts a
worker thread, and serves HTTP and websockets with Daphne.
"""

import os
import secrets

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve the app (ASGI) with an in-process worker; applies migrations and prints demo accounts."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("TOOLNEXUS_HOST", "127.0.0.1"))
        parser.add_argument(
            "--port", type=int, default=int(os.environ.get("TOOLNEXUS_PORT", "8000"))
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="serve only; run db_worker processes separately",
        )
        parser.add_argument(
            "--no-demo-accounts",
            action="store_true",
            help="do not create or print the demo accounts",
        )

    def handle(self, *, host, port, no_worker, no_demo_accounts, **options):
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from approvals.execution.worker import start_in_process_worker
        from approvals.permissions import ensure_demo_accounts
        from toolnexus_web.asgi import application

        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(
            f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]} ({settings.DATABASES['default']['NAME']})"
        )
        self.stdout.write(
            f"live push: {settings.CHANNEL_LAYERS['default']['BACKEND'].rsplit('.', 1)[-1]}"
        )
        if not no_demo_accounts:
            password = os.environ.get("TOOLNEXUS_DEMO_PASSWORD") or secrets.token_urlsafe(9)
            for username, role in ensure_demo_accounts(password):
                self.stdout.write(f"demo account: {username} / {password}  ({role})")
        worker = thread = None
        if not no_worker:
            worker, thread = start_in_process_worker()
            self.stdout.write("worker: in-process thread")
        self.stdout.write(self.style.SUCCESS(f"serving on http://{host}:{port}/  (Ctrl+C to stop)"))
        try:
            Server(
                application=application,
                endpoints=build_endpoint_description_strings(host=host, port=port),
                verbosity=0,
            ).run()
        finally:
            if worker is not None:
                # Let the current step finish: its checkpoint is where the next start resumes.
                worker.stop.set()
                thread.join(timeout=30)
